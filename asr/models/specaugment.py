"""SpecAugment: frequency and time masks and vocal tract length perturbation of the features, in training only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torchaudio.functional as AF
from torch import nn


@dataclass(frozen=True)
class SpecAugmentConfig:
    """SpecAugment in training (``--model.spec_augment.*``; ``--model.spec_augment null`` turns it all off).

    Args:
        freq_masks: frequency masks per utterance.
        freq_width: widest frequency mask, in feature bins.
        time_masks: time masks per utterance.
        time_width: widest time mask, as a fraction of the batch's frames.
        freq_warp: w in [0, 0.5): w > 0 stretches each training utterance's frequency axis by a factor from
            [1 - w, 1 + w] (vocal tract length perturbation); 0 = off.
        freq_warp_jitter: j in [0, 0.5): j > 0 also moves the warp's knots near the first three formants each by
            its own factor from [1 - j, 1 + j], so that formants scale unevenly; 0 = off.
    """

    freq_masks: int = 2
    freq_width: int = 15
    time_masks: int = 2
    time_width: float = 0.05
    freq_warp: float = 0.15  # other vocal tracts, on the features, instead of data.augmentation.pitch_prob's waveform
    # pitch shift: dev as good at a fraction of the data worker's CPU (docs/benchmarks.md, 2026-11-24 morning)
    freq_warp_jitter: float = 0.1  # formants scaled unevenly too: lower dev loss for two seeds of three
    # (docs/benchmarks.md, 2026-11-24 noon)

    def __post_init__(self):
        for name in ("freq_warp", "freq_warp_jitter"):
            if not 0.0 <= getattr(self, name) < 0.5:
                raise ValueError(f"model.spec_augment.{name} must be in [0, 0.5), got {getattr(self, name)}")

    @property
    def warps(self) -> bool:
        return bool(self.freq_warp or self.freq_warp_jitter)


class SpecAugment(nn.Module):
    """Frequency and time masks (torchaudio's), different for each utterance; only in training.

    ``time_width`` is the largest time mask as a fraction of the batch's frames. ``freq_warp`` = w > 0
    first warps each utterance's frequency axis by a factor a drawn from [1 - w, 1 + w] (vocal tract length
    perturbation, Jaitly and Hinton 2013): what was at f Hz moves to a * f, piecewise linearly so that the
    top bin stays. It stretches formants and whatever harmonics the bins resolve alike, on the normalised
    features: a cheap stand-in for other vocal tracts. ``freq_warp_jitter`` = j > 0 also moves the warp's
    knots near the formants (``jitter_knots``: ``JITTER_KNOTS_HZ`` up to half the top bin's Hz) each by its own
    further factor from [1 - j, 1 + j], piecewise linearly between them, so that F1, F2 and F3 scale unevenly,
    as vocal tracts of other shapes, not only of other lengths, do. ``bin_hz`` (``FeatureConfig.bin_hz()``)
    places the bins; only the warp needs it.
    """

    WARP_KNEE = 0.8  # output Hz up to this fraction of the top bin's (times min(1, a)) come from f / a; then linear
    JITTER_KNOTS_HZ = (400.0, 1000.0, 2000.0, 3500.0)  # between and around the first three formants

    def __init__(self, config: SpecAugmentConfig, bin_hz: torch.Tensor | None = None):
        super().__init__()
        if config.warps and bin_hz is None:
            raise ValueError("SpecAugment: freq_warp needs the bins' frequencies (bin_hz)")
        self.freq_masks, self.freq_width = config.freq_masks, config.freq_width
        self.time_masks, self.time_width = config.time_masks, config.time_width
        self.freq_warp, self.freq_warp_jitter = config.freq_warp, config.freq_warp_jitter
        # plain fp32 attributes, not buffers: not in checkpoints, and not cast to bf16 with the weights
        self.bin_hz = None if bin_hz is None else bin_hz.float()
        self.jitter_knots = None if bin_hz is None else torch.tensor(  # (K,) Hz: the knots freq_warp_jitter moves
            [hz for hz in self.JITTER_KNOTS_HZ if hz <= self.bin_hz[-1] / 2])

    def source_hz(self, hz: torch.Tensor, factors: torch.Tensor, jitters: torch.Tensor | None = None) -> torch.Tensor:
        """(F,) ascending bin Hz, (B,) warp factors, (B, K) factors of the K ``jitter_knots`` or None -> (B, F) the
        Hz each output bin takes its value from.

        As (output Hz, source Hz) points, the map is piecewise linear from (0, 0) through (a * j_k * f_k, f_k)
        for each jitter knot f_k and (knee, knee / a) to (top, top): without jitters, f / a up to the knee, then
        a line to the top bin.
        """
        top, a = hz[-1], factors[:, None]
        knee = self.WARP_KNEE * top * a.clamp(max=1.0)  # (B, 1) output Hz where the slope changes
        knots = hz.new_zeros(0) if jitters is None else self.jitter_knots.to(hz)
        jitters = hz.new_ones(len(a), 0) if jitters is None else jitters
        zero, end = hz.new_zeros(len(a), 1), top.expand(len(a), 1)
        # knot k goes to a * j_k * f_k; sorted apart, as a monotone map must be, should two cross
        inputs = torch.cat([zero, knots.expand(len(a), -1), knee / a, end], 1).sort(1).values
        outputs = torch.cat([zero, knots * a * jitters, knee, end], 1).sort(1).values
        queries = hz.expand(len(a), -1).contiguous()
        hi = torch.searchsorted(outputs, queries).clamp(1, outputs.shape[1] - 1)
        (x0, x1), (y0, y1) = ((v.gather(1, hi - 1), v.gather(1, hi)) for v in (inputs, outputs))
        return (x0 + (queries - y0) * (x1 - x0) / (y1 - y0).clamp(min=1e-3)).clamp(hz[0], top)

    def warp(self, feats: torch.Tensor, factors: torch.Tensor, jitters: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, F) features, (B,) warp factors, (B, K) knot factors or None -> (B, T, F): each bin interpolated at
        its ``source_hz``."""
        if self.bin_hz.device != feats.device:  # moved once: a copy from the host each step would wait for the device
            self.bin_hz, self.jitter_knots = self.bin_hz.to(feats.device), self.jitter_knots.to(feats.device)
        hz = self.bin_hz  # (F,) ascending
        jitters = None if jitters is None else jitters.float().to(feats.device)
        source = self.source_hz(hz, factors.float().to(feats.device), jitters)
        hi = torch.searchsorted(hz, source.contiguous()).clamp(1, hz.numel() - 1)  # (B, F)
        lo = hi - 1
        weight = ((source - hz[lo]) / (hz[hi] - hz[lo])).to(feats.dtype)[:, None, :]  # (B, 1, F)
        below, over = (torch.take_along_dim(feats, i[:, None, :], 2) for i in (lo, hi))
        return below * (1 - weight) + over * weight

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B, T, F); masked values are 0, the normalised mean."""
        if not self.training:
            return feats
        if self.freq_warp or self.freq_warp_jitter:
            factors = 1.0 + self.freq_warp * (2 * torch.rand(feats.shape[0], device=feats.device) - 1)
            jitters = None
            if self.freq_warp_jitter:
                draws = torch.rand(feats.shape[0], len(self.jitter_knots), device=feats.device)
                jitters = 1.0 + self.freq_warp_jitter * (2 * draws - 1)
            feats = self.warp(feats, factors, jitters)
        x = feats.transpose(1, 2).unsqueeze(1)  # (B, 1, F, T): torchaudio's (..., freq, time)
        for _ in range(self.freq_masks):
            x = AF.mask_along_axis_iid(x, self.freq_width, 0.0, axis=2)
        time_param = max(1, int(self.time_width * feats.shape[1]))
        for _ in range(self.time_masks):
            x = AF.mask_along_axis_iid(x, time_param, 0.0, axis=3)
        return x.squeeze(1).transpose(1, 2)
