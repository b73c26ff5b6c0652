"""asr.bench.attention: every path the device can take is timed (on CPU: masked SDPA only); no figure is checked."""

import pytest
import torch

from asr.bench.attention import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the paths of a machine without CUDA")
@pytest.mark.parametrize("window", ["0", "3"])
def test_the_masked_sdpa_path_is_timed_on_cpu(capsys, window):
    main(["--batch", "2", "--frames", "40", "--d_model", "32", "--heads", "4", "--window", window, "--rotary",
          "--repeats", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[3:]]
    assert [row[0].strip("| ") for row in rows] == ["sdpa"] and float(rows[0][1]) > 0
