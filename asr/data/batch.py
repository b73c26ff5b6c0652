"""A batch: the one shape every data source's loader gives the model (asr.train.module, asr.models.objectives).

    Batch(audio (B, n) float32 zero-padded, audio_lengths (B,) samples, tokens (B, L) int64 padded with the blank,
          token_lengths (B,), texts, dropped)
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    audio: torch.Tensor  # (B, n) float32 waveforms, zero-padded
    audio_lengths: torch.Tensor  # (B,) samples
    tokens: torch.Tensor  # (B, L) int64 token ids, padded with 0 (the blank, never a target)
    token_lengths: torch.Tensor  # (B,)
    texts: list[str]
    dropped: tuple[str, ...] = ()  # "SOURCE: reason" of this batch's utterances that failed to load (DataFaults)


def collate(audio: list[torch.Tensor], tokens: list[torch.Tensor], texts: list[str]) -> Batch:
    pad = torch.nn.utils.rnn.pad_sequence
    return Batch(
        pad(audio, batch_first=True), torch.tensor([len(a) for a in audio]),
        pad(tokens, batch_first=True), torch.tensor([len(t) for t in tokens]), texts,
    )
