"""scripts/gpu_check.sh without a GPU: its table and exit status, with a stand-in interpreter (PYTHON=) that says
there is one GPU and fails the commands asked of it, so a CI job or a person running it sees a failed check."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests import REPO

FAKE_PYTHON = """#!/bin/sh
# A stand-in for python: one GPU, and every command succeeds but those whose arguments contain $FAIL.
case "$*" in
  *device_count*) echo 1; exit 0 ;;
  *get_device_properties*) echo "1 x stand-in GPU"; exit 0 ;;
esac
if [ -n "$FAIL" ]; then
  case "$*" in *"$FAIL"*) echo "failing as asked" >&2; exit 3 ;; esac
fi
exit 0
"""


def gpu_check(tmp_path: Path, fail: str = "") -> subprocess.CompletedProcess:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHON=str(python), FAIL=fail, GPU_CHECK_OUT=str(tmp_path / "out"))
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=60)


def rows(result: subprocess.CompletedProcess) -> dict[str, str]:
    """check -> status, from the script's summary table."""
    return {cells[1].strip(): cells[2].strip() for line in result.stdout.splitlines()
            if line.startswith("| ") and (cells := line.split("|")) and cells[1].strip() not in ("check",)}


def test_every_check_passing_exits_0(tmp_path):
    result = gpu_check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result)
    assert {table[name] for name in ("tests", "bench-bf16", "fit-bf16", "fit-fp16", "transcribe")} == {"ok"}


@pytest.mark.parametrize("fail, check", [("-m pytest", "tests"), ("asr.transcribe", "transcribe"),
                                         ("--trainer.precision 16-mixed", "fit-fp16")])
def test_a_failing_check_is_a_fail_row_and_exit_status_1(tmp_path, fail, check):
    result = gpu_check(tmp_path, fail)
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result)
    assert table[check] == "FAIL (exit 3)"
    assert [name for name, status in table.items() if status.startswith("FAIL")] == [check]
    assert "gpu_check: 1 checks failed" in result.stdout
