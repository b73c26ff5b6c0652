"""python -m asr.bench.checkpoints (asr/bench/checkpoints.py) prints one row per way of saving under FSDP."""

from __future__ import annotations

import re
import subprocess
import sys

from tests import REPO


def test_checkpoint_bench_prints_size_and_times_of_every_way(tmp_path):
    """2 torchrun processes of the tiny preset, one save of each way."""
    command = [sys.executable, "-m", "asr.bench.checkpoints", "--config", "configs/model/tiny.yaml", "--rounds", "1",
               "--out", str(tmp_path)]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = re.findall(r"^\| (.+?) \| (\d+\.\d\d) \| (\d+\.\d\d) \| (\d+\.\d\d) \|$", out.stdout, re.MULTILINE)
    assert [row[0] for row in rows] == ["full file, rank 0 gathers", "sharded folder",
                                        "sharded folder, in the background"]
    assert not list(tmp_path.rglob("*.ckpt*"))  # every checkpoint it wrote is removed
