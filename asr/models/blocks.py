"""Encoder blocks behind one seam: ``make_block(cfg)`` builds the block ``cfg.block`` names.

A block type is one class in BLOCKS with this contract:

    block(x (B, T', d), mask from attention_mask, keep (B, T', 1)) -> (B, T', d)
    block.flops(frames (B,) encoder frames T') -> (B,) int64 forward FLOPs of one block
    absolute_positions: whether the encoder adds sinusoids to its input before the first block

``keep`` is 1 on frames inside the utterance, 0 on padding, in x's dtype. Both types share
``self_attention``: SDPA with a key-padding mask (local windows, attention dropout, fp32 on CPU), or, where
``attention_path`` says so (CUDA, fp16/bf16, no attention dropout), ``varlen_attention``: Flash Attention's
varlen_attn over the padded batch without a mask, global or windowed, which a masked SDPA call cannot reach.

- TransformerBlock: pre-LN, x + attn(LN(x)), then x + ff(LN(x)) with GELU (the original ``Block``;
  its parameter names are unchanged, so older checkpoints load as they are).
- ConformerBlock: x + ff/2, x + rotary attn, x + conv, x + ff/2, LayerNorm (Gulati et al. 2020).
  Relative positions are rotary (RoPE): q and k are rotated by their frame index, so scores depend
  only on the distance. Unlike Transformer-XL's bias it adds no T' x T' term, so the fused SDPA kernel
  and the blocked local attention (rotation happens before blocking) work unchanged.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.varlen import varlen_attn

from asr.models.config import EncoderConfig

LOCAL_BLOCK = 32  # query frames per block of local attention (attention_window > 0)
LOCAL_DENSE_FRAMES = 256  # 10 s at x4: up to here one dense T' x T' mask beat blocks of queries on our CPU
ROTARY_BASE = 10000.0  # the longest rotary wavelength, in frames (RoFormer's value)


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


def attention_mask(lengths: torch.Tensor, frames: int, window: int = 0) -> torch.Tensor:
    """True where a query frame may attend to a key frame: keys inside the utterance and, with
    ``window`` > 0, at most ``window`` frames away.

    Global attention: a key-padding mask (B, 1, 1, T'). Local attention over up to
    LOCAL_DENSE_FRAMES frames (and always under torch.export): (B, 1, T', T'). Longer: a mask
    per block of LOCAL_BLOCK query frames against the keys they can reach, (B, blocks, 1,
    LOCAL_BLOCK, LOCAL_BLOCK + 2 window), so ``attention`` computes blocks x LOCAL_BLOCK x
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
    # each frame sees itself: a padded query with no key gets NaN from SDPA, which leaks through 0 weights
    mask = (near & inside[:, :, None, :]) | (queries[:, :, None] == keys[:, None, :])
    return mask if dense else mask[:, :, None]  # (B, 1, T', T') or (B, blocks, 1, LOCAL_BLOCK, span)


def local_blocks(x: torch.Tensor, blocks: int, span: int) -> torch.Tensor:
    """(B, H, T', dh) keys or values -> (B * blocks, H, span, dh): block i holds frames
    [i * LOCAL_BLOCK - w, i * LOCAL_BLOCK + LOCAL_BLOCK + w), zero outside the utterance."""
    b, h, t, dh = x.shape
    window = (span - LOCAL_BLOCK) // 2
    x = F.pad(x, (0, 0, 0, blocks * LOCAL_BLOCK - t))
    if window <= LOCAL_BLOCK:  # the neighbours' edges by slicing: unfold's backward took 8% of a bf16 base step
        x = x.view(b, h, blocks, LOCAL_BLOCK, dh)
        before = F.pad(x[:, :, :-1, LOCAL_BLOCK - window:], (0, 0, 0, 0, 1, 0))  # (B, H, n, w, dh)
        after = F.pad(x[:, :, 1:, :window], (0, 0, 0, 0, 0, 1))
        return torch.cat([before, x, after], dim=3).transpose(1, 2).reshape(b * blocks, h, span, dh)
    x = F.pad(x, (0, 0, window, window)).unfold(2, span, LOCAL_BLOCK)  # (B, H, n, dh, span)
    return x.permute(0, 2, 1, 4, 3).reshape(b * blocks, h, span, dh)


def rotate(x: torch.Tensor, turn: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rotary positions of (B, H, T', dh) queries or keys: channel pair (i, i + dh/2) of frame t turns by
    t * ROTARY_BASE^(-2i/dh) radians, so q_t . k_s depends on t - s only. ``turn``: the cos and sin of ``rotation``
    for x's frames (a stream's); None: frames t = 0 .. T' - 1, angles in float32 (the offline blocks')."""
    t, half = x.shape[-2], x.shape[-1] // 2
    if turn is None:
        inv = ROTARY_BASE ** -(torch.arange(half, device=x.device, dtype=torch.float32) / half)
        angles = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv  # (T', dh/2)
        turn = angles.cos(), angles.sin()
    cos, sin = turn[0].to(x.dtype), turn[1].to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def rotation(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, T', head_dim / 2) fp32 of the rotary angles of frames at ``positions`` (B, T'), for
    ``rotate``: taken in float64 modulo 2 pi, because a stream's t grows past what float32 angles hold exactly (ulp
    0.008 rad at an hour of 40 ms frames). Computed once for all the layers of a forward."""
    half = head_dim // 2
    inv = ROTARY_BASE ** -(torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = (positions.double()[:, None, :, None] * inv.double()).remainder(2 * math.pi)  # (B, 1, T', dh/2)
    return angles.cos().float(), angles.sin().float()


_VARLEN_DEVICES: dict[int, bool] = {}  # CUDA device index -> varlen_available


@torch.compiler.assume_constant_result
def varlen_available(device: torch.device) -> bool:
    """Whether varlen_attn's Flash Attention kernels run on this CUDA device: an NVIDIA GPU of compute
    capability 8.0 (Ampere) or later, in a build with Flash Attention."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _VARLEN_DEVICES:
        _VARLEN_DEVICES[index] = (torch.version.hip is None and torch.backends.cuda.is_flash_attention_available()
                                  and torch.cuda.get_device_capability(index) >= (8, 0))
    return _VARLEN_DEVICES[index]


def attention_path(device: torch.device, dtype: torch.dtype, head_dim: int, dropout_p: float) -> str:
    """'varlen' (varlen_attention) where Flash Attention can run, else 'sdpa' (masked SDPA, as on CPU).

    Flash needs CUDA, fp16 or bf16 and a head dimension that is a multiple of 8 up to 256; varlen_attn
    has no dropout (so attention dropout in training stays on SDPA); torch.export keeps SDPA, whose
    graph runs on every device.
    """
    fast = (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0
            and head_dim % 8 == 0 and head_dim <= 256 and not torch.compiler.is_exporting())
    return "varlen" if fast and varlen_available(device) else "sdpa"


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                     window: int = 0) -> torch.Tensor:
    """(B, H, T', dh) q, k, v and (B,) lengths in encoder frames -> (B, H, T', dh) through varlen_attn.

    The padded batch stays as it is, flattened to (B * T', H, dh): each utterance is two of varlen_attn's
    sequences, its frames [0, length) and its padding, so frames see only frames and padding only padding
    (no empty row, no NaN; padded outputs are the caller's to ignore, as with SDPA). Shapes come from
    T', never from the lengths' values: no host sync. seqused_k, which would skip the padding, raises under
    autograd ("inference-only"). window_size (w, w) keeps keys at most w frames away, as attention_mask does.
    """
    b, h, t, dh = q.shape
    starts = torch.arange(b + 1, device=q.device, dtype=torch.int32) * t  # (B + 1,): where each utterance begins
    ends = starts[:-1] + lengths.to(torch.int32)  # (B,): where its padding begins
    cu_seq = torch.cat([torch.stack([starts[:-1], ends], dim=1).flatten(), starts[-1:]])  # (2B + 1,)
    # contiguous: varlen_attn's cuDNN backend (global attention, T' > 128, sm90/sm100) is untried on strided inputs
    q, k, v = (x.transpose(1, 2).reshape(b * t, h, dh).contiguous() for x in (q, k, v))  # (B * T', H, dh)
    y = varlen_attn(q, k, v, cu_seq, cu_seq, t, t, window_size=(window, window) if window else (-1, -1))
    return y.view(b, t, h, dh).transpose(1, 2)  # (B, H, T', dh)


def attention(qkv: torch.Tensor, mask: torch.Tensor, dropout_p: float = 0.0, rotary: bool = False,
              keep: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """qkv (3, B, H, T', d/H) and a mask of attention_mask -> (B, H, T', d/H); ``rotary`` rotates q and k first.

    With ``keep`` (B, T', 1) and ``window`` (as in the mask), attention_path may choose varlen_attention,
    which ignores the mask. On CPU in fp32 whatever the precision: there the attention kernel's backward
    ran 2x slower in bf16 than in fp32.
    """
    cpu = qkv.device.type == "cpu"
    with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
        q, k, v = qkv.float() if cpu else qkv
        if rotary:
            q, k = rotate(q), rotate(k)
        if keep is not None and attention_path(q.device, q.dtype, q.shape[-1], dropout_p) == "varlen":
            return varlen_attention(q, k, v, keep[..., 0].gt(0).sum(1, dtype=torch.int32), window)
        if mask.dim() == 4:  # global attention, or local over few frames
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        b, h, t, dh = q.shape
        blocks, span = mask.shape[1], mask.shape[-1]  # local attention: per block of LOCAL_BLOCK queries
        q = F.pad(q, (0, 0, 0, blocks * LOCAL_BLOCK - t)).reshape(b, h, blocks, LOCAL_BLOCK, dh)
        q = q.transpose(1, 2).reshape(b * blocks, h, LOCAL_BLOCK, dh)
        y = F.scaled_dot_product_attention(q, local_blocks(k, blocks, span), local_blocks(v, blocks, span),
                                           attn_mask=mask.flatten(0, 1), dropout_p=dropout_p)  # (B * blocks, H, ., dh)
        y = y.view(b, blocks, h, LOCAL_BLOCK, dh).transpose(1, 2).reshape(b, h, blocks * LOCAL_BLOCK, dh)
        return y[:, :, :t]


def self_attention(block: nn.Module, x: torch.Tensor, mask: torch.Tensor, rotary: bool = False,
                   keep: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head self-attention of normed x (B, T', d) through ``block.qkv`` and ``block.proj`` -> (B, T', d);
    ``keep`` (B, T', 1) lets ``attention`` take the varlen path."""
    b, t, d = x.shape
    qkv = block.qkv(x).view(b, t, 3, block.n_heads, d // block.n_heads)
    p = block.attention_dropout if block.training else 0.0
    y = attention(qkv.permute(2, 0, 3, 1, 4), mask, p, rotary, keep, block.window)  # (B, H, T', d/H)
    return block.proj(y.transpose(1, 2).reshape(b, t, d).to(qkv.dtype))


def attention_flops(frames: torch.Tensor, d_model: int, window: int) -> torch.Tensor:
    """q k^T and weights @ v: 2 * 2 * T' * keys * d. A frame attends to T' keys, or to at most 2w + 1 with a
    window: FLOPs the model needs, though the dense-mask kernel still computes every score and masks the rest."""
    keys = frames.clamp(max=2 * window + 1) if window else frames
    return 2 * 2 * frames * keys * d_model


def check_heads(cfg: EncoderConfig) -> None:
    for name in ("d_model", "n_heads", "n_layers", "ff_mult"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"model.encoder.{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"model.encoder.d_model ({cfg.d_model}) must be divisible by model.encoder.n_heads ({cfg.n_heads})")


class TransformerBlock(nn.Module):
    """Pre-LN Transformer block: x + attn(LN(x)), then x + ff(LN(x)); absolute sinusoids at the input."""

    absolute_positions = True

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        check_heads(cfg)
        self.n_heads, self.dropout, self.attention_dropout = cfg.n_heads, cfg.dropout, cfg.attention_dropout
        self.window = cfg.attention_window
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model)
        self.ff_in = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)
        self.ff_out = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T', d); mask from attention_mask; ``keep`` (B, T', 1) lets attention take the varlen path."""
        x = x + dropout(self_attention(self, self.attn_norm(x), mask, keep=keep), self.dropout, self.training)
        y = dropout(F.gelu(self.ff_in(self.ff_norm(x))), self.dropout, self.training)  # (B, T', ff_mult * d)
        return x + dropout(self.ff_out(y), self.dropout, self.training)

    def flops(self, frames: torch.Tensor) -> torch.Tensor:
        """Forward FLOPs (2 per multiply-add) of qkv, proj, feed-forward and attention for (B,) encoder frames."""
        d, ff = self.proj.in_features, self.ff_in.out_features
        return 2 * frames * (3 * d * d + d * d + 2 * d * ff) + attention_flops(frames, d, self.window)


class FeedForward(nn.Module):
    """LN -> Linear -> SiLU -> dropout -> Linear -> dropout: (B, T', d) -> (B, T', d)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.p = cfg.dropout
        self.norm = nn.LayerNorm(cfg.d_model)
        self.inner = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)
        self.outer = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dropout(F.silu(self.inner(self.norm(x))), self.p, self.training)
        return dropout(self.outer(y), self.p, self.training)

    def flops(self, frames: torch.Tensor) -> torch.Tensor:
        return 2 * frames * 2 * self.inner.in_features * self.inner.out_features


class MaskedBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the channels of (B, T', d) whose batch statistics count only frames where keep = 1.

    Plain BatchNorm would average padding into the statistics, so an utterance's training output and
    the running statistics would depend on how much padding it was batched with. Statistics are in fp32.
    Under activation checkpointing the recomputed forward updates the running statistics a second time.
    """

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, T', d), keep (B, T', 1) -> (B, T', d)."""
        y = x.float().contiguous()  # x is the convolution's transposed output: torch.export guards on B = 1 otherwise
        if not self.training:
            mean, var = self.running_mean.float(), self.running_var.float()
            return ((y - mean) * torch.rsqrt(var + self.eps) * self.weight.float() + self.bias.float()).to(x.dtype)
        count = keep.sum().float().clamp(min=2)
        mean = (y * keep).sum((0, 1)) / count  # (d,) over the frames inside the utterances
        var = ((y - mean).square() * keep).sum((0, 1)) / count
        with torch.no_grad():  # the buffers are bf16 under bf16-true
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            unbiased = var * count / (count - 1)  # as nn.BatchNorm1d keeps it
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
            self.num_batches_tracked += 1
        return ((y - mean) * torch.rsqrt(var + self.eps) * self.weight.float() + self.bias.float()).to(x.dtype)


class ConvModule(nn.Module):
    """LN -> pointwise (d -> 2d) + GLU -> depthwise conv over time -> norm -> SiLU -> pointwise -> dropout.

    Padded frames are zeroed before the depthwise convolution, so a frame near the end of an utterance
    sees the same zeros batched as alone (the convolution pads with zeros too).
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d, kernel = cfg.d_model, cfg.conv_kernel
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"model.encoder.conv_kernel must be odd and positive (centred on its frame), got {kernel}")
        if cfg.conv_norm not in ("layer", "batch"):
            raise ValueError(f"model.encoder.conv_norm must be 'layer' or 'batch', got {cfg.conv_norm!r}")
        self.p = cfg.dropout
        self.norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Linear(d, 2 * d)
        self.depthwise = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.conv_norm = MaskedBatchNorm(d) if cfg.conv_norm == "batch" else nn.LayerNorm(d)
        self.pointwise_out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, T', d), keep (B, T', 1) -> (B, T', d)."""
        y = self.depthwise(self.gate(x, keep).transpose(1, 2)).transpose(1, 2)  # (B, T', d)
        return self.finish(y, keep)

    def gate(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """What the depthwise convolution reads: LN, pointwise in and GLU of x (B, T', d), zero on padding."""
        return F.glu(self.pointwise_in(self.norm(x)), dim=-1) * keep

    def finish(self, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The depthwise convolution's output (B, T', d) -> norm, SiLU, pointwise out, dropout."""
        y = self.conv_norm(y, keep) if isinstance(self.conv_norm, MaskedBatchNorm) else self.conv_norm(y)
        return dropout(self.pointwise_out(F.silu(y)), self.p, self.training)

    def flops(self, frames: torch.Tensor) -> torch.Tensor:
        d, kernel = self.pointwise_out.in_features, self.depthwise.kernel_size[0]
        return 2 * frames * (2 * d * d + d * kernel + d * d)  # pointwise in, depthwise, pointwise out


class ConformerBlock(nn.Module):
    """Conformer block: x + ff(x)/2, x + rotary attn(LN(x)), x + conv(x), x + ff(x)/2, then LayerNorm."""

    absolute_positions = False  # positions enter as rotations of q and k, in every block

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        check_heads(cfg)
        if (cfg.d_model // cfg.n_heads) % 2:
            raise ValueError(f"model.encoder.block conformer rotates channel pairs: model.encoder.d_model / model.encoder.n_heads "
                             f"({cfg.d_model} / {cfg.n_heads}) must be even")
        self.n_heads, self.dropout, self.attention_dropout = cfg.n_heads, cfg.dropout, cfg.attention_dropout
        self.window = cfg.attention_window
        self.ff_first = FeedForward(cfg)
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.conv = ConvModule(cfg)
        self.ff_last = FeedForward(cfg)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, T', d); mask from attention_mask; keep (B, T', 1), 1 inside the utterance."""
        x = x + 0.5 * self.ff_first(x)  # macaron: half of each feed-forward before and after
        y = self_attention(self, self.attn_norm(x), mask, rotary=True, keep=keep)
        x = x + dropout(y, self.dropout, self.training)
        x = x + self.conv(x, keep)
        x = x + 0.5 * self.ff_last(x)
        return self.norm(x)

    def flops(self, frames: torch.Tensor) -> torch.Tensor:
        """Forward FLOPs of the matrix products and convolutions for (B,) encoder frames."""
        d = self.proj.in_features
        attn = 2 * frames * 4 * d * d + attention_flops(frames, d, self.window)  # qkv, proj, scores, weighted sum
        return self.ff_first.flops(frames) + attn + self.conv.flops(frames) + self.ff_last.flops(frames)


BLOCKS: dict[str, type[nn.Module]] = {"transformer": TransformerBlock, "conformer": ConformerBlock}


def block_type(name: str) -> type[nn.Module]:
    """The class ``model.encoder.block`` names; a clear error for any other name."""
    if name not in BLOCKS:
        raise ValueError(f"model.encoder.block must be one of {sorted(BLOCKS)}, got {name!r}")
    return BLOCKS[name]


def make_block(cfg: EncoderConfig) -> nn.Module:
    """One encoder block of type ``cfg.block``: the seam where a new block type plugs in."""
    return block_type(cfg.block)(cfg)
