"""asr.bench.sections: the training figures (model FLOPs utilisation, x real time, padding), by hand."""

from __future__ import annotations

import pytest
import torch

from asr.bench import sections as bench_sections

from asr.bench import steps as bench_steps
from asr.data.batch import Batch


def test_mfu_is_three_forwards_over_time_and_peak(tokenizer_arg):
    model = bench_steps.build_module("tiny", tokenizer_arg).model
    lengths = torch.tensor([16000, 8000])  # 100 and 50 feature frames
    batch = Batch(torch.zeros(2, 16000), lengths, torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 2]), ["a", "b"])
    figures = bench_sections.train_figures(model, [batch, batch], seconds=2.0, peak=1e9)
    forward = int(model.forward_flops(lengths).sum())
    assert figures["mfu"] == pytest.approx(3 * 2 * forward / 2.0 / 1e9)
    assert figures["x_real_time"] == pytest.approx(2 * 1.5 / 2.0)  # 3 s of audio in 2 s
    assert figures["padding"] == pytest.approx(0.25) and figures["step_s"] == 1.0
