"""The network of a transducer (RNN-T, Graves 2012), in plain PyTorch: features -> encoder -> joiner, with a
prediction network over the tokens emitted so far; the hybrid adds CTC's head on the same encoder.

    audio (B, n) ──EncoderNetwork (asr.models.network)──> (B, T', d) ──LayerNorm──┬─Linear (encoder_proj)─> (B,T',J)
                                                                                 └─Linear (head, hybrid)─> (B,T',V)
    (training with intermediate CTC also puts the middle block's output through the same LayerNorm and head)
    targets (B, U) ──[blank] + targets──Embedding──LSTM──Linear (proj)──> (B, U+1, J)
    joiner: tanh(enc[:, :, None] + pred[:, None]) ──Linear (output)──> logits (B, T', U+1, V)

T' counts encoder frames, U target tokens, J the joint width (``TransducerConfig.joint_dim``), V the vocabulary
with the blank (asr.tokenizer.BLANK_ID, also the prediction network's start symbol). The (B, T', U+1, V) lattice is
the transducer's cost in memory: J is kept small, and the loss (asr.models.transducer_objectives) is fp32 on logits
computed in the autocast dtype. At inference the network's *frames* are the encoder states in the joint space
(B, T', J), after the hybrid's CTC log-probabilities (B, T', V) when it has a head; the decoder
(asr.models.transducer_decoding) runs the prediction network one token at a time (``Predictor.step``) and the joiner
on one frame (``Joiner.join``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.network import EncoderNetwork
from asr.models.specaugment import SpecAugment
from asr.tokenizer import BLANK_ID


@dataclass(frozen=True)
class TransducerConfig:
    """The transducer's layers beside the encoder, and how it decodes (``--model.transducer.*``).

    Args:
        pred_dim: width of the prediction network's embedding and LSTM.
        pred_layers: LSTM layers of the prediction network.
        joint_dim: width J of the joiner, where encoder and prediction network meet; the (B, T', U+1, J)
            activations and (B, T', U+1, V) logits of the lattice are the transducer's memory.
        dropout: dropout on the prediction network's embedding and LSTM outputs in training.
        ctc_weight: hybrid only: training minimises (1 - w) x the transducer loss + w x the CTC loss of a CTC head on
            the same encoder (NeMo's hybrid models use 0.3).
        max_symbols: greedy decoding (and beam search) emits at most this many tokens on one encoder frame.
        beam_size: hypotheses kept by modified beam search (asr.transcribe --beam_size > 1 sets it).
    """

    pred_dim: int = 128
    pred_layers: int = 1
    joint_dim: int = 128
    dropout: float = 0.1
    ctc_weight: float = 0.3
    max_symbols: int = 4
    beam_size: int = 4

    def __post_init__(self):
        for name in ("pred_dim", "pred_layers", "joint_dim", "max_symbols", "beam_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.transducer.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0 or not 0.0 < self.ctc_weight < 1.0:
            raise ValueError(f"model.transducer.dropout must be in [0, 1) and model.transducer.ctc_weight in (0, 1), "
                             f"got {self.dropout:g} and {self.ctc_weight:g}")


State = tuple[torch.Tensor, torch.Tensor]  # the LSTM's (h, c), each (layers, N, pred_dim)


class Predictor(nn.Module):
    """The prediction network: the tokens emitted so far -> their context in the joint space."""

    def __init__(self, vocab_size: int, cfg: TransducerConfig):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, cfg.pred_dim)
        self.lstm = nn.LSTM(cfg.pred_dim, cfg.pred_dim, cfg.pred_layers, batch_first=True,
                            dropout=cfg.dropout if cfg.pred_layers > 1 else 0.0)
        self.dropout = nn.Dropout(cfg.dropout)
        self.proj = nn.Linear(cfg.pred_dim, cfg.joint_dim)

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        """targets (B, U) -> the context before each of them and after the last: (B, U+1, J)."""
        context = F.pad(targets, (1, 0), value=BLANK_ID)  # (B, U+1): the blank starts every sequence
        x, _ = self.recur(self.dropout(self.embedding(context)))
        return self.proj(self.dropout(x))

    def step(self, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One token more for N sequences: tokens (N,), the LSTM's state h, c (layers, N, pred_dim) -> the new
        context (N, J) and state h, c, fp32. The state of no token yet is zeros, and the first token BLANK_ID."""
        x, (h, c) = self.recur(self.embedding(tokens)[:, None], (h, c))
        return self.proj(x[:, 0]).float(), h.float(), c.float()

    def recur(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """The LSTM in its weights' dtype, outside autocast: oneDNN has no bf16 LSTM for training on a CPU, and the
        prediction network is a small share of the step."""
        dtype = self.lstm.weight_ih_l0.dtype
        with torch.autocast(x.device.type, enabled=False):
            return self.lstm(x.to(dtype), None if state is None else tuple(s.to(dtype) for s in state))

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        """(h, c) zeros for ``n`` sequences."""
        shape = (self.lstm.num_layers, n, self.lstm.hidden_size)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)


class Joiner(nn.Module):
    """Encoder states and prediction contexts -> the next token's logits."""

    def __init__(self, d_model: int, vocab_size: int, cfg: TransducerConfig):
        super().__init__()
        self.encoder_proj = nn.Linear(d_model, cfg.joint_dim)
        self.output = nn.Linear(cfg.joint_dim, vocab_size)

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """enc (B, T', J) and pred (B, U+1, J), both projected -> logits (B, T', U+1, V) in the autocast dtype (the
        lattice's activations too: enc is cast to pred's dtype first)."""
        return self.output(torch.tanh(enc.to(pred.dtype)[:, :, None] + pred[:, None]))

    def join(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """One frame each: enc (N, J) and pred (N, J) -> log-probabilities (N, V) in fp32."""
        x = torch.tanh(enc + pred)
        return self.output(x.to(self.output.weight.dtype)).float().log_softmax(-1)


class TransducerOutput(NamedTuple):
    logits: torch.Tensor  # (B, T', U+1, V) the joiner's, over the batch's longest utterance and target
    lengths: torch.Tensor  # (B,) encoder frames
    frames: torch.Tensor  # (B, T', [V +] J) what decoding reads (the model's frames at inference)
    ctc_log_probs: torch.Tensor | None  # (B, T', V) fp32, the hybrid's CTC head; None without one
    middle_log_probs: torch.Tensor | None = None  # (B, T', V) fp32, the middle block's through the head (middle=True)


class TransducerModel(EncoderNetwork):
    """Waveforms in; the joiner's lattice out in training, frames for the decoder at inference.

    ``ctc_head``: the hybrid's CTC head, whose log-probabilities start each frame. ``inter_ctc``: a CTC head for the
    middle block's output (intermediate CTC), the hybrid's own where it has one; without ``ctc_head`` it serves
    training alone, and no frame holds it. Either is ``head`` (``norm`` and ``head`` named as CTCModel's, so a CTC
    checkpoint's encoder and head both load into it: ``--model.init_from``).
    """

    def __init__(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int, cfg: TransducerConfig,
                 ctc_head: bool = False, spec_augment: SpecAugment | None = None, checkpoint_every: int = 0,
                 inter_ctc: bool = False):
        super().__init__(features, encoder, spec_augment, checkpoint_every)
        self.cfg, self.ctc_frames = cfg, ctc_head
        self.head = nn.Linear(self.encoder.d_model, vocab_size) if ctc_head or inter_ctc else None
        self.predictor = Predictor(vocab_size, cfg)
        self.joiner = Joiner(self.encoder.d_model, vocab_size, cfg)
        # the weights with one row per token (a new vocabulary renews them)
        rows = ("predictor.embedding.weight", "joiner.output.weight", "joiner.output.bias")
        self.token_rows = rows + (("head.weight", "head.bias") if self.head is not None else ())

    @property
    def ctc_width(self) -> int:
        """The CTC log-probabilities' share of a frame: V with the hybrid's CTC head, else 0."""
        return self.head.out_features if self.ctc_frames else 0

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, middle: bool = False,
                statistics: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                target_lengths: torch.Tensor | None = None) -> TransducerOutput | tuple[torch.Tensor, torch.Tensor]:
        """audio (B, n), lengths (B,) in samples -> (frames (B, T', [V +] J) fp32, lengths (B,)); with ``targets``
        (B, U) and ``target_lengths`` (B,), a TransducerOutput whose lattice spans the longest of each (what the
        loss needs; one read of the two maxima on the host). ``middle`` (a model with an intermediate CTC head):
        also the middle block's CTC log-probabilities (B, T', V), as a third output or in the TransducerOutput. The
        prediction network, joiner and head run here, in forward, so that FSDP2's hooks gather their parameters.
        ``statistics`` as EncoderNetwork.encode's."""
        if middle and self.head is None:
            raise ValueError("intermediate CTC needs a CTC head: build the model with inter_ctc (model.inter_ctc > 0)")
        x, lengths, *rest = self.encode(audio, lengths, middle, statistics)
        frames = self.frames(x)
        between = self.head(self.norm(rest[0])).float().log_softmax(-1) if middle else None  # (B, T', V)
        if targets is None:
            return (frames, lengths, between) if middle else (frames, lengths)
        t, u = (int(n) for n in torch.stack([lengths.max(), target_lengths.max()]).tolist())
        logits = self.joiner(frames[:, :t, self.ctc_width:], self.predictor(targets[:, :u]))  # (B, T', U+1, V)
        return TransducerOutput(logits, lengths, frames, frames[..., : self.ctc_width] if self.ctc_width else None,
                                between)

    def frames(self, states: torch.Tensor) -> torch.Tensor:
        """Encoder states (B, T', d) -> frames (B, T', [V +] J) fp32: the hybrid's CTC log-probabilities, then the
        states in the joint space (what the joiner adds to the prediction network's context)."""
        x = self.norm(states)
        enc = self.joiner.encoder_proj(x).float()
        return torch.cat([self.head(x).float().log_softmax(-1), enc], -1) if self.ctc_frames else enc

    def forward_flops(self, num_samples: torch.Tensor, num_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Forward FLOPs (2 per multiply-add) of each utterance run alone in training, (B,) int64: the encoder's, the
        projections', the CTC head (the hybrid's, or intermediate CTC's), the prediction network over ``num_tokens``
        (B,) targets (none: 0) and the joiner over the whole (T', U+1) lattice. Left out: embeddings, norms,
        activations, softmax, the loss."""
        flops, t = self.encoder_flops(num_samples)
        u1 = (num_tokens.long() if num_tokens is not None else torch.zeros_like(t)) + 1  # contexts: U+1
        d, j, v, p = self.encoder.d_model, self.cfg.joint_dim, self.joiner.output.out_features, self.cfg.pred_dim
        lstm = sum(2 * 4 * p * (p + p) for _ in range(self.cfg.pred_layers))  # 4 gates of (input + hidden) x p
        flops = flops + 2 * t * d * j + u1 * (lstm + 2 * p * j) + t * u1 * 2 * j * v
        return flops + 2 * t * d * v if self.head is not None else flops
