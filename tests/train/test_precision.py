"""asr.train.precision: the run's own model timed in each precision, its probe batch, the cache and the ranks.

Steps are timed for real on a tiny model (the decision rule itself is tests/test_hardware.py's, with injected
times); the cache lives in tmp_path.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from asr.data.manifest import FilterConfig
from asr.train import cost, precision
from asr.train.module import ASRModule
from tests.conftest import encoder, row


class Data:
    """What probe_batch asks of a DataModule: its hparams and filter (and its shards' indexes, ``corpora``)."""

    corpora = ()

    def __init__(self, manifest, max_duration: float = 20.0, **settings):
        self.hparams = {"train_shards": None, "train_manifest": str(manifest), "max_batch_seconds": 6.0,
                        "sample_rate": 16000, "subsampling": 4, **settings}
        self.hparams = type("HP", (), self.hparams)()
        self.filter = FilterConfig(max_duration=max_duration)


@pytest.fixture
def module(char_tokenizer):
    torch.manual_seed(0)
    return ASRModule(tokenizer=char_tokenizer, encoder=encoder(n_heads=2, n_layers=1, ff_mult=2), inter_ctc=0.0)


@pytest.fixture
def manifest(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row(f"a{i}.flac", "two five", d)) + "\n" for i, d in enumerate([1.0, 2.0, 1.5])))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "STEP_CACHE", tmp_path / "cache" / "steps.json")
    return tmp_path / "cache" / "steps.json"


def test_the_probe_batch_fills_the_runs_batch_seconds_with_utterances_of_the_median_length(module, manifest):
    batch = precision.probe_batch(module, Data(manifest))
    assert batch.audio.shape == (4, 24000)  # 6 s of 1.5 s utterances (the median of 1, 2 and 1.5 s) at 16 kHz
    assert batch.audio_lengths.tolist() == [24000] * 4
    frames = 1.5 / 0.01 // 4  # encoder frames at 4x subsampling, about
    assert 0 < batch.tokens.shape[1] <= frames and int(batch.tokens.min()) >= 1  # feasible for CTC, no blank


def test_a_probe_batch_of_a_manifest_without_durations_uses_the_longest_allowed(module, tmp_path):
    (tmp_path / "bad.jsonl").write_text("not json\n")
    batch = precision.probe_batch(module, Data(tmp_path / "bad.jsonl", max_duration=3.0))
    assert batch.audio.shape == (2, 48000)


def test_timing_a_step_leaves_the_weights_and_the_random_state_as_they_were(module, manifest):
    batch = precision.probe_batch(module, Data(manifest))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = torch.rand(1), random.random(), np.random.rand()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    seconds = precision.step_seconds(module, batch, "32-true", steps=2)
    assert 0 < seconds < 30
    assert (torch.rand(1), random.random(), np.random.rand()) == expected
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters())


def test_a_step_is_timed_in_bf16_mixed_under_autocast(module, manifest, monkeypatch):
    seen = []
    forward = module.model.forward
    monkeypatch.setattr(module.model, "forward", lambda *a, **k: seen.append(torch.is_autocast_cpu_enabled()) or forward(*a, **k))
    batch = precision.probe_batch(module, Data(manifest, max_batch_seconds=1.5))
    precision.step_seconds(module, batch, "bf16-mixed", steps=1)
    precision.step_seconds(module, batch, "32-true", steps=1)
    assert seen == [True, True, False, False]  # warm-up and one timed step each


def test_step_times_are_cached_per_model_and_threads(module, manifest, cache, monkeypatch, keep_threads):
    timed = []
    monkeypatch.setattr(precision, "step_seconds", lambda m, b, p: timed.append(p) or {"32-true": 0.2, "bf16-mixed": 0.1}[p])
    monkeypatch.setattr(cost, "cpu_peak_flops", {"fp32": 200e9, "bf16": 900e9}.get)
    batch = precision.probe_batch(module, Data(manifest))
    first = precision.measured_steps(module, batch)
    assert first == {"32-true": 0.2, "bf16-mixed": 0.1, "cached": False} and timed == ["32-true", "bf16-mixed"]
    assert precision.measured_steps(module, batch) == {**first, "cached": True} and len(timed) == 2  # paid once
    bigger = precision.probe_batch(module, Data(manifest, max_batch_seconds=12.0))
    precision.measured_steps(module, bigger)  # another batch shape: timed anew
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    precision.measured_steps(module, batch)  # other threads: timed anew
    assert len(timed) == 6 and len(json.loads(cache.read_text())) == 3


def test_a_cpu_that_emulates_bf16_times_fp32_alone(module, manifest, cache, monkeypatch):
    timed = []
    monkeypatch.setattr(precision, "step_seconds", lambda m, b, p: timed.append(p) or 0.2)
    monkeypatch.setattr(cost, "cpu_peak_flops", {"fp32": 86e9, "bf16": 0.9e9}.get)  # an AVX2 CPU
    times = precision.measured_steps(module, precision.probe_batch(module, Data(manifest)))
    assert timed == ["32-true"] and math.isinf(times["bf16-mixed"])


def test_an_unwritable_cache_is_said_and_the_times_still_given(module, manifest, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(precision, "STEP_CACHE", tmp_path / "file" / "steps.json")  # a folder that is a file
    monkeypatch.setattr(precision, "step_seconds", lambda m, b, p: 0.2)
    monkeypatch.setattr(cost, "cpu_peak_flops", {"fp32": 86e9, "bf16": 0.9e9}.get)
    said = []
    assert precision.measured_steps(module, precision.probe_batch(module, Data(manifest)), said.append)["32-true"] == 0.2
    assert len(said) == 1 and "cannot cache" in said[0]


def test_ranks_inherit_the_choice_for_the_same_model_only(module, manifest, monkeypatch, char_tokenizer):
    monkeypatch.delenv(precision.INHERITED, raising=False)
    batch = precision.probe_batch(module, Data(manifest))
    assert precision.inherited(module, batch) is None
    precision.hand_down(module, batch, "bf16-mixed")
    assert precision.inherited(module, batch) == "bf16-mixed"
    other = ASRModule(tokenizer=char_tokenizer, encoder=encoder(d_model=64, n_heads=2, n_layers=1, ff_mult=2),
                      inter_ctc=0.0)
    assert precision.inherited(other, batch) is None  # a later run of another model in this process decides anew


def test_the_probe_batch_of_shards_takes_the_median_of_their_index(module, tmp_path):
    from asr.data.datamodule import ASRDataModule
    from tests.study.test_plan import index

    data = ASRDataModule(train_shards=str(index(tmp_path / "shards", 100, 2.5)), max_batch_seconds=10.0)
    batch = precision.probe_batch(module, data)
    assert batch.audio.shape == (4, 40000)  # 10 s of 2.5 s utterances, the index' durations
