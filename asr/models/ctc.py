"""The network, in plain PyTorch (no Lightning): features -> encoder -> CTC head.

    audio (B, n) ──FeatureExtractor──> (B, T, F) ──SpecAugment (training only)──>
    ──Encoder (asr.models.encoder: Conv2d subsampling x4 or x8, Transformer or Conformer blocks)──> (B, T', d)
    ──LayerNorm ──Linear──> (B, T', V) ──log_softmax in fp32──> CTC log-probabilities
    (training with intermediate CTC also puts the middle block's output through the same LayerNorm and Linear)

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it. Lengths are carried
explicitly, so an utterance's output does not depend on what it was batched with. The model owns what follows
from its shapes: ``frame_seconds``, ``encoder_frames`` and ``forward_flops`` (asr.train.cost asks it; the
encoder counts its own FLOPs). ``vocab_size`` includes the CTC blank (see asr.tokenizer).
"""

from __future__ import annotations

import torch
from torch import nn

from asr.audio import HOP_SECONDS, FeatureConfig, FeatureExtractor, num_frames
from asr.models.config import EncoderConfig
from asr.models.encoder import build_encoder
from asr.specaugment import SpecAugment


class CTCModel(nn.Module):
    """Waveforms in, CTC log-probabilities out. The feature front end is part of the model.

    ``checkpoint_every=k`` recomputes every k-th block's activations in the backward pass (the encoder's
    activation checkpointing); 0 turns it off.
    """

    token_rows = ("head.weight", "head.bias")  # the weights with one row per token (a new vocabulary renews them)

    def __init__(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int,
                 spec_augment: SpecAugment | None = None, checkpoint_every: int = 0):
        super().__init__()
        self.features = FeatureExtractor(features)
        self.spec_augment = spec_augment or nn.Identity()
        self.encoder = build_encoder(encoder, features.n_feats, checkpoint_every)
        self.norm = nn.LayerNorm(self.encoder.d_model)
        self.head = nn.Linear(self.encoder.d_model, vocab_size)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, middle: bool = False,
                statistics: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """audio (B, n) and lengths (B,) in samples -> log-probs (B, T', V) in fp32 and lengths (B,).

        ``middle=True`` adds a third output: the log-probs (B, T', V) of the middle block's output through
        the same norm and head, intermediate CTC's (Lee and Watanabe 2021). A flag of forward, not another
        method, so that FSDP2's hooks on the root module's forward still gather its parameters. ``statistics``
        (B, 2): the samples whose frames alone give the features' normalisation (FeatureExtractor).
        """
        feats, frames = self.features(audio, lengths, statistics)  # (B, T, F), fp32
        feats = feats.to(self.head.weight.dtype)  # bf16 when the weights are (bf16-true); autocast does the rest
        x, lengths, *rest = self.encoder(self.spec_augment(feats), frames, middle)  # (B, T', d)
        if middle:
            return self.log_probs(x), lengths, self.log_probs(rest[0])
        return self.log_probs(x), lengths

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder states (B, T', d) -> CTC log-probabilities (B, T', V) in fp32."""
        return self.head(self.norm(x)).float().log_softmax(dim=-1)

    @property
    def sample_rate(self) -> int:
        """Hz of the audio the model takes."""
        return self.features.config.sample_rate

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per output (encoder) frame: the feature hop times the subsampling."""
        return HOP_SECONDS * self.encoder.factor

    def encoder_frames(self, num_samples: torch.Tensor | int) -> torch.Tensor | int:
        """Encoder frames T' the model gives for an utterance of ``num_samples`` samples."""
        return self.encoder.output_lengths(num_frames(num_samples, self.sample_rate))

    def forward_flops(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Forward FLOPs (2 per multiply-add) of each utterance run alone: (B,) int64 for (B,) lengths in samples.

        The encoder's own count and the CTC head's. Left out: the feature front end, norms, activations,
        softmax (all small). Too short an utterance counts as padded to one encoder frame, as forward runs it.
        """
        flops, t = self.encoder.flops(num_frames(num_samples.long(), self.sample_rate))
        return flops + 2 * t * self.head.in_features * self.head.out_features

