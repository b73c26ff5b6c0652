"""CTC decoding: log-probabilities -> token ids. Greedy now; beam search will take the same arguments."""

from __future__ import annotations

import torch

from asr.tokenizer import BLANK_ID


def greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best class per frame, repeats merged, blanks dropped.

    log_probs (B, T', V), lengths (B,) encoder frames -> one list of token ids per utterance.
    """
    best = log_probs.argmax(dim=-1)  # (B, T')
    keep = best != BLANK_ID
    keep[:, 1:] &= best[:, 1:] != best[:, :-1]  # a repeat only counts after a change of class
    return [best[b, : int(n)][keep[b, : int(n)]].tolist() for b, n in enumerate(lengths)]
