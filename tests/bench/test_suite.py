"""asr.bench (asr/bench/suite.py): the quick benchmark runs end to end and writes every section; it measures what
asr.fit builds and trains (asr.bench.steps); its targets judged by hand. (python -m asr.bench.scaling:
tests/bench/test_scaling.py.)"""

from __future__ import annotations

import json

from asr.bench import suite as bench

from asr.bench import steps as bench_steps

from asr.hardware import data_workers, emulates_bf16, usable_cores

SECTIONS = ("peak", "train", "batching", "loop", "features", "data", "inference", "corpus", "machine", "targets")


def test_quick_mode_writes_every_section_with_sane_values(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--quick", "--out", str(out)])
    results = json.loads(out.read_text())
    assert set(SECTIONS) <= set(results)
    assert results["peak"]["fp32"] > 0 and results["peak"]["bf16"] > 0
    timed = {"tiny/32-true"} | (set() if emulates_bf16(**results["peak"]) else {"tiny/bf16-mixed"})
    assert set(results["train"]) == timed  # bf16 only where the CPU has bf16 units
    for figures in results["train"].values():
        assert figures["x_real_time"] > 0 and figures["mfu"] > 0 and 0 <= figures["padding"] < 1
    bucketed, shuffled = results["batching"]["bucketed"], results["batching"]["random"]
    assert 0 <= bucketed["padding"] < shuffled["padding"] <= 1
    assert bucketed["x_real_time"] > 0 and shuffled["x_real_time"] > 0
    assert results["loop"]["plain_s"] > 0 and results["loop"]["lightning_s"] > 0
    assert results["features"]["features_x_real_time"] > 0 and results["features"]["decode_features_x_real_time"] > 0
    hp = results["data"]
    assert 0 <= hp["wait_share"] < 1 and hp["num_workers"] == data_workers(usable_cores(), on_gpu=False)
    assert results["inference"]["rtf"] > 0
    assert results["corpus"]["sample_rate"] == bench_steps.build("tiny").datamodule.hparams.sample_rate
    # The quick run has no base preset: every other target is judged, each with a yes/no in the table.
    assert set(results["targets"]) == set(bench.TARGETS) - {"train/base/32-true/mfu", "train/base/bf16-mixed/mfu"}
    table = capsys.readouterr().out
    for name, target in results["targets"].items():
        assert f"| {name} |" in table and f"| {target['target']} | {'yes' if target['met'] else 'NO'} |" in table


def test_targets_are_judged_against_their_thresholds():
    results = {"loop": {"overhead": 0.05}, "inference": {"rtf": 0.004}, "batching": {"bucketed": {"padding": 0.03}}}
    judged = bench.targets(results)
    assert {name: t["met"] for name, t in judged.items()} == {
        "loop/overhead": False, "inference/rtf": True, "batching/bucketed/padding": False}  # < 3% is strict
