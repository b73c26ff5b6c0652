"""The objective seam: what training minimises, and how its outputs become token ids, word times and cut points.

    objective(model, batch, training) -> Loss(objective to minimise, summed loss of the output, log_probs, lengths)
    objective.decode(log_probs, lengths) -> token ids per utterance (what WER/CER are scored on; greedy)
    objective.align(frames, ids, first_frame) -> token spans on one utterance's frames (word times, confidences)
    objective.silent_frames(frames) -> how many frames emit nothing (a Result's blank_share)
    objective.cut(frames, lo, hi) -> a frame in [lo, hi) where a long recording's frames may be split

asr.inference asks the model's objective (AcousticModel.objective) for all of these, never CTC's functions
by name; only beam search with a language model (asr.inference.decoding.BeamSearch) is CTC's own.

``CTC`` is today's (with intermediate CTC, Lee and Watanabe 2021). Loss and log-softmax are fp32; a loss is a
sum over the batch, so ASRModule divides by the global batch's tokens (a per-token mean over all ranks).
A new objective (hybrid CTC/attention, transducer) is a class here or in a file beside it, with these methods.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from asr.data.batch import Batch
from asr.inference.decoding import greedy
from asr.inference.longform import blank_cut
from asr.inference.result import Span, align, blank_frames
from asr.tokenizer import BLANK_ID


class Loss(NamedTuple):
    objective: torch.Tensor  # () what to minimise, summed over the batch
    loss_sum: torch.Tensor  # () the output's own loss, summed over the batch (what train/loss logs)
    log_probs: torch.Tensor  # (B, T', V)
    lengths: torch.Tensor  # (B,) encoder frames


class Objective(Protocol):
    def __call__(self, model: nn.Module, batch: Batch, training: bool) -> Loss: ...

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]: ...

    def align(self, frames: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]: ...

    def silent_frames(self, frames: torch.Tensor) -> int: ...

    def cut(self, frames: torch.Tensor, lo: int, hi: int) -> int: ...


class CTC:
    """CTC on the model's output; in training with ``inter_ctc`` = w > 0, (1 - w) x that + w x the CTC loss of
    the middle block's output through the same head. Decoding is greedy (best path)."""

    def __init__(self, inter_ctc: float = 0.0):
        if not 0.0 <= inter_ctc < 1.0:
            raise ValueError(f"model.inter_ctc must be in [0, 1), got {inter_ctc:g}")
        self.inter_ctc = inter_ctc

    def __call__(self, model: nn.Module, batch: Batch, training: bool) -> Loss:
        weight = self.inter_ctc if training else 0.0
        log_probs, lengths, *middle = model(batch.audio, batch.audio_lengths, middle=weight > 0)
        loss_sum = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lengths, reduction="sum")
        objective = loss_sum
        if middle:
            middle_loss = ctc_loss(middle[0], lengths, batch.tokens, batch.token_lengths, reduction="sum")
            objective = (1 - weight) * loss_sum + weight * middle_loss
        return Loss(objective, loss_sum, log_probs, lengths)

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
        return greedy(log_probs, lengths)

    def align(self, frames: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]:
        """CTC forced alignment of ``ids`` on one utterance's (T', V) log-probs (asr.inference.result.align)."""
        return align(frames, ids, first_frame)

    def silent_frames(self, frames: torch.Tensor) -> int:
        """Frames whose most likely class is the blank."""
        return blank_frames(frames)

    def cut(self, frames: torch.Tensor, lo: int, hi: int) -> int:
        """The middle of the longest run of blank frames in [lo, hi) (asr.inference.longform.blank_cut)."""
        return blank_cut(frames, lo, hi)


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor,
             reduction: Literal["mean", "sum"] = "mean"):
    """CTC loss in fp32, summed over the batch, and with "mean" divided by its target tokens (a per-token mean)."""
    loss = F.ctc_loss(
        log_probs.float().transpose(0, 1), tokens, lengths, token_lengths, blank=BLANK_ID, reduction="sum"
    )
    return loss if reduction == "sum" else loss / token_lengths.sum().clamp(min=1)
