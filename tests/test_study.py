"""The scaling study: its numbers on known inputs, and python -m asr.study end to end through the real CLI.

The end-to-end grid (2 widths x 2 data fractions of data/mini, 16 steps each) is shared by the tests of
this module; every subprocess has a timeout, so a hang fails with a message.
"""

from __future__ import annotations

import csv
import json
import shlex
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from asr.study import StudyError, finished, main, read_metrics, steps_done
from asr.study_analysis import (PowerLaw, Target, answer, fit_power_law, gpu_step_seconds, plateau,
                                steps_to_converge)

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "data" / "mini"
PLOTS = ("steps_vs_params.png", "min_val_loss_vs_params.png", "time_vs_params.png")
TIMEOUT = 900  # seconds for a whole study of the tiny grid


def test_fit_recovers_known_exponents_from_noisy_steps():
    rng = np.random.default_rng(0)
    a, k1, k2 = 5e4, 0.7, 0.35
    hours, params = np.meshgrid([0.5, 1.0, 2.0, 4.0], [2e5, 5e5, 1e6, 3e6, 1e7])
    hours, params = hours.ravel(), params.ravel()
    steps = a * hours**k1 / params**k2 * np.exp(rng.normal(0, 0.05, hours.size))  # 5% noise
    fit = fit_power_law(hours.tolist(), params.tolist(), steps.tolist())
    assert fit.k1 == pytest.approx(k1, abs=0.05)
    assert fit.k2 == pytest.approx(k2, abs=0.05)
    assert fit.a == pytest.approx(a, rel=0.5)  # log a carries the error of both slopes at log M ~ 14
    assert 0.95 < fit.r2 <= 1.0
    assert fit.steps(2.0, 1e6) == pytest.approx(a * 2.0**k1 / 1e6**k2, rel=0.1)


def test_fit_with_one_data_size_leaves_k1_unknown():
    fit = fit_power_law([1.0, 1.0, 1.0], [1e5, 1e6, 1e7], [1000.0, 500.0, 250.0])
    assert fit.k1 is None
    assert fit.k2 == pytest.approx(np.log(2) / np.log(10))
    assert fit.r2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2"):
        fit_power_law([1.0], [1e5], [100.0])


@pytest.mark.parametrize("losses, expected", [
    ([4.0, 3.0, 2.5, 2.02, 2.0], 400),  # monotone: 2.02 is within 1% of 2.0
    ([4.0, 3.0, 2.5, 2.03, 2.0], 500),  # 2.03 is not: the minimum itself
    ([4.0, 2.015, 2.6, 2.0, 2.4], 200),  # noisy: the first entry into the band counts, even if it leaves again
    ([5.0, 2.0, 3.0, 4.0, 6.0], 200),  # overfitting after the minimum
    ([3.0, 3.0, 3.0, 3.0, 3.0], 100),  # flat
])
def test_steps_to_within_one_percent_of_the_minimum(losses, expected):
    assert steps_to_converge([100, 200, 300, 400, 500], losses) == expected


def test_steps_to_converge_refuses_mismatched_curves():
    with pytest.raises(ValueError, match="one loss per validation"):
        steps_to_converge([100, 200], [1.0])


def test_plateau_is_the_size_beyond_which_steps_stop_falling():
    params = [1e5, 3e5, 1e6, 3e6, 1e7]
    assert plateau(params, [1000, 600, 400, 390, 395]) == 1e6
    assert plateau(params, [1000, 800, 600, 450, 300]) is None  # still falling at the largest size
    assert plateau(params[::-1], [395, 390, 400, 600, 1000]) == 1e6  # order of the trials does not matter
    assert plateau([1e6], [400]) is None


def test_gpu_projection_uses_the_cost_table_and_names_an_unknown_gpu():
    a100 = Target("A100", mfu=0.5, devices=2, price_per_device_hour=2.0)
    assert gpu_step_seconds(312e12, a100, "bf16-mixed") == pytest.approx(312e12 / (312e12 * 0.5 * 2))
    slow = Target("A100", mfu=0.5, devices=2, step_overhead=0.02)
    assert gpu_step_seconds(312e12, slow, "bf16-mixed") == pytest.approx(1.02)
    assert gpu_step_seconds(19.5e12, Target("A100", mfu=1.0), "32-true") == pytest.approx(19.5 / 156)  # tf32
    with pytest.raises(ValueError, match="gpu.name 'Voodoo 2'"):
        gpu_step_seconds(1e12, Target("Voodoo 2"), "bf16-mixed")


def test_answer_names_the_soonest_size_here_and_on_the_gpu():
    rows = [{"fraction": f, "train_hours": f, "width": w, "depth": 2, "params": w * 1e4, "steps": s,
             "hours_here": here, "hours_gpu": gpu}
            for f, w, s, here, gpu in [(1.0, 64, 900, 0.5, 0.010), (1.0, 128, 500, 0.4, 0.012),
                                       (1.0, 256, 450, 0.9, 0.009), (0.5, 32, 10, 0.001, 0.0001)]]
    sentence = answer(rows, Target("H100"))
    assert "d_model 128 x 2 layers" in sentence.split("converges soonest on this machine")[0]
    assert "d_model 256 x 2 layers" in sentence.split("H100")[1]
    assert "0.5" not in sentence.split("(")[1].split(")")[0]  # the largest fraction, not the cheapest trial


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(StudyError, match=r"fractions must be .* in \(0, 1\]"):
        main(["--quick", "--out", str(tmp_path), "--fractions", "[0.0, 1.0]"])
    with pytest.raises(StudyError, match="no study.yaml"):
        main(["--collect", str(tmp_path)])


def study(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m asr.study ARGS`` as a user types it; fails the test with its output if it fails."""
    done = subprocess.run([sys.executable, "-m", "asr.study", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def slice_manifest(src: Path, dst: Path, n: int) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines()[:n]]
    dst.write_text("".join(json.dumps(r | {"audio_filepath": str(src.parent / r["audio_filepath"])}) + "\n"
                           for r in rows))
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> list[str]:
    """The quick study shrunk: widths 32 and 64, 1 layer, 16 steps, validation every 4 on 12 dev utterances."""
    tmp = tmp_path_factory.mktemp("data")
    dev, test = slice_manifest(MINI / "dev.jsonl", tmp / "dev.jsonl", 12), slice_manifest(MINI / "test.jsonl", tmp / "test.jsonl", 12)
    fit_args = ["--model.n_heads", "2", "--model.warmup_steps", "4", "--trainer.log_every_n_steps", "4",
                "--data.val_manifest", str(dev), "--data.test_manifest", str(test)]
    return ["--quick", "--widths", "[32, 64]", "--depths", "[1]", "--max_steps", "16", "--val_every", "4",
            "--patience", "10", "--fit_args", json.dumps(fit_args)]


@pytest.fixture(scope="module")
def grid(tiny, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("study")
    return out, study(*tiny, "--out", str(out))


def test_tiny_grid_runs_every_trial_and_validates_when_due(grid):
    out, done = grid
    names = ["w32-l1-f0.5", "w64-l1-f0.5", "w32-l1-f1", "w64-l1-f1"]
    for name in names:
        run = out / "runs" / name / "version_0"
        assert finished(run)
        val_steps = [steps_done(r) for r in read_metrics(run) if r.get("val/loss")]
        assert val_steps == [4, 8, 12, 16], name  # every val_every batches, across epoch ends
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["trial"] for r in rows) == sorted(names)
    for row in rows:
        assert int(row["steps"]) in (4, 8, 12, 16)
        assert row["converged"] == str(int(row["min_val_step"]) < 16)
        assert float(row["seconds_per_step"]) > 0 and float(row["flops_per_step"]) > 0
        assert float(row["hours_here"]) > 0 and float(row["hours_gpu"]) > 0
    small, large = (int(next(r["params"] for r in rows if r["width"] == w)) for w in ("32", "64"))
    assert large > small > 0


def test_tiny_grid_writes_table_json_and_plots(grid):
    out, done = grid
    result = json.loads((out / "study.json").read_text())
    assert {"a", "k1", "k2", "r2", "plateau_params", "per_fraction", "answer"} <= set(result)
    assert result["trials"] == 4 and len(result["per_fraction"]) == 2
    assert "converges soonest on this machine" in result["answer"]
    table = (out / "study.md").read_text()
    assert result["answer"] in table and table.count("| w") == 4
    assert result["answer"] in done.stdout
    for name in PLOTS:
        if find_spec("matplotlib"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        else:
            assert "no matplotlib, so no plots" in done.stdout


def test_a_rerun_does_not_rerun_finished_trials(grid, tiny):
    out, _ = grid
    metrics = out / "runs" / "w32-l1-f1" / "version_0" / "metrics.csv"
    before = metrics.stat().st_mtime_ns
    again = study(*tiny, "--out", str(out))
    assert again.stdout.count("finished earlier, not rerun") == 4
    assert metrics.stat().st_mtime_ns == before
    assert json.loads((out / "study.json").read_text())["trials"] == 4


def test_printed_commands_run_as_they_are_and_collect_analyses_them(grid, tiny, tmp_path):
    out = tmp_path / "study"
    lines = study(*tiny, "--out", str(out), "--print_commands").stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("python -m asr.fit ") for line in lines)
    assert (out / "commands.txt").read_text().splitlines() == lines
    # As a job array would, from another folder: the 4th line (w64 at fraction 1). The 3rd trial
    # (w32 at fraction 1) is taken from the grid above, as if another job had run it.
    assert "--trainer.logger.init_args.name w64-l1-f1 " in lines[3]
    done = subprocess.run([sys.executable, *shlex.split(lines[3])[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copytree(grid[0] / "runs" / "w32-l1-f1", out / "runs" / "w32-l1-f1")
    collected = study("--collect", str(out), cwd=tmp_path)
    with open(out / "trials.csv") as f:
        assert sorted(r["trial"] for r in csv.DictReader(f)) == ["w32-l1-f1", "w64-l1-f1"]
    assert "Not finished (2): w32-l1-f0.5, w64-l1-f0.5." in collected.stdout
    result = json.loads((out / "study.json").read_text())
    assert result["k1"] is None and result["k2"] is not None  # one data size: no k1
