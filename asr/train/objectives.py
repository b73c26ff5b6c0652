"""The objective seam: what training minimises, and how its outputs become token ids.

    objective(model, batch, training) -> Loss(objective to minimise, summed loss of the output, log_probs, lengths)
    objective.decode(log_probs, lengths) -> token ids per utterance (what WER/CER are scored on)

``CTC`` is today's (with intermediate CTC, Lee and Watanabe 2021). Loss and log-softmax are fp32; a loss is a
sum over the batch, so ASRModule divides by the global batch's tokens (a per-token mean over all ranks).
A new objective (hybrid CTC/attention, transducer) is a class here or in a file beside it, with its decoder.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from asr.data.batch import Batch
from asr.inference.decoding import greedy
from asr.tokenizer import BLANK_ID


class Loss(NamedTuple):
    objective: torch.Tensor  # () what to minimise, summed over the batch
    loss_sum: torch.Tensor  # () the output's own loss, summed over the batch (what train/loss logs)
    log_probs: torch.Tensor  # (B, T', V)
    lengths: torch.Tensor  # (B,) encoder frames


class Objective(Protocol):
    def __call__(self, model: nn.Module, batch: Batch, training: bool) -> Loss: ...

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]: ...


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


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor,
             reduction: Literal["mean", "sum"] = "mean"):
    """CTC loss in fp32, summed over the batch, and with "mean" divided by its target tokens (a per-token mean)."""
    loss = F.ctc_loss(
        log_probs.float().transpose(0, 1), tokens, lengths, token_lengths, blank=BLANK_ID, reduction="sum"
    )
    return loss if reduction == "sum" else loss / token_lengths.sum().clamp(min=1)
