"""The length-bucketed batch sampler and the resumable loader (asr/data/sampler.py): every utterance once
per epoch, batches within max_batch_seconds, the same batch count every epoch and on every rank,
little padding, and a mid-epoch resume that continues where the run stopped.
"""

from __future__ import annotations

import random

import pytest
import torch

from asr.data.sampler import BucketBatchSampler, ResumableLoader, split_item


def random_durations(n: int = 2000, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(1.0, 10.0) for _ in range(n)]


def epoch(sampler: BucketBatchSampler, number: int) -> list[list[int]]:
    sampler.set_epoch(number)
    return list(sampler)


def padded_seconds(batch: list[int], durations: list[float]) -> float:
    return max(durations[i] for i in batch) * len(batch)


def test_every_index_appears_exactly_once_per_epoch():
    durations = random_durations(500)
    sampler = BucketBatchSampler(durations, 60.0, seed=1)
    for number in range(3):
        assert sorted(i for batch in epoch(sampler, number) for i in batch) == list(range(500))


def test_no_batch_exceeds_max_batch_seconds_unless_it_holds_one_utterance():
    durations = random_durations(500) + [75.0, 61.0]  # two longer than a whole batch
    batches = list(BucketBatchSampler(durations, 60.0))
    assert all(padded_seconds(b, durations) <= 60.0 for b in batches if len(b) > 1)
    assert [500] in batches and [501] in batches


def test_order_changes_with_the_epoch_and_is_deterministic_for_seed_and_epoch():
    durations = random_durations(500)
    first, second = BucketBatchSampler(durations, 60.0, seed=3), BucketBatchSampler(durations, 60.0, seed=3)
    assert epoch(first, 1) != epoch(first, 2)
    assert epoch(second, 2) == epoch(first, 2)
    assert epoch(second, 1) == epoch(first, 1)
    assert epoch(BucketBatchSampler(durations, 60.0, seed=4), 1) != epoch(first, 1)


def test_without_shuffle_batches_come_shortest_first_every_epoch():
    durations = random_durations(300)
    sampler = BucketBatchSampler(durations, 60.0, shuffle=False)
    batches = epoch(sampler, 0)
    assert [i for b in batches for i in b] == sorted(range(300), key=durations.__getitem__)
    assert epoch(sampler, 5) == batches


def test_two_replicas_get_equally_many_batches_and_together_cover_every_index():
    durations = random_durations(501)
    ranks = [BucketBatchSampler(durations, 60.0, seed=2, num_replicas=2, rank=r) for r in (0, 1)]
    for number in range(3):
        batches = [epoch(sampler, number) for sampler in ranks]
        assert len(batches[0]) == len(batches[1]) == len(ranks[0]) == len(ranks[1])
        assert {i for b in batches[0] + batches[1] for i in b} == set(range(501))


@pytest.mark.parametrize("n", [501, 37, 3])
def test_evaluation_replicas_get_equally_many_batches_and_see_each_index_once(n):
    durations = random_durations(n)
    ranks = [BucketBatchSampler(durations, 60.0, shuffle=False, num_replicas=2, rank=r) for r in (0, 1)]
    batches = [list(sampler) for sampler in ranks]
    assert len(batches[0]) == len(batches[1]) == len(ranks[0])
    assert sorted(i for b in batches[0] + batches[1] for i in b) == list(range(n))


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_every_epoch_has_as_many_batches_as_len_said_at_the_start(replicas):
    # Lightning fixes val_check_batch from len() when fitting starts; a shorter epoch never validates.
    durations = random_durations(2000)  # jittered greedy cuts of these vary from 196 to 199 batches
    sampler = BucketBatchSampler(durations, 60.0, seed=0, num_replicas=replicas)
    announced = len(sampler)
    for number in range(30):
        batches = epoch(sampler, number)
        assert len(batches) == announced
        assert all(padded_seconds(b, durations) <= 60.0 for b in batches)
    sorted_sampler = BucketBatchSampler(durations, 60.0, shuffle=False, num_replicas=replicas)
    assert len(sorted_sampler) <= announced


def test_padding_is_under_3_percent_on_a_realistic_length_distribution():
    durations = random_durations(2000)
    sampler = BucketBatchSampler(durations, 60.0, seed=0)
    for number in range(3):
        padded = sum(padded_seconds(b, durations) for b in epoch(sampler, number))
        assert 1 - sum(durations) / padded < 0.03


SPEEDS = (0.9, 1.0, 1.1)


def test_with_speeds_each_utterance_comes_once_an_epoch_at_a_drawn_speed_within_the_limit():
    durations = random_durations(500)
    sampler = BucketBatchSampler(durations, 60.0, seed=7, speeds=SPEEDS)
    seen = []
    for number in range(3):
        items = [i for batch in epoch(sampler, number) for i in batch]
        pairs = [split_item(i, 500) for i in items]
        assert sorted(i for _, i in pairs) == list(range(500))
        assert {s for s, _ in pairs} == {0, 1, 2}
        assert all(padded_seconds(b, sampler.item_seconds) <= 60.0 for b in epoch(sampler, number))
        seen.append(dict((i, s) for s, i in pairs))
    assert seen[0] != seen[1]  # speeds are drawn again each epoch
    assert sampler.item_seconds[2 * 500 + 3] == pytest.approx(durations[3] / 1.1)


def test_batches_sorted_by_duration_at_the_drawn_speed_pad_as_little_as_one_speed():
    # Drawing the speed when loading mixed 0.9 and 1.1 in a batch sorted at speed 1: 10% padding.
    durations = random_durations(2000)
    sampler = BucketBatchSampler(durations, 60.0, seed=0, speeds=SPEEDS)
    for number in range(3):
        batches = epoch(sampler, number)
        padded = sum(padded_seconds(b, sampler.item_seconds) for b in batches)
        assert 1 - sum(sampler.item_seconds[i] for b in batches for i in b) / padded < 0.03
        assert len(batches) == len(sampler)


def test_with_speeds_the_epoch_is_the_same_after_a_resume():
    first, again = (BucketBatchSampler(random_durations(300), 60.0, seed=8, speeds=SPEEDS) for _ in range(2))
    full = epoch(first, 3)
    again.resume(3, 4)
    assert list(again) == full[4:]  # the same utterances at the same speeds


def test_resume_skips_exactly_the_first_batches_once():
    sampler = BucketBatchSampler(random_durations(500), 60.0, seed=5)
    full = epoch(sampler, 4)
    sampler.resume(4, 7)
    sampler.set_epoch(4)  # Lightning sets the epoch again after restoring the loader's state
    assert list(sampler) == full[7:]
    assert list(sampler) == full  # the next pass is a whole epoch again


class Indices(torch.utils.data.Dataset):
    """dataset[[i, j]] -> [i, j], so a loader yields the sampler's batches."""

    def __getitem__(self, indices: list[int]) -> list[int]:
        return indices


def resumable_loader(durations: list[float]) -> ResumableLoader:
    sampler = BucketBatchSampler(durations, 60.0, seed=6)
    return ResumableLoader(Indices(), sampler=sampler, batch_size=None, collate_fn=lambda batch: batch)


def test_resumable_loader_state_restores_the_rest_of_the_epoch():
    durations = random_durations(400)
    loader = resumable_loader(durations)
    loader.sampler.set_epoch(2)
    full = list(loader)
    iterator = iter(loader)
    consumed = [next(iterator) for _ in range(5)]
    fresh = resumable_loader(durations)
    fresh.load_state_dict(loader.state_dict())  # carries the epoch too
    assert consumed == full[:5]
    assert list(fresh) == full[5:]
