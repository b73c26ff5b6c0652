"""asr.models.encoder: the Encoder seam. An encoder registered in ENCODERS is what CTCModel, the FLOP count and
FSDP's units get, chosen by model.encoder.block; any other value builds today's BlockEncoder."""

import torch
from torch import nn

from asr.models import encoder as enc
from asr.models.config import EncoderConfig
from asr.models.ctc import CTCModel
from asr.models.features import FeatureConfig


class Linear(nn.Module):
    """The least encoder: every 4 feature frames averaged and projected (the Encoder contract, nothing more)."""

    def __init__(self, cfg: EncoderConfig, n_feats: int, checkpoint_every: int = 0):
        super().__init__()
        self.d_model, self.factor, self.middle_block = cfg.d_model, 4, -1
        self.proj = nn.Linear(n_feats, cfg.d_model)

    def forward(self, feats, frames, middle=False):
        t = feats.shape[1] // 4
        x = feats[:, : 4 * t].reshape(feats.shape[0], t, 4, -1).mean(2)  # (B, T', F)
        return self.proj(x), self.output_lengths(frames)

    def output_lengths(self, frames):
        return frames // 4

    def flops(self, frames):
        t = frames // 4
        return 2 * t * self.proj.in_features * self.proj.out_features, t

    def units(self):
        return [self.proj]


def test_a_registered_encoder_is_what_the_model_runs_counts_and_shards(monkeypatch):
    monkeypatch.setitem(enc.ENCODERS, "linear", f"{__name__}:Linear")
    features = FeatureConfig(16000)
    model = CTCModel(features, EncoderConfig(d_model=16, block="linear"), vocab_size=7)
    assert isinstance(model.encoder, Linear) and model.encoder.units() == [model.encoder.proj]
    audio, lengths = torch.randn(2, 16000), torch.tensor([16000, 8000])
    log_probs, out = model(audio, lengths)
    assert log_probs.shape == (2, 25, 7) and out.tolist() == [25, 12]
    assert model.encoder_frames(lengths).tolist() == [25, 12] and model.frame_seconds == 0.04
    head = 2 * 16 * 7
    assert model.forward_flops(lengths).tolist() == [25 * (2 * 80 * 16 + head), 12 * (2 * 80 * 16 + head)]


def test_any_other_block_value_builds_the_block_stack():
    model = CTCModel(FeatureConfig(16000), EncoderConfig(d_model=16, n_heads=2, n_layers=2, block="conformer",
                                                         conv_kernel=3), vocab_size=7)
    assert isinstance(model.encoder, enc.BlockEncoder) and len(model.encoder.units()) == 2
    assert model.encoder.middle_block == 0
