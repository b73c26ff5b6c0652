"""asr.bench.gpu and scripts/gpu_check.sh: where there is no GPU they say so; on a GPU (-m gpu) they measure."""

import os
import subprocess
import sys

import pytest
import torch

from asr.bench import gpu
from tests import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine measures instead")
def test_without_a_gpu_both_say_so_and_fail():
    with pytest.raises(SystemExit):
        gpu.main([])
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": "/nonexistent-never-written"}
    result = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2 and "no CUDA GPU here" in result.stdout


@pytest.mark.gpu
def test_a_preset_gets_a_measured_row(capsys):
    gpu.main(["--presets", "conformer-large", "--batch_seconds", "30", "--steps", "2", "--warmup", "1"])
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| conformer-large")][0]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "105M" and float(cells[2]) > 0 and 0 < float(cells[6].rstrip("%")) < 100
