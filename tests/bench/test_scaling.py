"""python -m asr.bench.scaling (asr/bench/scaling.py) prints its ratios: every configuration and ratio, each a
number with its spread."""

from __future__ import annotations

import re
import subprocess
import sys

from tests import REPO


def test_scaling_script_prints_every_configuration_and_ratio():
    """python -m asr.bench.scaling (docs/scale-out.md's memory and speed levers) on the tiny preset, one round."""
    # small batches and no untimed round: bf16 is emulated on AVX2-only CPUs (100x slower than fp32), and this checks
    # the table, not speed
    command = [sys.executable, "-m", "asr.bench.scaling", "--presets", "tiny", "--rounds", "1", "--warmup", "0",
               "--batch_seconds", "2", "--utterance_seconds", "1"]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split(" | ")[1]: line.split(" | ")[2] for line in out.stdout.splitlines() if line.startswith("| tiny |")}
    assert list(rows) == ["bf16-mixed", "bf16-mixed, checkpoint_every 1", "32-true", "bf16-true",
                          "DDP, 2 processes, each a batch like the above", "checkpointing: activation memory saved",
                          "checkpointing: step time with / without",
                          "checkpointing: lowest possible ratio, 1 + recomputed share",
                          "bf16-mixed speed-up over 32-true", "bf16-true speed-up over 32-true",
                          "DDP 2 processes: throughput / 1 process"]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?(x|%)? \(.+\)|-?\d+%", value) for value in rows.values()), rows


