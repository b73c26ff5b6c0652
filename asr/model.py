"""The network, in plain PyTorch (no Lightning): features -> subsampling -> encoder blocks -> CTC head.

    audio (B, n) ──FeatureExtractor──> (B, T, F) ──SpecAugment (training only)──>
    ──Conv2dSubsampling (x4 or x8)──> (B, T', d) ──Transformer or Conformer blocks (asr.blocks)──>
    LayerNorm ──Linear──> (B, T', V) ──log_softmax in fp32──> CTC log-probabilities
    (training with intermediate CTC also puts the middle block's output through the same LayerNorm and Linear)

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it.
Lengths are carried explicitly: padded frames are masked out of attention (and zeroed before
a Conformer's convolution), so an utterance's output does not depend on what it was batched with.
Size presets (tiny ~1M ... xl ~500M parameters) are YAML files in ``configs/model/``.
The model owns what follows from its shapes: ``frame_seconds``, ``encoder_frames`` and
``forward_flops`` (asr.cost asks it; each block type counts its own FLOPs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr.audio import HOP_SECONDS, FeatureConfig, FeatureExtractor, SpecAugment, num_frames
from asr.blocks import attention_mask, block_type, make_block


@dataclass
class EncoderConfig:
    """Shapes of the encoder; ``vocab_size`` includes the CTC blank (see asr.tokenizer).

    The field defaults are also ASRModule's (it asks them here), so a Python user gets these shapes.
    """

    vocab_size: int
    n_feats: int = 80  # feature bins per frame
    d_model: int = 144
    n_heads: int = 4
    n_layers: int = 4
    ff_mult: int = 4  # feed-forward width = ff_mult * d_model
    dropout: float = 0.1  # on each residual branch and inside the feed-forward
    attention_dropout: float = 0.0  # on the attention weights; > 0 leaves the fused attention kernel
    subsampling: int = 4  # 4 or 8: feature frames per encoder frame
    attention_window: int = 0  # > 0: a frame attends only to frames at most this many encoder frames away
    conv_channels: int = 0  # channels of the subsampling convolutions; 0 = d_model
    block: str = "transformer"  # a key of asr.blocks.BLOCKS: "transformer" or "conformer"
    conv_kernel: int = 31  # conformer: depthwise convolution width in encoder frames (odd)
    conv_norm: str = "layer"  # conformer: "layer" or "batch" norm after the depthwise convolution


def min_frames(factor: int) -> int:
    """Feature frames the subsampling convolutions need for one encoder frame: 7 at x4, 15 at x8."""
    return 2 * factor - 1


def subsampled_lengths(frames: torch.Tensor | int, factor: int) -> torch.Tensor | int:
    """Encoder frames T' for ``frames`` feature frames T: each stride-2, kernel-3 conv maps L -> (L - 1) // 2.

    Too short an utterance (under 7 frames at x4, 15 at x8) gets 0 encoder frames, not fewer.
    """
    for _ in range(int(math.log2(factor))):
        frames = (frames - 1) // 2
    return frames.clamp(min=0) if isinstance(frames, torch.Tensor) else max(0, frames)


def encoder_frames(num_samples: torch.Tensor | int, sample_rate: int, factor: int) -> torch.Tensor | int:
    """Encoder frames T' for ``num_samples`` samples: CTCModel.encoder_frames, for callers without a model."""
    return subsampled_lengths(num_frames(num_samples, sample_rate), factor)


class Conv2dSubsampling(nn.Module):
    """(B, T, F) -> (B, T', d_model) with log2(factor) stride-2 3x3 convolutions, no padding.

    Without padding an output frame only sees input frames inside the utterance.
    """

    def __init__(self, n_feats: int, d_model: int, factor: int, conv_channels: int = 0):
        super().__init__()
        if factor not in (4, 8):
            raise ValueError(f"model.subsampling must be 4 or 8, got {factor}")
        width = conv_channels or d_model  # the first map is (B, width, T/2, F/2): the step's largest tensor
        layers, channels, freq = [], 1, n_feats
        for _ in range(int(math.log2(factor))):
            layers += [nn.Conv2d(channels, width, kernel_size=3, stride=2), nn.ReLU()]
            channels, freq = width, (freq - 1) // 2
        # channels-last: the CPU convolution kernels skip layout conversions (1.6x at bf16, small preset)
        self.conv = nn.Sequential(*layers).to(memory_format=torch.channels_last)
        self.out = nn.Linear(width * freq, d_model)
        self.factor, self.n_feats = factor, n_feats

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a batch shorter than the convolutions' reach still gives one (masked) frame, not an error
        x = F.pad(x, (0, 0, 0, max(0, min_frames(self.factor) - x.shape[1])))
        x = self.conv(x.unsqueeze(1).contiguous(memory_format=torch.channels_last))  # (B, C, T', F')
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))  # (B, T', d)
        return x, subsampled_lengths(lengths, self.factor)

    def flops(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) feature frames T -> forward FLOPs (B,) of the convolutions and projection, encoder frames T' (B,)."""
        t, freq = frames.clamp(min=min_frames(self.factor)), self.n_feats  # forward pads up to one encoder frame
        flops = torch.zeros_like(frames)
        for conv in self.conv[::2]:  # stride 2, 3x3, no padding: 2 x (in channels x 9) per output value
            t, freq = (t - 1) // 2, (freq - 1) // 2
            flops = flops + 2 * t * freq * conv.out_channels * conv.in_channels * 3 * 3
        return flops + 2 * t * self.out.in_features * self.out.out_features, t


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """(length, channels) absolute sinusoidal position codes (whisper's form)."""
    log_timescale = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-log_timescale * torch.arange(channels // 2))
    angles = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class CTCModel(nn.Module):
    """Waveforms in, CTC log-probabilities out. The feature front end is part of the model.

    ``checkpoint_every=k`` recomputes every k-th block's activations, and the subsampling
    convolutions', in the backward pass (non-reentrant activation checkpointing); 0 turns it off.
    """

    def __init__(self, features: FeatureConfig, cfg: EncoderConfig, spec_augment: SpecAugment | None = None,
                 checkpoint_every: int = 0):
        super().__init__()
        if cfg.n_feats != features.n_feats:
            raise ValueError(f"EncoderConfig.n_feats={cfg.n_feats} but the features give {features.n_feats}")
        if checkpoint_every < 0:
            raise ValueError(f"model.checkpoint_every must be >= 0 (0 = off), got {checkpoint_every}")
        self.cfg, self.checkpoint_every = cfg, checkpoint_every
        self.features = FeatureExtractor(features)
        self.spec_augment = spec_augment or nn.Identity()
        self.subsampling = Conv2dSubsampling(cfg.n_feats, cfg.d_model, cfg.subsampling, cfg.conv_channels)
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layers))  # cfg.block: see asr.blocks
        self.absolute_positions = block_type(cfg.block).absolute_positions  # else the blocks encode positions
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, middle: bool = False) -> tuple[torch.Tensor, ...]:
        """audio (B, n) and lengths (B,) in samples -> log-probs (B, T', V) in fp32 and lengths (B,).

        ``middle=True`` adds a third output: the log-probs (B, T', V) of the middle block's output through
        the same norm and head, intermediate CTC's (Lee and Watanabe 2021). A flag of forward, not another
        method, so that FSDP2's hooks on the root module's forward still gather its parameters.
        """
        if middle and self.middle_block < 0:
            raise ValueError(f"intermediate CTC needs at least 2 blocks, this model has {len(self.blocks)}")
        feats, frames = self.features(audio, lengths)  # (B, T, F), fp32
        feats = feats.to(self.head.weight.dtype)  # bf16 when the weights are (bf16-true); autocast does the rest
        feats = self.spec_augment(feats)
        if self.training and self.checkpoint_every:  # its conv maps are the largest activations of all
            x, lengths = checkpoint(self.subsampling, feats, frames, use_reentrant=False)  # (B, T', d)
        else:
            x, lengths = self.subsampling(feats, frames)  # (B, T', d)
        if self.absolute_positions:
            x = x + sinusoids(x.shape[1], x.shape[2]).to(x.device, x.dtype)
        mask = attention_mask(lengths, x.shape[1], self.cfg.attention_window)
        keep = (torch.arange(x.shape[1], device=x.device) < lengths[:, None]).unsqueeze(-1).to(x.dtype)  # (B, T', 1)
        middle_log_probs = None
        for i, block in enumerate(self.blocks):
            if self.training and self.checkpoint_every and i % self.checkpoint_every == 0:
                x = checkpoint(block, x, mask, keep, use_reentrant=False)
            else:
                x = block(x, mask, keep)
            if middle and i == self.middle_block:
                middle_log_probs = self.log_probs(x)
        return (self.log_probs(x), lengths, middle_log_probs) if middle else (self.log_probs(x), lengths)

    @property
    def middle_block(self) -> int:
        """The block whose output intermediate CTC reads: the last of the first half (-1: fewer than 2 blocks)."""
        return len(self.blocks) // 2 - 1

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
        return HOP_SECONDS * self.cfg.subsampling

    def encoder_frames(self, num_samples: torch.Tensor | int) -> torch.Tensor | int:
        """Encoder frames T' the model gives for an utterance of ``num_samples`` samples."""
        return encoder_frames(num_samples, self.sample_rate, self.cfg.subsampling)

    def forward_flops(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Forward FLOPs (2 per multiply-add) of each utterance run alone: (B,) int64 for (B,) lengths in samples.

        Counts the matrix products and convolutions: subsampling, each block's own count (block.flops)
        and the CTC head. Left out: the feature front end, norms, activations, softmax (all small).
        Too short an utterance counts as padded to one encoder frame, as forward runs it.
        """
        flops, t = self.subsampling.flops(num_frames(num_samples.long(), self.sample_rate))
        for block in self.blocks:
            flops = flops + block.flops(t)
        return flops + 2 * t * self.head.in_features * self.head.out_features
