"""Conv2d subsampling: (B, T, F) feature frames -> (B, T', d) encoder frames, x4 or x8 in time; each further
stride-2 convolution after the first is full, or depthwise-separable (FastConformer's, Rekesh et al. 2023).

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.features import num_frames


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

    Without padding an output frame only sees input frames inside the utterance. ``separable``: the
    convolutions after the first are depthwise (3x3, one filter per channel) then pointwise (1x1), about
    9 / width of a full convolution's FLOPs: at 8x with 256 channels the front end costs little beside the blocks.
    """

    def __init__(self, n_feats: int, d_model: int, factor: int, conv_channels: int = 0, separable: bool = False):
        super().__init__()
        if factor not in (4, 8):
            raise ValueError(f"model.encoder.subsampling must be 4 or 8, got {factor}")
        width = conv_channels or d_model  # the first map is (B, width, T/2, F/2): the step's largest tensor
        layers, channels, freq = [], 1, n_feats
        for _ in range(int(math.log2(factor))):
            if separable and channels > 1:
                layers += [nn.Conv2d(channels, channels, kernel_size=3, stride=2, groups=channels),
                           nn.Conv2d(channels, width, kernel_size=1)]
            else:
                layers.append(nn.Conv2d(channels, width, kernel_size=3, stride=2))
            layers.append(nn.ReLU())
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
        for conv in (layer for layer in self.conv if isinstance(layer, nn.Conv2d)):
            if conv.stride == (2, 2):  # 3x3, no padding: the map shrinks
                t, freq = (t - 1) // 2, (freq - 1) // 2
            per_output = conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]
            flops = flops + 2 * t * freq * conv.out_channels * per_output  # 2 per multiply-add
        return flops + 2 * t * self.out.in_features * self.out.out_features, t
