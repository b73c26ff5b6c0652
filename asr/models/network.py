"""What every objective's network shares: the feature front end, SpecAugment and the encoder, and what follows
from their shapes. A network (asr.models.ctc.CTCModel, asr.models.transducer.TransducerModel) adds its objective's
layers on top and owns their FLOPs.

    audio (B, n) ──FeatureExtractor──> (B, T, F) ──SpecAugment (training only)──>
    ──Encoder (asr.models.encoder)──> (B, T', d) ──LayerNorm──> the objective's layers

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it.
"""

from __future__ import annotations

import torch
from torch import nn

from asr.models.config import EncoderConfig
from asr.models.encoder import build_encoder
from asr.models.features import HOP_SECONDS, FeatureConfig, FeatureExtractor, num_frames
from asr.models.specaugment import SpecAugment


class EncoderNetwork(nn.Module):
    """Features, SpecAugment, encoder and the encoder's final LayerNorm (``norm``), in that order of parameters (an
    optimizer's state in a checkpoint is by position). ``checkpoint_every=k`` recomputes every k-th block's
    activations in the backward pass (the encoder's activation checkpointing); 0 turns it off."""

    def __init__(self, features: FeatureConfig, encoder: EncoderConfig, spec_augment: SpecAugment | None = None,
                 checkpoint_every: int = 0):
        super().__init__()
        self.features = FeatureExtractor(features)
        self.spec_augment = spec_augment or nn.Identity()
        self.encoder = build_encoder(encoder, features.n_feats, checkpoint_every)
        self.norm = nn.LayerNorm(self.encoder.d_model)

    def encode(self, audio: torch.Tensor, lengths: torch.Tensor, middle: bool = False,
               statistics: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """audio (B, n) and lengths (B,) in samples -> encoder states (B, T', d) (not normed) and lengths (B,); with
        ``middle``, the middle block's states (B, T', d) too. ``statistics`` (B, 2): the samples whose frames alone
        give the features' normalisation (FeatureExtractor). Call it from forward only: FSDP2 gathers the
        parameters in the root module's forward hooks."""
        feats, frames = self.features(audio, lengths, statistics)  # (B, T, F), fp32
        feats = feats.to(self.norm.weight.dtype)  # bf16 when the weights are (bf16-true); autocast does the rest
        return self.encoder(self.spec_augment(feats), frames, middle)  # (B, T', d)

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

    def encoder_flops(self, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's forward FLOPs (B,) and encoder frames T' (B,) for (B,) lengths in samples (asr.models.encoder:
        the front end, norms, activations and softmax are left out, all small). Too short an utterance counts as
        padded to one encoder frame, as forward runs it."""
        return self.encoder.flops(num_frames(num_samples.long(), self.sample_rate))
