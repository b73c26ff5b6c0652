"""Streaming models for tests: a tiny streaming checkpoint whose frames are blank on silence, and ToneStream,
ToneModel (tests/tones.py) heard chunk by chunk."""

from __future__ import annotations

import torch

from asr.models.features import FeatureConfig
from asr.tokenizer import Tokenizer
from tests.conftest import encoder
from tests.tones import FRAME, ToneModel

RATE = 16000


def speech_and_pauses(seed: int = 0, rate: int = RATE) -> torch.Tensor:
    """(n,) 6 s at ``rate``: noise 1 s, silence 1 s, noise 1 s, noise at -40 dB 1 s, noise 2 s."""
    audio = torch.randn(6 * rate, generator=torch.Generator().manual_seed(seed)) * 0.1
    audio[rate: 2 * rate] = 0.0
    audio[3 * rate: 4 * rate] *= 0.01
    return audio


def streaming_module(tokenizer: Tokenizer, chunk: int = 2, rate: int = RATE, norm: str = "global"):
    """An untrained streaming Conformer-CTC ASRModule for ``rate`` Hz (d_model 32, 2 blocks, 40 ms frames, chunk
    ``chunk`` frames, 6 frames of left context, ``norm`` normalisation) whose blank is biased to win 60% of the frames
    of speech_and_pauses: blank on its silence and quiet second, tokens on most of its noise."""
    from asr.train.module import ASRModule  # here: Lightning only for the tests that need it

    torch.manual_seed(0)
    cfg = encoder(n_heads=2, ff_mult=2, dropout=0.0, block="conformer", conv_kernel=5, streaming=True,
                  chunk_frames=chunk, left_context=6)
    module = ASRModule(tokenizer=tokenizer, encoder=cfg, features=FeatureConfig(rate, norm=norm, var_floor=0.0, quiet_db=0.0))
    module.eval()
    audio = speech_and_pauses(rate=rate)[None]
    with torch.no_grad():
        log_probs, _ = module.model(audio, torch.tensor([audio.shape[1]]))
        margin = log_probs[0, :, 1:].max(-1).values - log_probs[0, :, 0]
        module.model.head.bias[0] += torch.quantile(margin, 0.6)
    return module


class ToneStream(ToneModel):
    """ToneModel as a StreamingModel (asr.inference.streaming): its frames as each chunk of audio is complete."""

    chunk_frames = 2

    def start_stream(self) -> torch.Tensor:
        return torch.zeros(0)

    def stream_step(self, audio: torch.Tensor, state: torch.Tensor, chunk: int, final: bool):
        buffer = torch.cat([state, audio])
        size = FRAME if final else chunk * FRAME
        take = len(buffer) // size * size
        if not take:
            return torch.zeros(0, self.tokenizer.vocab_size), buffer
        frames, _ = self.log_probs(buffer[None, :take], torch.tensor([take]))
        return frames[0], buffer[take:]


def batch_sizes(network, monkeypatch) -> list[int]:
    """The batch of every StreamingEncoder.step of ``network`` from now on."""
    sizes, step = [], network.encoder.step

    def counted(feats, state, ahead=0):
        sizes.append(feats.shape[0])
        return step(feats, state, ahead)

    monkeypatch.setattr(network.encoder, "step", counted)
    return sizes
