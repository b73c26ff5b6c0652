"""The scaling study: python -m asr.study end to end through the real CLI (its numbers on known inputs:
tests/study/test_analysis.py).

The end-to-end grid (2 widths x 2 data fractions of data/mini, at most 16 steps each) is shared by the tests of
this module; every subprocess has a timeout, so a hang fails with a message.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from asr.configs import CONFIGS
from asr.study.analysis import smoothed, steps_to_converge
from asr.study.run import StudyError, finished, main, read_metrics, steps_done
from tests.cli import CHAR_FRAMES
from tests import MINI, REPO

PLOTS = ("steps_vs_params.png", "min_val_loss_vs_params.png", "time_vs_params.png")
TIMEOUT = 900  # seconds for a whole study of the tiny grid


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(StudyError, match=r"fractions must be .* in \(0, 1\]"):
        main(["--quick", "--out", str(tmp_path), "--fractions", "[0.0, 1.0]"])
    with pytest.raises(StudyError, match="smooth: the smoothing window must be an odd number of validations, got 4"):
        main(["--quick", "--out", str(tmp_path), "--smooth", "4"])
    with pytest.raises(StudyError, match="no study.yaml"):
        main(["--collect", str(tmp_path)])
    with pytest.raises(StudyError, match=r"fit_configs / fit_args do not make an asr.fit config:\n(.|\n)*d_modle"):
        main(["--quick", "--out", str(tmp_path / "typo"), "--fit_args", '["--model.d_modle", "64"]'])


def test_the_full_grid_without_its_corpus_names_the_missing_manifest(tmp_path):
    """configs/study/grid.yaml trains on data/study, which its header says how to make: one line, no traceback."""
    done = study("--config", str(CONFIGS / "study" / "grid.yaml"), "--out", str(tmp_path / "study"),
                 cwd=tmp_path, returncode=1)
    assert done.stderr.strip() == ("asr.study: error: data.train_manifest: manifest data/study/train.jsonl does not "
                                   f"exist (relative paths start from the current folder, {tmp_path})")


def study(*args: str, cwd: Path = REPO, returncode: int = 0) -> subprocess.CompletedProcess:
    """``python -m asr.study ARGS`` as a user types it, from ``cwd``; fails the test with its output unless it
    exits with ``returncode``."""
    done = subprocess.run([sys.executable, "-m", "asr.study", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(REPO)}, timeout=TIMEOUT)
    assert done.returncode == returncode, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def slice_manifest(src: Path, dst: Path, n: int) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines()[:n]]
    dst.write_text("".join(json.dumps(r | {"audio_filepath": str(src.parent / r["audio_filepath"])}) + "\n"
                           for r in rows))
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> list[str]:
    """The quick study shrunk: widths 32 and 64, 1 layer, at most 16 steps, validation every 4 on 12 dev
    utterances, patience 1. Its lr of 0.05 overshoots once warm-up ends, so that trials converge (their
    validation loss rises after a minimum) within 16 steps and the fit and the answer have trials to use."""
    tmp = tmp_path_factory.mktemp("data")
    dev, test = slice_manifest(MINI / "dev.jsonl", tmp / "dev.jsonl", 12), slice_manifest(MINI / "test.jsonl", tmp / "test.jsonl", 12)
    fit_args = ["--model.encoder.n_heads", "2", "--model.schedule.warmup_steps", "4", "--trainer.log_every_n_steps", "4",
                "--model.inter_ctc", "0",  # the default run's intermediate CTC needs a middle block: 2+ layers
                "--model.optimizer.init_args.lr", "0.05",
                *CHAR_FRAMES,  # the default run's 40 ms front end, with which these 16 steps were tuned
                "--data.val_manifest", str(dev), "--data.test_manifest", str(test)]
    return ["--quick", "--widths", "[32, 64]", "--depths", "[1]", "--max_steps", "16", "--val_every", "4",
            "--patience", "1", "--fit_args", json.dumps(fit_args)]


@pytest.fixture(scope="module")
def grid(tiny, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("study")
    return out, study(*tiny, "--out", str(out))


def test_tiny_grid_runs_every_trial_and_validates_when_due(grid):
    out, done = grid
    names = ["w32-l1-f0.5", "w64-l1-f0.5", "w32-l1-f1", "w64-l1-f1"]
    with open(out / "trials.csv") as f:
        rows = {r["trial"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == sorted(names)
    for name in names:
        run = out / "runs" / name / "version_0"
        assert finished(run)
        val_steps = [steps_done(r) for r in read_metrics(run) if r.get("val/loss")]
        assert val_steps == list(range(4, val_steps[-1] + 1, 4)) and val_steps[-1] <= 16, name  # every val_every batches
        if val_steps[-1] < 16:  # Lightning's EarlyStopping ended it: the study must count it converged
            assert rows[name]["converged"] == "True", name
    assert rows["w32-l1-f0.5"]["converged"] == rows["w32-l1-f1"]["converged"] == "True"  # overshot after warm-up
    assert int(rows["w32-l1-f1"]["last_step"]) < 16  # so stopped by EarlyStopping, not by max_steps
    for row in rows.values():
        assert int(row["steps"]) in (4, 8, 12, 16)
        assert float(row["seconds_per_step"]) > 0 and float(row["flops_per_step"]) > 0
        assert float(row["hours_here"]) > 0 and float(row["hours_gpu"]) > 0
    small, large = (int(next(r["params"] for r in rows.values() if r["width"] == w)) for w in ("32", "64"))
    assert large > small > 0


def test_tiny_grid_writes_table_json_and_plots(grid):
    out, done = grid
    result = json.loads((out / "study.json").read_text())
    assert {"a", "k1", "k2", "r2", "plateau_params", "per_fraction", "answer"} <= set(result)
    with open(out / "trials.csv") as f:
        converged = [r["trial"] for r in csv.DictReader(f) if r["converged"] == "True"]
    assert result["trials"] == 4 and result["fitted"] == len(converged) >= 2
    assert result["a"] > 0 and isinstance(result["k1"], float) and isinstance(result["k2"], float)  # both D and M vary
    assert result["smooth"] == 1
    hours = sum(json.loads(line)["duration"] for line in (MINI / "train.jsonl").open()) / 3600
    assert result["answer"].startswith(f"With the largest data fraction (1: {hours:.2f} h of audio), d_model ")
    table = (out / "study.md").read_text()
    assert ("Not converged within max_steps" in table) == (len(converged) < 4)
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


def test_collect_re_measures_finished_trials_with_another_smoothing(grid, tmp_path):
    """``--collect DIR --smooth 3`` (smooth is an analysis setting): no trial reruns, steps on the moving average."""
    out = tmp_path / "study"
    shutil.copytree(grid[0], out)
    metrics = out / "runs" / "w64-l1-f1" / "version_0" / "metrics.csv"
    before = metrics.stat().st_mtime_ns
    study("--collect", str(out), "--smooth", "3")
    assert metrics.stat().st_mtime_ns == before
    assert json.loads((out / "study.json").read_text())["smooth"] == 3
    assert "minimum of the 3-validation moving average of val/loss" in (out / "study.md").read_text()
    with open(out / "trials.csv") as f:
        rows = {r["trial"]: r for r in csv.DictReader(f)}
    for name, row in rows.items():
        val = [r for r in read_metrics(out / "runs" / name / "version_0") if r.get("val/loss")]
        curve = smoothed([steps_done(r) for r in val], [float(r["val/loss"]) for r in val], 3)
        assert int(row["steps"]) == steps_to_converge(*curve), name


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
    assert json.loads((out / "study.json").read_text())["trials"] == 2


def test_the_readme_quick_study_runs_as_documented(tmp_path):
    """``python -m asr.study --quick --out DIR`` exactly, as docs/study.md gives it (the tiny grid above
    overrides its fit_args)."""
    study("--quick", "--out", str(tmp_path))
    with open(tmp_path / "trials.csv") as f:
        assert sorted(r["trial"] for r in csv.DictReader(f)) == ["w32-l2-f0.5", "w32-l2-f1", "w64-l2-f0.5", "w64-l2-f1"]
