"""asr.bench: the quick benchmark runs end to end and writes every section; it measures what asr.fit builds
and trains (asr.bench_steps); its arithmetic by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import soundfile
import torch

from asr import bench, bench_corpus, bench_sections, bench_steps, fit
from asr.data import Batch
from asr.sampler import BucketBatchSampler
from asr.tokenizer import Tokenizer

SECTIONS = ("peak", "train", "batching", "loop", "features", "data", "inference", "corpus", "machine", "targets")


def test_quick_mode_writes_every_section_with_sane_values(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--quick", "--out", str(out)])
    results = json.loads(out.read_text())
    assert set(SECTIONS) <= set(results)
    assert results["peak"]["fp32"] > 0 and results["peak"]["bf16"] > 0
    assert set(results["train"]) == {"tiny/32-true", "tiny/bf16-mixed"}
    for figures in results["train"].values():
        assert figures["x_real_time"] > 0 and figures["mfu"] > 0 and 0 <= figures["padding"] < 1
    bucketed, shuffled = results["batching"]["bucketed"], results["batching"]["random"]
    assert 0 <= bucketed["padding"] < shuffled["padding"] <= 1
    assert bucketed["x_real_time"] > 0 and shuffled["x_real_time"] > 0
    assert results["loop"]["plain_s"] > 0 and results["loop"]["lightning_s"] > 0
    assert results["features"]["features_x_real_time"] > 0 and results["features"]["decode_features_x_real_time"] > 0
    hp = results["data"]
    assert 0 <= hp["wait_share"] < 1 and hp["num_workers"] == bench_steps.build("tiny").datamodule.hparams.num_workers
    assert results["inference"]["rtf"] > 0
    assert results["corpus"]["sample_rate"] == bench_steps.build("tiny").datamodule.hparams.sample_rate
    # The quick run has no base preset: every other target is judged, each with a yes/no in the table.
    assert set(results["targets"]) == set(bench.TARGETS) - {"train/base/32-true/mfu", "train/base/bf16-mixed/mfu"}
    table = capsys.readouterr().out
    for name, target in results["targets"].items():
        assert f"| {name} |" in table and f"| {target['target']} | {'yes' if target['met'] else 'NO'} |" in table


def test_padding_fraction_by_hand():
    # batches [1 s, 2 s] and [3 s, 4 s] hold 2*2 + 2*4 = 12 s of padded audio, 10 s of it speech
    assert bench_corpus.padding_fraction([1.0, 2.0, 3.0, 4.0], [[0, 1], [2, 3]]) == pytest.approx(2 / 12)
    assert bench_corpus.padding_fraction([1.0, 2.0, 3.0, 4.0], [[0], [1], [2], [3]]) == 0.0


def test_random_batches_hold_every_utterance_once_within_the_limit():
    durations = bench_corpus.corpus_durations(200, seed=1)
    sampler = BucketBatchSampler(durations, 60.0)
    batches = bench_corpus.random_batches(sampler, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(durations[i] for i in b) <= 60.0 for b in batches)
    assert batches != bench_corpus.random_batches(sampler, seed=2)


def test_corpus_durations_look_like_librispeech():
    durations = bench_corpus.corpus_durations(4000, seed=0)
    assert 1.0 <= min(durations) and max(durations) <= 20.0
    assert 11.0 < sum(durations) / len(durations) < 13.0
    assert durations == bench_corpus.corpus_durations(4000, seed=0)


def test_synthetic_corpus_files_rate_and_token_rates(tmp_path):
    tokenizer = Tokenizer.load(bench_corpus.write_tokenizer(tmp_path, seed=3))
    manifest = bench_corpus.write_corpus(tmp_path, 5, seed=3, scale=1.0, sample_rate=8000, tokenizer=tokenizer)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        info = soundfile.info(tmp_path / row["audio_filepath"])
        assert info.samplerate == 8000  # the rate it is asked for (asr.bench: the configured data.sample_rate)
        assert info.frames / info.samplerate == pytest.approx(row["duration"], abs=1e-3)
        wanted = round(bench_corpus.TOKENS_PER_SECOND * row["duration"])
        assert wanted <= len(tokenizer.encode(row["text"])) <= wanted + 8  # words are added until the count is reached


@pytest.fixture
def tokenizer_arg(tmp_path) -> str:
    Tokenizer.train(["a b c"]).save(tmp_path / "tokenizer.model")
    return f"--data.tokenizer_model={tmp_path / 'tokenizer.model'}"


def test_mfu_is_three_forwards_over_time_and_peak(tokenizer_arg):
    model = bench_steps.build_module("tiny", tokenizer_arg).model
    lengths = torch.tensor([16000, 8000])  # 100 and 50 feature frames
    batch = Batch(torch.zeros(2, 16000), lengths, torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 2]), ["a", "b"])
    figures = bench_sections.train_figures(model, [batch, batch], seconds=2.0, peak=1e9)
    forward = int(model.forward_flops(lengths).sum())
    assert figures["mfu"] == pytest.approx(3 * 2 * forward / 2.0 / 1e9)
    assert figures["x_real_time"] == pytest.approx(2 * 1.5 / 2.0)  # 3 s of audio in 2 s
    assert figures["padding"] == pytest.approx(0.25) and figures["step_s"] == 1.0


def test_fastest_takes_each_batch_best_pass():
    # two passes over three batches: (1, 2, 3) then (0.5, 2.5, 1)
    assert bench_steps.fastest([1.0, 2.0, 3.0, 0.5, 2.5, 1.0], 2) == pytest.approx(0.5 + 2.0 + 1.0)
    assert bench_steps.fastest([1.0, 2.0], 1) == 3.0


def test_targets_are_judged_against_their_thresholds():
    results = {"loop": {"overhead": 0.05}, "inference": {"rtf": 0.004}, "batching": {"bucketed": {"padding": 0.03}}}
    judged = bench.targets(results)
    assert {name: t["met"] for name, t in judged.items()} == {
        "loop/overhead": False, "inference/rtf": True, "batching/bucketed/padding": False}  # < 3% is strict


def test_unknown_preset_names_the_missing_file(tokenizer_arg):
    with pytest.raises(FileNotFoundError, match=r"configs/model/huge\.yaml"):
        bench_steps.build_module("huge", tokenizer_arg)


def test_scaling_script_prints_every_configuration_and_ratio():
    """scripts/bench_scaling.py (the README's memory and speed table) on the tiny preset, one round."""
    command = [sys.executable, "scripts/bench_scaling.py", "--presets", "tiny", "--rounds", "1", "--warmup", "1",
               "--batch_seconds", "8", "--utterance_seconds", "4"]
    out = subprocess.run(command, cwd=fit.CONFIGS.parent, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split(" | ")[1]: line.split(" | ")[2] for line in out.stdout.splitlines() if line.startswith("| tiny |")}
    assert list(rows) == ["bf16-mixed", "bf16-mixed, checkpoint_every 1", "32-true", "bf16-true",
                          "DDP, 2 processes, each a batch like the above", "checkpointing: activation memory saved",
                          "checkpointing: step time with / without",
                          "checkpointing: lowest possible ratio, 1 + recomputed share",
                          "bf16-mixed speed-up over 32-true", "bf16-true speed-up over 32-true",
                          "DDP 2 processes: throughput / 1 process"]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?(x|%)? \(.+\)|-?\d+%", value) for value in rows.values()), rows


