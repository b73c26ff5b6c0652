"""The encoder seam: features in, encoder states out. ``Encoder`` is the contract every encoder keeps;
``BlockEncoder`` (Conv2d subsampling, then Transformer or Conformer blocks) and ``StreamingEncoder``
(asr.models.streaming: chunked attention, causal convolutions, caches carried between chunks) keep it.

    feats (B, T, F), frames (B,) ──Encoder──> states (B, T', d_model), lengths (B,)

T counts feature frames (10 ms each), T' encoder frames. A new encoder is one new file, a module that keeps this
contract, and its line in ENCODERS; CTCModel, the FLOP count (asr.train.cost), FSDP sharding and compiling
(asr.train.module) ask it, never its parts. Activation checkpointing is the encoder's own (``checkpoint_every``).
asr.tools.exporting traces it with torch.export: its forward must keep the batch size dynamic (no shape-specialising
branches; a Linear on a transposed tensor needs ``.contiguous()`` first).
"""

from __future__ import annotations

import importlib
import math
from typing import Protocol

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr.models.blocks import attention_mask, block_type, make_block
from asr.models.config import EncoderConfig
from asr.models.subsampling import Conv2dSubsampling, subsampled_lengths


class Encoder(Protocol):
    d_model: int  # width of the states
    factor: int  # feature frames per encoder frame

    def __call__(self, feats: torch.Tensor, frames: torch.Tensor, middle: bool = False) -> tuple[torch.Tensor, ...]:
        """(B, T, F) features and (B,) frames -> (B, T', d) states and (B,) lengths; ``middle=True`` adds the
        middle layer's states (B, T', d), which intermediate CTC reads."""

    def output_lengths(self, frames: torch.Tensor | int) -> torch.Tensor | int:
        """Encoder frames T' for T feature frames."""

    def flops(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) feature frames T -> forward FLOPs (B,) (2 per multiply-add) and encoder frames T' (B,)."""

    def units(self) -> list[nn.Module]:
        """The modules to shard (FSDP2 ``fully_shard``) and compile one by one: its blocks."""

    @property
    def middle_block(self) -> int:
        """The layer whose states ``middle=True`` returns; -1 when it has none (intermediate CTC is refused)."""


def sinusoids(length: int, channels: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(length, channels) absolute sinusoidal position codes (whisper's form), computed on ``device``: no copy
    from the host, which would wait for the device."""
    log_timescale = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-log_timescale * torch.arange(channels // 2, device=device))
    angles = torch.arange(length, device=device)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class BlockStack(nn.Module):
    """What an encoder of a subsampling (``subsampling``) and a stack of blocks (``blocks``) owes the Encoder
    protocol beyond its forward: the middle block, its FLOPs, the units to shard. BlockEncoder and
    asr.models.streaming.StreamingEncoder are two."""

    @property
    def middle_block(self) -> int:
        """The block whose output intermediate CTC reads: the last of the first half (-1: fewer than 2 blocks)."""
        return len(self.blocks) // 2 - 1

    def flops(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Subsampling and each block's own count (block.flops); norms and activations are left out (small)."""
        flops, t = self.subsampling.flops(frames)
        for block in self.blocks:
            flops = flops + block.flops(t)
        return flops, t

    def units(self) -> list[nn.Module]:
        return list(self.blocks)


class BlockEncoder(BlockStack):
    """Conv2dSubsampling (x4 or x8), absolute positions if the block type wants them, then ``cfg.n_layers``
    blocks of type ``cfg.block`` (asr.models.blocks) with a key-padding mask.

    Padded frames are masked out of attention (and zeroed before a Conformer's convolution), so an utterance's
    states do not depend on what it was batched with. ``checkpoint_every=k`` recomputes every k-th block's
    activations, and the subsampling convolutions', in the backward pass (non-reentrant); 0 turns it off.
    """

    def __init__(self, cfg: EncoderConfig, n_feats: int, checkpoint_every: int = 0):
        super().__init__()
        if checkpoint_every < 0:
            raise ValueError(f"model.checkpoint_every must be >= 0 (0 = off), got {checkpoint_every}")
        self.cfg, self.checkpoint_every = cfg, checkpoint_every
        self.d_model, self.factor = cfg.d_model, cfg.subsampling
        self.subsampling = Conv2dSubsampling(n_feats, cfg.d_model, cfg.subsampling, cfg.conv_channels,
                                             cfg.subsampling_conv == "separable")
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layers))
        self.absolute_positions = block_type(cfg.block).absolute_positions  # else the blocks encode positions

    def forward(self, feats: torch.Tensor, frames: torch.Tensor, middle: bool = False) -> tuple[torch.Tensor, ...]:
        if middle and self.middle_block < 0:
            raise ValueError(f"intermediate CTC needs at least 2 blocks, this model has {len(self.blocks)}")
        recompute = self.training and self.checkpoint_every
        if recompute:  # its conv maps are the largest activations of all
            x, lengths = checkpoint(self.subsampling, feats, frames, use_reentrant=False)  # (B, T', d)
        else:
            x, lengths = self.subsampling(feats, frames)  # (B, T', d)
        if self.absolute_positions:
            x = x + sinusoids(x.shape[1], x.shape[2], x.device).to(x.dtype)
        mask = attention_mask(lengths, x.shape[1], self.cfg.attention_window)
        keep = (torch.arange(x.shape[1], device=x.device) < lengths[:, None]).unsqueeze(-1).to(x.dtype)  # (B, T', 1)
        middle_states = None
        for i, block in enumerate(self.blocks):
            if recompute and i % self.checkpoint_every == 0:
                x = checkpoint(block, x, mask, keep, use_reentrant=False)
            else:
                x = block(x, mask, keep)
            if middle and i == self.middle_block:
                middle_states = x
        return (x, lengths, middle_states) if middle else (x, lengths)

    def output_lengths(self, frames: torch.Tensor | int) -> torch.Tensor | int:
        return subsampled_lengths(frames, self.factor)


# model.encoder.block -> "module:Class" of an encoder other than BlockEncoder (same constructor arguments),
# imported only when chosen; any other value is a block type of BlockEncoder (asr.models.blocks.BLOCKS)
ENCODERS: dict[str, str] = {}


def build_encoder(cfg: EncoderConfig, n_feats: int, checkpoint_every: int = 0) -> Encoder:
    """The encoder ``cfg`` describes, for ``n_feats`` feature bins: the one place an encoder is chosen
    (model.encoder.streaming: asr.models.streaming.StreamingEncoder)."""
    if cfg.streaming:
        from asr.models.streaming import StreamingEncoder  # here: it builds on BlockStack, of this module

        return StreamingEncoder(cfg, n_feats, checkpoint_every)
    if cfg.block in ENCODERS:
        module, name = ENCODERS[cfg.block].split(":")
        return getattr(importlib.import_module(module), name)(cfg, n_feats, checkpoint_every)
    return BlockEncoder(cfg, n_feats, checkpoint_every)
