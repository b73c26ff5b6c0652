"""The streaming encoder (``--model.encoder.streaming true``): a Conformer that sees no audio past the end of its chunk,
run over a whole file or chunk by chunk with its caches carried between chunks.

    whole file:  feats (B, T, F), frames (B,) ──StreamingEncoder──> states (B, T', d), lengths (B,)      T' = T // f
    a stream:    feats (B, (C + A) f, F), EncoderState ──StreamingEncoder.step──> states (B, C, d), EncoderState

T counts feature frames (10 ms), T' encoder frames (f = model.encoder.subsampling feature frames each), C the chunk
in encoder frames, A <= R the frames of look-ahead after it (R but at a stream's end). What each part sees:
- attention (``chunk_mask``): encoder frame t is in chunk t // C; in every layer it sees the frames of its own chunk
  and the ``left_context`` frames before the chunk's first, nothing after the chunk's last, except in the first
  layer: its keys reach ``lookahead`` frames (R) past the chunk. Only the first layer looks ahead because its keys
  are the subsampling's frames, which a stream computes alone; a later layer's frames past the chunk would need the
  chunk after, so the look-ahead would grow with depth (NeMo's cache-aware right context). C = 0 is full context
  (whole files): every frame, or with ``attention_window`` w > 0 the frames at most w away, as the offline
  encoder's local attention.
- convolutions (``CausalConvModule``): each depthwise convolution sees its frame and the kernel - 1 before it.
- subsampling (``CausalSubsampling``): f - 1 zero feature frames in front, so encoder frame j reads feature frames
  f j - f + 1 .. f j + f - 1: its own f and the f - 1 before them; a chunk needs no feature frame after it.
- features: model.features.norm global or running (asr.models.features): each frame is scaled without the frames
  after it; running's statistics so far are carried in the StreamState.
So a stream's algorithmic latency is the chunk and its look-ahead, (C + R) f x 10 ms, plus what a feature window
reaches past its hop (15 ms for 25 ms windows, 10 ms for 20 ms ones): ``algorithmic_latency``.

Caches (``EncoderState``) are explicit tensors of fixed size, so memory does not grow with the stream and the step
can be traced: the last f - 1 feature frames (B, f - 1, F); each attention layer's rotated keys and values of the
``left_context`` frames before the next chunk (layers, B, H, left_context, d / H); each depthwise convolution's
input of the kernel - 1 frames before it (layers, B, kernel - 1, d); and the encoder frames so far (B,), which
rotary positions and the mask of the cache's empty slots read. Running consecutive chunks through ``step`` gives
the states of the whole-file forward with the same C (to float rounding): tests/models/test_streaming.py.

Training draws each batch's C (``training_chunk``): full context with probability full_context_prob, else uniform
in 1 .. max_chunk_frames (WeNet U2's dynamic chunk training, Zhang et al. 2021), so one model serves several
latencies and whole files. Outside training the encoder runs at ``chunk`` (model.encoder.chunk_frames unless set).

``start`` and ``advance`` run a network (features, encoder, head) over a stream of audio pieces; ``stack`` and
``unstack`` join streams' caches so that one step runs several streams, each at its own position.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr.models.blocks import ConformerBlock, ConvModule, dropout, rotate, rotation
from asr.models.config import EncoderConfig
from asr.models.encoder import BlockStack
from asr.models.features import CAUSAL_NORMS, HOP_SECONDS, RunningSums
from asr.models.subsampling import Conv2dSubsampling


class EncoderState(NamedTuple):
    """What StreamingEncoder.step carries from one chunk to the next (module docstring)."""

    features: torch.Tensor  # (B, f - 1, F) the last feature frames read
    keys: torch.Tensor  # (layers, B, H, left_context, d / H) rotated keys of the frames before the next chunk
    values: torch.Tensor  # (layers, B, H, left_context, d / H)
    conv: torch.Tensor  # (layers, B, kernel - 1, d) the depthwise convolutions' inputs before the next chunk
    position: torch.Tensor  # (B,) int64 encoder frames so far: the index of the next chunk's first


def chunk_mask(lengths: torch.Tensor, frames: int, chunk: int, left: int, right: int = 0, window: int = 0
               ) -> torch.Tensor:
    """True where query frame t may attend to key frame s: s inside the utterance (``lengths`` (B,) encoder frames)
    and, ``chunk`` C > 0, in [c C - left, c C + C + right) for t's chunk c = t // C: (B, 1, T', T'); C = 0 (full
    context): a key-padding mask (B, 1, 1, T'), or with ``window`` w > 0 |t - s| <= w (B, 1, T', T'). Each frame
    sees itself, so a padded query has a key (no NaN)."""
    positions = torch.arange(frames, device=lengths.device)
    inside = positions[None, :] < lengths[:, None]  # (B, T')
    if chunk == 0 and not window:
        return inside[:, None, None, :]
    if chunk == 0:
        seen = (positions[None, :] - positions[:, None]).abs() <= window
    else:
        first = positions // chunk * chunk  # (T',) each query's chunk start
        seen = (positions[None, :] < first[:, None] + chunk + right) & (positions[None, :] >= first[:, None] - left)
    return ((seen[None] & inside[:, None, :]) | torch.eye(frames, dtype=torch.bool, device=lengths.device))[:, None]


def cache_mask(position: torch.Tensor, left: int, new: int) -> torch.Tensor:
    """(B, 1, 1, left + new): which keys a chunk of ``new`` frames after ``position`` (B,) frames sees: the cache's
    slots that hold a frame (slot j holds frame position - left + j; none before the stream's start) and its own."""
    slots = torch.arange(left, device=position.device)
    held = position[:, None] - left + slots[None, :] >= 0  # (B, left)
    return torch.cat([held, held.new_ones(len(position), new)], dim=1)[:, None, None, :]


class CausalSubsampling(Conv2dSubsampling):
    """Conv2dSubsampling with f - 1 zero feature frames in front: (B, T, F) -> (B, T // f, d), encoder frame j reading
    feature frames f j - f + 1 .. f j + f - 1 (each stride-2 3x3 convolution maps L -> (L - 1) // 2, and
    T + f - 1 frames give T // f for f = 4 and 8). A stream puts the previous chunk's last f - 1 frames there."""

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.read(F.pad(x, (0, 0, self.factor - 1, 0)), lengths)

    def read(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, f - 1 + T, F) with its f - 1 frames of history in front, lengths (B,) T -> (B, T // f, d), (B,)."""
        return super().forward(x, lengths + self.factor - 1)

    def flops(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().flops(frames + self.factor - 1)


class CausalConvModule(ConvModule):
    """ConvModule whose depthwise convolution sees its frame and the kernel - 1 frames before it, no later one."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__(cfg)
        self.history = cfg.conv_kernel - 1
        self.depthwise = nn.Conv1d(cfg.d_model, cfg.d_model, cfg.conv_kernel, groups=cfg.d_model)  # no padding

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.step(x, keep)[0]

    def step(self, x: torch.Tensor, keep: torch.Tensor, history: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T', d), keep (B, T', 1), the gated inputs of the kernel - 1 frames before x (B, kernel - 1, d; None:
        zeros, a stream's start) -> (B, T', d) and the gated inputs of x's last kernel - 1 frames (the next history)."""
        y = self.gate(x, keep)  # (B, T', d)
        past = y.new_zeros(y.shape[0], self.history, y.shape[2]) if history is None else history.to(y.dtype)
        y = torch.cat([past, y], dim=1)  # (B, kernel - 1 + T', d)
        out = self.finish(self.depthwise(y.transpose(1, 2)).transpose(1, 2), keep)
        return out, y[:, y.shape[1] - self.history:]


class StreamingConformerBlock(ConformerBlock):
    """ConformerBlock (same weights and names) with chunked attention at given positions and a causal convolution;
    ``step`` also takes and gives its caches: (keys, values) (B, H, left_context, d / H) and the convolution's history."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__(cfg)
        self.conv = CausalConvModule(cfg)
        self.keys_seen = cfg.chunk_frames + cfg.left_context  # for flops: the keys a query sees at the default chunk
        # (the first block's look-ahead adds a few keys to one layer: left out)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, turn: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.Tensor:
        """x (B, T', d); mask of chunk_mask; keep (B, T', 1); turn: blocks.rotation of x's frames -> (B, T', d)."""
        return self.step(x, mask, keep, turn)[0]

    def step(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, turn: tuple[torch.Tensor, torch.Tensor],
             cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, ahead: int = 0
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As forward, after the frames ``cache`` holds (None: nothing before x); the mask covers the cached keys
        first, then x's. x's last ``ahead`` frames are look-ahead: keys and values only (the first block's, module
        docstring), left out of the output (B, T' - ahead, d) and of the cache. Returns the output and what the cache
        holds with the rest of x: the keys and values of the cache's frames and its (B, H, L + T' - ahead, d / H), of
        which the next chunk keeps the last left_context (StreamingEncoder.step), and the convolution's history."""
        keys, values, history = cache if cache is not None else (None, None, None)
        x = x + 0.5 * self.ff_first(x)
        y, keys, values = self.attend(self.attn_norm(x), mask, turn, keys, values)
        own = x.shape[1] - ahead  # the chunk's frames
        x = x[:, :own] + dropout(y[:, :own], self.dropout, self.training)
        keys, values = keys[:, :, : keys.shape[2] - ahead], values[:, :, : values.shape[2] - ahead]
        y, history = self.conv.step(x, keep, history)
        x = x + y
        x = x + 0.5 * self.ff_last(x)
        return self.norm(x), (keys, values, history)

    def attend(self, x: torch.Tensor, mask: torch.Tensor, turn: tuple[torch.Tensor, torch.Tensor],
               keys: torch.Tensor | None, values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention of normed x (B, T', d) rotated by ``turn``, after cached rotated ``keys`` and
        ``values`` (B, H, L, d / H) -> (B, T', d), and the keys and values of the cache and x (B, H, L + T', d / H).
        On CPU in fp32 whatever the precision, as asr.models.blocks.attention."""
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # (3, B, H, T', d/H)
        cpu = qkv.device.type == "cpu"
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            q, k, v = qkv.float() if cpu else qkv
            q, k = rotate(q, turn), rotate(k, turn)
            if keys is not None:
                k, v = torch.cat([keys.to(k.dtype), k], dim=2), torch.cat([values.to(v.dtype), v], dim=2)
            p = self.attention_dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, T', d/H)
        return self.proj(y.transpose(1, 2).reshape(b, t, d).to(qkv.dtype)), k, v

    def flops(self, frames: torch.Tensor) -> torch.Tensor:
        """ConformerBlock's, with each query seeing at most chunk_frames + left_context keys."""
        d, keys = self.proj.in_features, frames.clamp(max=self.keys_seen)
        return super().flops(frames) - 2 * 2 * frames * frames * d + 2 * 2 * frames * keys * d


class StreamingEncoder(BlockStack):
    """CausalSubsampling, then ``cfg.n_layers`` StreamingConformerBlocks over chunks (module docstring). Keeps the
    Encoder protocol of asr.models.encoder; its weights have BlockEncoder's names. ``chunk``: encoder frames per
    chunk outside training (model.encoder.chunk_frames; 0 = full context), which a caller may set."""

    def __init__(self, cfg: EncoderConfig, n_feats: int, checkpoint_every: int = 0):
        super().__init__()
        if cfg.block != "conformer":
            raise ValueError(f"model.encoder.streaming needs model.encoder.block conformer (relative positions that "
                             f"hold over a stream of any length), got {cfg.block!r}")
        if checkpoint_every < 0:
            raise ValueError(f"model.checkpoint_every must be >= 0 (0 = off), got {checkpoint_every}")
        self.cfg, self.checkpoint_every = cfg, checkpoint_every
        self.d_model, self.factor, self.chunk, self.lookahead = cfg.d_model, cfg.subsampling, cfg.chunk_frames, cfg.lookahead
        self.subsampling = CausalSubsampling(n_feats, cfg.d_model, cfg.subsampling, cfg.conv_channels,
                                             cfg.subsampling_conv == "separable")
        self.blocks = nn.ModuleList(StreamingConformerBlock(cfg) for _ in range(cfg.n_layers))

    def forward(self, feats: torch.Tensor, frames: torch.Tensor, middle: bool = False) -> tuple[torch.Tensor, ...]:
        """The Encoder contract, each frame seeing its chunk (``training_chunk`` in training, else ``chunk``)."""
        if middle and self.middle_block < 0:
            raise ValueError(f"intermediate CTC needs at least 2 blocks, this model has {len(self.blocks)}")
        recompute = self.training and self.checkpoint_every
        if recompute:
            x, lengths = checkpoint(self.subsampling, feats, frames, use_reentrant=False)  # (B, T', d)
        else:
            x, lengths = self.subsampling(feats, frames)  # (B, T', d)
        b, t = x.shape[:2]
        chunk, left = self.training_chunk() if self.training else self.chunk, self.cfg.left_context
        mask = chunk_mask(lengths, t, chunk, left, window=self.cfg.attention_window)
        first = chunk_mask(lengths, t, chunk, left, self.lookahead) if chunk and self.lookahead else mask
        keep = (torch.arange(t, device=x.device) < lengths[:, None]).unsqueeze(-1).to(x.dtype)  # (B, T', 1)
        turn = rotation(torch.arange(t, device=x.device).expand(b, t), self.d_model // self.cfg.n_heads)
        middle_states = None
        for i, block in enumerate(self.blocks):
            seen = first if i == 0 else mask
            if recompute and i % self.checkpoint_every == 0:
                x = checkpoint(block, x, seen, keep, turn, use_reentrant=False)
            else:
                x = block(x, seen, keep, turn)
            if middle and i == self.middle_block:
                middle_states = x
        return (x, lengths, middle_states) if middle else (x, lengths)

    def training_chunk(self) -> int:
        """This batch's chunk: 0 (full context) with probability full_context_prob, else uniform in 1 ..
        max_chunk_frames. Drawn from torch's CPU generator (seeded by seed_everything): no wait for a device."""
        if float(torch.rand(())) < self.cfg.full_context_prob:
            return 0
        return int(torch.randint(1, self.cfg.max_chunk_frames + 1, ()))

    def initial_state(self, batch: int = 1, device: torch.device | str = "cpu") -> EncoderState:
        """The caches before a stream's first chunk: zeros (what the whole-file forward pads with), position 0."""
        cfg, layers = self.cfg, len(self.blocks)
        heads = (layers, batch, cfg.n_heads, cfg.left_context, cfg.d_model // cfg.n_heads)
        return EncoderState(torch.zeros(batch, self.factor - 1, self.subsampling.n_feats, device=device),
                            torch.zeros(heads, device=device), torch.zeros(heads, device=device),
                            torch.zeros(layers, batch, cfg.conv_kernel - 1, cfg.d_model, device=device),
                            torch.zeros(batch, dtype=torch.long, device=device))

    def step(self, feats: torch.Tensor, state: EncoderState, ahead: int = 0) -> tuple[torch.Tensor, EncoderState]:
        """The next chunk: feats (B, (C + A) f, F), of which the last ``ahead`` = A f are the look-ahead (A <= R,
        fewer only at a stream's end) -> states (B, C, d) and the caches after the chunk. Every frame of the chunk
        sees the whole chunk, the first block A frames more, as in the whole-file forward with chunk C; a stream's
        last chunk may be shorter."""
        if feats.shape[1] % self.factor or ahead % self.factor or ahead > self.lookahead * self.factor:
            raise ValueError(f"a chunk and its look-ahead must be whole encoder frames of {self.factor} feature "
                             f"frames, the look-ahead at most {self.lookahead}: got {feats.shape[1]} and {ahead}")
        b, new, more = feats.shape[0], (feats.shape[1] - ahead) // self.factor, ahead // self.factor
        history = torch.cat([state.features.to(feats.dtype), feats], dim=1)  # (B, f - 1 + (C + A) f, F)
        x, _ = self.subsampling.read(history, torch.full((b,), feats.shape[1], device=feats.device))  # (B, C + A, d)
        heads = self.d_model // self.cfg.n_heads
        turn = rotation(state.position[:, None] + torch.arange(new + more, device=feats.device), heads)
        keep = x.new_ones(b, new, 1)
        keys, values, conv, left = [], [], [], self.cfg.left_context
        first = (cache_mask(state.position, left, new + more), turn, more)  # the first block reads the look-ahead
        rest = (cache_mask(state.position, left, new), (turn[0][..., :new, :], turn[1][..., :new, :]), 0)
        for i, block in enumerate(self.blocks):
            mask, rotated, seen = first if i == 0 else rest
            x, (k, v, c) = block.step(x, mask, keep, rotated, (state.keys[i], state.values[i], state.conv[i]), seen)
            keys.append(k[:, :, k.shape[2] - left:]), values.append(v[:, :, v.shape[2] - left:]), conv.append(c)
        end = history.shape[1] - ahead  # the features' history ends with the chunk, not its look-ahead
        return x, EncoderState(history[:, end - (self.factor - 1): end], torch.stack(keys),
                               torch.stack(values), torch.stack(conv), state.position + new)

    def output_lengths(self, frames: torch.Tensor | int) -> torch.Tensor | int:
        return frames // self.factor


def algorithmic_latency(encoder: StreamingEncoder, chunk: int, window_seconds: float) -> float:
    """Seconds from a sample's arrival until every frame it is in can be computed, at worst: the audio of the chunk
    and its look-ahead (``chunk`` + lookahead encoder frames) plus what a feature window of ``window_seconds``
    reaches past its hop."""
    return (chunk + encoder.lookahead) * encoder.factor * HOP_SECONDS + window_seconds - HOP_SECONDS


class StreamState(NamedTuple):
    """What ``advance`` carries between audio pieces: the front end's leftovers and the encoder's caches."""

    audio: torch.Tensor  # (B, s) samples not yet in a feature frame: less than a chunk's and a window's
    feats: torch.Tensor  # (B, m, F) feature frames waiting for a whole chunk
    encoder: EncoderState
    norm: RunningSums  # the statistics of the frames so far (model.features.norm running)


def streams(network: nn.Module) -> bool:
    """Whether ``network`` (CTCModel, or another objective's network) runs on a stream: a StreamingEncoder after a
    front end that scales each frame without the frames after it (model.features.norm global or running)."""
    return isinstance(network.encoder, StreamingEncoder) and network.features.config.norm in CAUSAL_NORMS


def start(network: nn.Module, batch: int = 1, device: torch.device | str = "cpu") -> StreamState:
    """The state of ``batch`` streams before their first audio."""
    n_feats = network.encoder.subsampling.n_feats
    return StreamState(torch.zeros(batch, 0, device=device), torch.zeros(batch, 0, n_feats, device=device),
                       network.encoder.initial_state(batch, device), network.features.start_sums(batch, device))


def advance(network: nn.Module, audio: torch.Tensor, state: StreamState, chunk: int, final: bool = False
            ) -> tuple[torch.Tensor | None, StreamState]:
    """The next audio (B, n) of ``batch`` streams at the network's rate -> the frames (B, T', *) of every chunk of
    ``chunk`` encoder frames it completes (``network_frames``; None if it completes none), and the state after it.
    Audio waits in the state until it completes a chunk, so the front end runs once a chunk (``featurize``).
    ``final``: the stream ends with this audio; the rest is run as a last, shorter chunk (whole encoder frames) with
    the zeros a whole file is padded with. Over a stream the frames are those of the network's whole-file forward
    with encoder.chunk = ``chunk`` (to float rounding)."""
    state = featurize(network, audio, state, chunk, final)
    encoder, feats, caches, outputs = network.encoder, state.feats, state.encoder, []
    while window := step_frames(feats.shape[1], chunk, encoder, final):
        take, ahead = window
        states, caches = encoder.step(feats[:, :take + ahead].to(next(encoder.parameters()).dtype), caches, ahead)
        outputs.append(network_frames(network, states))
        feats = feats[:, take:]
    frames = torch.cat(outputs, dim=1) if outputs else None
    return frames, state._replace(feats=feats[:, : 0 if final else feats.shape[1]], encoder=caches)


def featurize(network: nn.Module, audio: torch.Tensor, state: StreamState, chunk: int, final: bool = False
              ) -> StreamState:
    """advance's front end: the next audio (B, n) into the state's feature frames (B, m, F), once it completes
    the windows of the next chunk of ``chunk`` encoder frames (``final``: all of it, padded as a whole file is);
    until then it waits in the state. The encoder's caches are left as they are."""
    if chunk < 1:
        raise ValueError(f"a stream runs in chunks of at least 1 encoder frame, got {chunk}")
    audio = torch.cat([state.audio, audio.to(state.audio)], dim=1)
    if not final and samples_wanted(network, state._replace(audio=audio), chunk):
        return state._replace(audio=audio)
    feats, used, sums = network.features.stream_frames(audio, state.norm, final)
    return state._replace(audio=audio[:, used:], feats=torch.cat([state.feats, feats], dim=1), norm=sums)


def samples_wanted(network: nn.Module, state: StreamState, chunk: int) -> int:
    """Samples of audio the next chunk of ``chunk`` encoder frames still needs after ``state``: the windows of the
    feature frames it misses, less the audio waiting in the state (0: it is complete)."""
    cfg = network.features.config
    encoder = network.encoder
    missing = (chunk + encoder.lookahead) * encoder.factor - state.feats.shape[1]  # the next chunk's and look-ahead's
    return max(0, (missing - 1) * cfg.hop_length + cfg.win_length - state.audio.shape[1])


def step_frames(waiting: int, chunk: int, encoder: StreamingEncoder, final: bool) -> tuple[int, int] | None:
    """The feature frames the next encoder step takes of ``waiting`` and those it reads after them as look-ahead:
    a chunk's (``chunk`` encoder frames) and the encoder's lookahead frames after it, or at a stream's end the
    rest in whole encoder frames; None while they are not there."""
    factor, whole = encoder.factor, waiting // encoder.factor * encoder.factor
    if waiting >= (chunk + encoder.lookahead) * factor or (final and waiting >= factor):
        take = min(chunk * factor, whole)
        return take, min(encoder.lookahead * factor, whole - take)
    return None


BATCH_DIMS = EncoderState(0, 1, 1, 1, 0)  # the dimension of each EncoderState tensor that counts streams


def stack(states: list[EncoderState]) -> EncoderState:
    """Several streams' EncoderStates as one, in order along each tensor's batch dimension, so that one
    StreamingEncoder.step runs them all (each at its own position: the mask and rotations are per stream)."""
    return EncoderState(*(torch.cat(parts, dim) for parts, dim in zip(zip(*states), BATCH_DIMS)))


def unstack(state: EncoderState) -> list[EncoderState]:
    """stack's inverse: the EncoderState of each stream (batch 1) of ``state``, as views of its tensors."""
    streams = range(len(state.position))
    return [EncoderState(*(t.narrow(dim, b, 1) for t, dim in zip(state, BATCH_DIMS))) for b in streams]


def network_frames(network: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """Encoder states (B, T', d) -> the network's frames, what its objective decodes: ``network.frames`` (CTCModel's
    log-probabilities, a TransducerModel's states in the joiner's space)."""
    return network.frames(states)
