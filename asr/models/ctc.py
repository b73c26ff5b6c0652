"""The network of CTC, in plain PyTorch (no Lightning): features -> encoder -> CTC head.

    audio (B, n) ──FeatureExtractor──> (B, T, F) ──SpecAugment (training only)──>
    ──Encoder (asr.models.encoder: Conv2d subsampling x4 or x8, Transformer or Conformer blocks)──> (B, T', d)
    ──LayerNorm ──Linear──> (B, T', V) ──log_softmax in fp32──> CTC log-probabilities
    (training with intermediate CTC also puts the middle block's output through the same LayerNorm and Linear)

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it. Lengths are carried
explicitly, so an utterance's output does not depend on what it was batched with. The model owns what follows
from its shapes: ``frame_seconds``, ``encoder_frames`` (asr.models.network) and ``forward_flops`` (asr.train.cost
asks it; the encoder counts its own FLOPs). ``vocab_size`` includes the CTC blank (see asr.tokenizer).
"""

from __future__ import annotations

import torch
from torch import nn

from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.network import EncoderNetwork
from asr.models.specaugment import SpecAugment


class CTCModel(EncoderNetwork):
    """Waveforms in, CTC log-probabilities out. The feature front end is part of the model.

    ``checkpoint_every=k`` recomputes every k-th block's activations in the backward pass (the encoder's
    activation checkpointing); 0 turns it off.
    """

    token_rows = ("head.weight", "head.bias")  # the weights with one row per token (a new vocabulary renews them)

    def __init__(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int,
                 spec_augment: SpecAugment | None = None, checkpoint_every: int = 0):
        super().__init__(features, encoder, spec_augment, checkpoint_every)
        self.head = nn.Linear(self.encoder.d_model, vocab_size)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, middle: bool = False,
                statistics: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """audio (B, n) and lengths (B,) in samples -> log-probs (B, T', V) in fp32 and lengths (B,).

        ``middle=True`` adds a third output: the log-probs (B, T', V) of the middle block's output through
        the same norm and head, intermediate CTC's (Lee and Watanabe 2021). A flag of forward, not another
        method, so that FSDP2's hooks on the root module's forward still gather its parameters. ``statistics``
        (B, 2): the samples whose frames alone give the features' normalisation (FeatureExtractor).
        """
        x, lengths, *rest = self.encode(audio, lengths, middle, statistics)  # (B, T', d)
        if middle:
            return self.log_probs(x), lengths, self.log_probs(rest[0])
        return self.log_probs(x), lengths

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder states (B, T', d) -> CTC log-probabilities (B, T', V) in fp32."""
        return self.head(self.norm(x)).float().log_softmax(dim=-1)

    frames = log_probs  # what every network names its encoder states' frames (asr.models.transducer's are others)

    def forward_flops(self, num_samples: torch.Tensor, num_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Forward FLOPs (2 per multiply-add) of each utterance run alone: (B,) int64 for (B,) lengths in samples.

        The encoder's own count and the CTC head's (``num_tokens``, the targets, change neither). Left out: the
        feature front end, norms, activations, softmax (all small). Too short an utterance counts as padded to one
        encoder frame, as forward runs it.
        """
        flops, t = self.encoder_flops(num_samples)
        return flops + 2 * t * self.head.in_features * self.head.out_features
