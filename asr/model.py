"""The network, in plain PyTorch (no Lightning): features -> subsampling -> Transformer -> CTC head.

    audio (B, n) ──FeatureExtractor──> (B, T, F) ──SpecAugment (training only)──>
    ──Conv2dSubsampling (x4 or x8)──> (B, T', d) ──pre-LN Transformer blocks──> LayerNorm
    ──Linear──> (B, T', V) ──log_softmax in fp32──> CTC log-probabilities

T counts feature frames (10 ms each) before subsampling, T' encoder frames after it.
Lengths are carried explicitly: padded frames are masked out of attention, so an
utterance's output does not depend on what it was batched with.
Size presets (tiny ~1M ... xl ~500M parameters) are YAML files in ``configs/model/``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr.audio import FeatureConfig, FeatureExtractor, SpecAugment, num_frames

LOCAL_BLOCK = 32  # query frames per block of local attention (attention_window > 0)
# Up to this many encoder frames (10 s at x4) local attention is computed on the whole T' x T'
# mask: measured on this CPU, blocks pay off only above ~250 frames (at 480: half the time).
LOCAL_DENSE_FRAMES = 256


@dataclass
class EncoderConfig:
    """Shapes of the encoder; ``vocab_size`` includes the CTC blank (see asr.tokenizer)."""

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
        # channels-last weights and input: this CPU's convolution kernels then skip their layout
        # conversions; at bf16 the small preset's convolutions ran 1.6x faster, forward and backward
        self.conv = nn.Sequential(*layers).to(memory_format=torch.channels_last)
        self.out = nn.Linear(width * freq, d_model)
        self.factor = factor

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # A batch shorter than the convolutions' reach still gives one (masked) frame, not an error.
        x = F.pad(x, (0, 0, 0, max(0, min_frames(self.factor) - x.shape[1])))
        x = self.conv(x.unsqueeze(1).contiguous(memory_format=torch.channels_last))  # (B, C, T', F')
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))  # (B, T', d)
        return x, subsampled_lengths(lengths, self.factor)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout whose masks come 8 at a time from 64-bit random integers (p rounded to 1/256).

    On this CPU, ``F.dropout`` draws one float per element (``bernoulli_``, one thread) and took a
    quarter of a training step; 16-bit masks, 4 to a draw, still spent 69 of a base step's 394 ms
    of forward drawing, and drawing is what activation checkpointing repeats. The comparison writes
    the mask straight in x's dtype (3x faster than converting a bool mask), and that mask, not a
    bool one, is saved for backward: ``torch.where`` on a bool mask ran 1.6x slower.
    """
    if not training or p == 0.0:
        return x
    n = x.numel()
    bits = torch.empty((n + 7) // 8, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    keep = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ge(bits.view(torch.int8)[:n].view(x.shape), round(p * 256) - 128, out=keep)  # P(1) = 1 - p
    return x * keep.mul_(1.0 / (1.0 - p))


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """(length, channels) absolute sinusoidal position codes (whisper's form)."""
    log_timescale = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-log_timescale * torch.arange(channels // 2))
    angles = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def attention_mask(lengths: torch.Tensor, frames: int, window: int = 0) -> torch.Tensor:
    """True where a query frame may attend to a key frame: keys inside the utterance and, with
    ``window`` > 0, at most ``window`` frames away.

    Global attention: a key-padding mask (B, 1, 1, T'). Local attention over up to
    LOCAL_DENSE_FRAMES frames (and always under torch.export): (B, 1, T', T'). Longer: a mask
    per block of LOCAL_BLOCK query frames against the keys they can reach, (B, blocks, 1,
    LOCAL_BLOCK, LOCAL_BLOCK + 2 window), so Block.attention computes blocks x LOCAL_BLOCK x
    (LOCAL_BLOCK + 2w) scores instead of T'^2.
    """
    positions = torch.arange(frames, device=lengths.device)
    if window == 0:
        return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T')
    # torch.export: one graph for every length, and blocks would tie it to its example's count of them
    dense = torch.compiler.is_exporting() or frames <= LOCAL_DENSE_FRAMES
    if dense:
        queries, keys = positions[None, :], positions[None, :]  # one block of all frames: (1, T')
    else:
        blocks = -(-frames // LOCAL_BLOCK)
        queries = torch.arange(blocks * LOCAL_BLOCK, device=lengths.device).view(blocks, LOCAL_BLOCK)
        keys = queries[:, :1] - window + torch.arange(LOCAL_BLOCK + 2 * window, device=lengths.device)  # (blocks, span)
    near = (queries[:, :, None] - keys[:, None, :]).abs() <= window  # (blocks, queries, span)
    inside = (keys >= 0) & (keys[None] < lengths[:, None, None])  # (B, blocks, span)
    # A padded query far past the end would see no key at all, and SDPA would give NaN,
    # which then leaks through zero attention weights (0 * NaN); let each frame see itself.
    mask = (near & inside[:, :, None, :]) | (queries[:, :, None] == keys[:, None, :])
    return mask if dense else mask[:, :, None]  # (B, 1, T', T') or (B, blocks, 1, LOCAL_BLOCK, span)


def local_blocks(x: torch.Tensor, blocks: int, span: int) -> torch.Tensor:
    """(B, H, T', dh) keys or values -> (B * blocks, H, span, dh): block i holds frames
    [i * LOCAL_BLOCK - w, i * LOCAL_BLOCK + LOCAL_BLOCK + w), zero outside the utterance."""
    b, h, t, dh = x.shape
    window = (span - LOCAL_BLOCK) // 2
    x = F.pad(x, (0, 0, 0, blocks * LOCAL_BLOCK - t))
    if window <= LOCAL_BLOCK:  # each block's frames between its neighbours' edges: slices, not unfold,
        x = x.view(b, h, blocks, LOCAL_BLOCK, dh)  # whose backward took 8% of a bf16 base step
        before = F.pad(x[:, :, :-1, LOCAL_BLOCK - window:], (0, 0, 0, 0, 1, 0))  # (B, H, n, w, dh)
        after = F.pad(x[:, :, 1:, :window], (0, 0, 0, 0, 0, 1))
        return torch.cat([before, x, after], dim=3).transpose(1, 2).reshape(b * blocks, h, span, dh)
    x = F.pad(x, (0, 0, window, window)).unfold(2, span, LOCAL_BLOCK)  # (B, H, n, dh, span)
    return x.permute(0, 2, 1, 4, 3).reshape(b * blocks, h, span, dh)


class Block(nn.Module):
    """Pre-LN Transformer block: x + attn(LN(x)), then x + ff(LN(x))."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"model.d_model ({cfg.d_model}) must be divisible by model.n_heads ({cfg.n_heads})")
        self.n_heads, self.dropout, self.attention_dropout = cfg.n_heads, cfg.dropout, cfg.attention_dropout
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff_in = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)
        self.ff_out = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T', d); mask from attention_mask, True where a query may attend to a key."""
        b, t, d = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, d // self.n_heads)
        y = self.attention(qkv.permute(2, 0, 3, 1, 4), mask)  # (B, H, T', d/H)
        y = self.proj(y.transpose(1, 2).reshape(b, t, d).to(qkv.dtype))
        x = x + dropout(y, self.dropout, self.training)
        y = dropout(F.gelu(self.ff_in(self.ff_norm(x))), self.dropout, self.training)  # (B, T', ff_mult * d)
        return x + dropout(self.ff_out(y), self.dropout, self.training)

    def attention(self, qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """qkv (3, B, H, T', d/H) and a mask of attention_mask -> (B, H, T', d/H).

        On CPU in fp32 whatever the precision: there the attention kernel's backward ran 2x
        slower in bf16 than in fp32.
        """
        cpu = qkv.device.type == "cpu"
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            q, k, v = qkv.float() if cpu else qkv
            p = self.attention_dropout if self.training else 0.0
            if mask.dim() == 4:  # global attention, or local over few frames
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            b, h, t, dh = q.shape
            blocks, span = mask.shape[1], mask.shape[-1]  # local attention: per block of LOCAL_BLOCK queries
            q = F.pad(q, (0, 0, 0, blocks * LOCAL_BLOCK - t)).reshape(b, h, blocks, LOCAL_BLOCK, dh)
            q = q.transpose(1, 2).reshape(b * blocks, h, LOCAL_BLOCK, dh)
            y = F.scaled_dot_product_attention(q, local_blocks(k, blocks, span), local_blocks(v, blocks, span),
                                               attn_mask=mask.flatten(0, 1), dropout_p=p)  # (B * blocks, H, ., dh)
            y = y.view(b, blocks, h, LOCAL_BLOCK, dh).transpose(1, 2).reshape(b, h, blocks * LOCAL_BLOCK, dh)
            return y[:, :, :t]


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
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio (B, n) and lengths (B,) in samples -> log-probs (B, T', V) in fp32 and lengths (B,)."""
        feats, frames = self.features(audio, lengths)  # (B, T, F), fp32
        feats = feats.to(self.head.weight.dtype)  # bf16 when the weights are (bf16-true); autocast does the rest
        feats = self.spec_augment(feats)
        if self.training and self.checkpoint_every:  # its conv maps are the largest activations of all
            x, lengths = checkpoint(self.subsampling, feats, frames, use_reentrant=False)  # (B, T', d)
        else:
            x, lengths = self.subsampling(feats, frames)  # (B, T', d)
        x = x + sinusoids(x.shape[1], x.shape[2]).to(x.device, x.dtype)
        mask = attention_mask(lengths, x.shape[1], self.cfg.attention_window)
        for i, block in enumerate(self.blocks):
            if self.training and self.checkpoint_every and i % self.checkpoint_every == 0:
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        logits = self.head(self.norm(x))  # (B, T', V)
        return logits.float().log_softmax(dim=-1), lengths

    def encoder_frames(self, num_samples: int) -> int:
        """Encoder frames T' the model gives for an utterance of ``num_samples`` samples."""
        return subsampled_lengths(num_frames(num_samples, self.features.config.sample_rate), self.cfg.subsampling)
