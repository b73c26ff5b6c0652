"""configs/recipes/demo-streaming.yaml (and its 8 kHz variant) on the default run, as their headers stack them: a
streaming model of the default run's size and front end, at 320 ms chunks by default, that trains and streams."""

from __future__ import annotations

import pytest
import torch

from asr.models import streaming
from asr.train.fitting import build
from tests.e2e.test_recipes import MINI

STACK = ["--config", "configs/recipes/demo-streaming.yaml"]


@pytest.mark.parametrize("extra, rate, window", [([], 16000, 0.025),
                                                 (["--config", "configs/recipes/demo-streaming-8khz.yaml"], 8000, 0.02)])
def test_the_streaming_recipes_build_the_demo_model_streaming(extra, rate, window, keep_threads):
    cli = build([*STACK, *extra, *MINI, "--trainer.precision", "32-true"])
    network, hp = cli.model.model, cli.model.hparams
    assert streaming.streams(network) and network.sample_rate == rate == cli.datamodule.hparams.sample_rate
    assert network.features.config.norm == "running"  # the stream's own statistics so far (online CMVN)
    assert hp.encoder["d_model"] == 96 and hp.encoder["subsampling"] == 8 and hp.inter_ctc == 0.3  # the default run's
    assert network.encoder.chunk * network.frame_seconds == pytest.approx(0.32)
    assert streaming.algorithmic_latency(network.encoder, 4, network.features.config.win_seconds) == \
        pytest.approx(0.32 + window - 0.01)
    assert cli.trainer.logger.name == ("demo-streaming" if rate == 16000 else "demo-streaming-8khz")
    network.train()
    audio = torch.randn(2, rate) * 0.1
    log_probs, lengths, middle = network(audio, torch.tensor([rate, rate // 2]), middle=True)  # inter_ctc's too
    assert log_probs.shape[1] == 12 and lengths.tolist() == [12, 6] and middle.shape == log_probs.shape
