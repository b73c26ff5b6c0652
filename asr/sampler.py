"""The length-bucketed batch sampler and the loader that resumes mid-epoch (used by asr.data).

Batches are filled with up to ``max_batch_seconds`` of padded audio, not a fixed count; every
epoch has the same number of batches, and every rank as many as the others.
"""

from __future__ import annotations

import math
import random
from functools import cached_property

from torch.utils.data import DataLoader, Sampler

from asr.datafaults import DataFaults


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length utterances, each up to ``max_batch_seconds`` of padded audio.

    Each epoch, utterances are sorted by duration times a random factor in
    [1 - jitter, 1 + jitter] from (seed, epoch), so neighbours and hence batches change
    between epochs while padding stays small, cut greedily into batches, and the batches
    shuffled. Every epoch has the same number of batches (``num_batches``): Lightning fixes
    its validation step (``val_check_batch``) from ``len`` when fitting starts, and an epoch one
    batch shorter would never reach it. Every rank computes the same list and takes every
    ``num_replicas``-th batch (see ``rank_batches``). ``shuffle=False`` keeps the sorted order
    (evaluation, or sorted training).
    """

    def __init__(self, durations: list[float], max_batch_seconds: float, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, jitter: float = 0.02):
        self.durations, self.max_batch_seconds = durations, max_batch_seconds
        self.shuffle, self.seed, self.jitter = shuffle, seed, jitter
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch, self.skip = 0, 0
        self._rank_batches: tuple[int, list[list[int]]] = (-1, [])  # (epoch, its rank_batches)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.skip = epoch, 0

    def resume(self, epoch: int, batches_done: int) -> None:
        """Start the next pass at batch ``batches_done`` of ``epoch`` (mid-epoch resume)."""
        self.epoch, self.skip = epoch, batches_done

    def cut(self, order: list[int]) -> list[list[int]]:
        """Greedy cut of ``order`` into runs of at most ``max_batch_seconds`` of padded audio (the fewest runs)."""
        batches, batch, longest = [], [], 0.0
        for i in order:
            longest_if_added = max(longest, self.durations[i])
            if batch and longest_if_added * (len(batch) + 1) > self.max_batch_seconds:
                batches.append(batch)
                batch, longest_if_added = [], self.durations[i]
            batch.append(i)
            longest = longest_if_added
        return batches + [batch] if batch else batches

    def sorted_cut(self) -> list[list[int]]:
        """``cut`` of the utterances sorted by duration: the fewest batches (no jitter)."""
        return self.cut(sorted(range(len(self.durations)), key=self.durations.__getitem__))

    def jittered_cut(self, rng: random.Random) -> list[list[int]]:
        """``cut`` of the utterances sorted by duration times a random factor in [1 - jitter, 1 + jitter]."""
        keys = [d * (1 + rng.uniform(-self.jitter, self.jitter)) for d in self.durations]
        return self.cut(sorted(range(len(keys)), key=keys.__getitem__))

    @cached_property
    def num_batches(self) -> int:
        """Batches per epoch (all ranks together): the most that the sorted cut and 8 jittered cuts drawn
        from the seed give (without shuffle: the sorted cut's count).

        Jittered cuts vary by a few batches (346-350 on 1,780 Czech clips at 20 s); an epoch's draw
        over this count is drawn again (then the sorted cut is used) and one under it splits its
        largest batches, so the count never varies.
        """
        draws = [random.Random(f"{self.seed}-count-{k}") for k in range(8 if self.shuffle else 0)]
        return max([len(self.sorted_cut())] + [len(self.jittered_cut(rng)) for rng in draws])

    def global_batches(self) -> list[list[int]]:
        """This epoch's ``num_batches`` batches for all ranks together, before the per-rank split."""
        rng = random.Random(self.seed * 100003 + self.epoch)
        draws = (self.jittered_cut(rng) for _ in range(4 if self.shuffle else 0))
        batches = next((cut for cut in draws if len(cut) <= self.num_batches), None)
        if batches is None:  # no shuffle, or four draws over the count (rare)
            batches = self.sorted_cut()
        batches = split_largest(batches, lambda count: count < self.num_batches)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self):
        mine = self.rank_batches()
        skip, self.skip = self.skip, 0
        yield from mine[skip:]

    def rank_batches(self) -> list[list[int]]:
        """This rank's share of the epoch; every rank gets the same number of batches.

        To reach a multiple of ``num_replicas`` the largest batches are split in two, so no
        utterance is seen twice; batches repeat only when there are fewer utterances than ranks.
        Computed once per epoch (Lightning asks ``len`` several times).
        """
        if self._rank_batches[0] != self.epoch:
            self._rank_batches = (self.epoch, self._split_for_ranks())
        return self._rank_batches[1]

    def _split_for_ranks(self) -> list[list[int]]:
        batches = split_largest(self.global_batches(), lambda count: count % self.num_replicas != 0)
        padded = math.ceil(len(batches) / self.num_replicas) * self.num_replicas
        batches = [batches[i % len(batches)] for i in range(padded)]
        return batches[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self.rank_batches())


def split_largest(batches: list[list[int]], more_needed) -> list[list[int]]:
    """Halve the batch with the most utterances while ``more_needed(len(batches))`` and one has two or more.

    Halves of a batch stay under its padded seconds, and no utterance is repeated.
    """
    batches = list(batches)
    while batches and more_needed(len(batches)) and max(map(len, batches)) > 1:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        batch = batches.pop(largest)
        batches[largest:largest] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    return batches


class ResumableLoader(DataLoader):
    """A DataLoader that Lightning can checkpoint mid-epoch: it remembers how many batches were consumed.

    With ``faults`` set, each batch's ``dropped`` utterances are counted there (main process).
    """

    faults: DataFaults | None = None

    def __iter__(self):
        sampler: BucketBatchSampler = self.sampler
        self.epoch, self.consumed = sampler.epoch, sampler.skip
        if self.faults:
            self.faults.start_pass()
        for batch in super().__iter__():
            self.consumed += 1
            if self.faults:
                self.faults.record(batch.dropped)
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": getattr(self, "epoch", 0), "consumed": getattr(self, "consumed", 0)}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.resume(state["epoch"], state["consumed"])
