"""The scaling study's report (asr/study/report.py) from trial rows with known numbers: study.md's
answer, fit and table, study.json, trials.csv and the plots, without running a trial.
(The same report from real asr.fit runs: tests/e2e/test_study.py.)
"""

from __future__ import annotations

import csv
import json
from importlib.util import find_spec

import pytest

from asr.study.analysis import Target, projections
from asr.study.report import COLUMNS, write_report
from asr.study.run import Study

PLOTS = ("steps_vs_params.png", "min_val_loss_vs_params.png", "time_vs_params.png")


def row(width: int, fraction: float, converged: bool = True, steps: int | None = None) -> dict:
    """A finished trial whose steps follow 1e4 * D**0.5 / M**0.25 exactly (D hours, M parameters) unless
    ``steps`` is given."""
    params, hours = width * width * 100, fraction * 2.0
    figures = {"trial": f"w{width}-l2-f{fraction:g}", "width": width, "depth": 2, "fraction": fraction,
               "train_hours": hours, "params": params, "steps": steps or round(1e4 * hours**0.5 / params**0.25),
               "last_step": 2000, "validations": 40, "min_val_loss": 1.0 + 10 / width, "min_val_step": 900,
               "converged": converged, "val_wer": 0.2, "val_cer": 0.1, "test_wer": 0.25, "test_cer": 0.12,
               "flops_per_step": params * 6e3, "seconds_per_step": 0.05 * width / 32, "audio_hours_seen": 1.5}
    return figures | projections(figures, Target("A100", price_per_device_hour=2.0), "bf16-mixed", 1, 0.5)


@pytest.fixture
def report(tmp_path, capsys):
    """write_report of 2 fractions x 3 widths, one trial not finished; (out, stdout). w128-l2-f1 was cut by
    max_steps after 10 steps: off the law, and the cheapest trial if it counted."""
    study = Study(out=str(tmp_path), price_per_device_hour=0.5, gpu=Target("A100", price_per_device_hour=2.0))
    rows = [row(w, f) if (w, f) != (128, 1.0) else row(w, f, converged=False, steps=10)
            for f in (0.5, 1.0) for w in (32, 64, 128)]
    write_report(study, rows, ["w256-l2-f1"], tmp_path)
    return tmp_path, capsys.readouterr().out


def test_study_md_answers_states_the_fit_and_has_a_row_per_trial(report):
    out, printed = report
    text, result = (out / "study.md").read_text(), json.loads((out / "study.json").read_text())
    assert text.startswith("# Which model size trains fastest?\n\n" + result["answer"]) and text in printed
    assert "d_model 32 x 2 layers" in result["answer"].split("converges soonest on this machine")[0]
    assert result["trials"] == 6 and result["fitted"] == 5 and "Fit over 5 converged trials" in text  # not w128-l2-f1
    assert result["k1"] == pytest.approx(0.5, abs=0.01) and result["k2"] == pytest.approx(0.25, abs=0.01)
    table = [line for line in text.splitlines() if line.startswith("| w")]
    trials = [f"w{w}-l2-f{f:g}" for f in (0.5, 1.0) for w in (32, 64, 128)]
    assert [line.split(" | ")[0][2:] for line in table] == trials  # by fraction, then size
    assert "cost here | cost on A100 |" in text  # both priced
    assert table[-1].split(" | ")[3].endswith("*") and "Not converged within max_steps" in text
    assert "Not finished (1): w256-l2-f1." in text


def test_trials_csv_has_every_column_and_the_plots_are_pngs(report):
    out, printed = report
    with open(out / "trials.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS and len(list(reader)) == 6
    for name in PLOTS:
        if find_spec("matplotlib"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        else:
            assert "no matplotlib, so no plots" in printed


def test_one_finished_trial_reports_no_fit(tmp_path, capsys):
    write_report(Study(out=str(tmp_path)), [row(32, 1.0)], [], tmp_path)
    result = json.loads((tmp_path / "study.json").read_text())
    assert result["k2"] is None and result["trials"] == 1
    assert "Fit over" not in (tmp_path / "study.md").read_text()
