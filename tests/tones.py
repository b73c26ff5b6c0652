"""ToneModel: a deterministic acoustic model for tests of transcription, and the audio it hears.

Every output frame of ToneModel depends only on its own 40 ms of audio: token k is a tone of
200 + 100 k Hz, silence is blank. Audio made of such tones (``tones``) has a known transcript and
known word times, and chunked decoding of it must give exactly what one pass gives.
"""

from __future__ import annotations

import numpy as np
import torch

from asr.tokenizer import BLANK_ID, Tokenizer

RATE, FRAME = 16000, 640  # ToneModel: 16 kHz, 40 ms frames
TONE, GAP = 3, 2  # frames of tone per token and of silence after it


class ToneModel:
    """Frame j (samples [640 j, 640 j + 640)) is token k if its strongest frequency is 200 + 100 k Hz."""

    sample_rate, frame_seconds = RATE, FRAME / RATE

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        b, frames = audio.shape[0], audio.shape[1] // FRAME
        x = audio[:, : frames * FRAME].reshape(b, frames, FRAME)
        peak = torch.fft.rfft(x).abs().argmax(-1) * RATE / FRAME  # Hz, 25 Hz bins
        token = ((peak - 200) / 100).round().long().clamp(1, self.tokenizer.vocab_size - 1)
        token = torch.where(x.pow(2).mean(-1) > 1e-3, token, BLANK_ID)
        scores = torch.nn.functional.one_hot(token, self.tokenizer.vocab_size) * 6.0
        return scores.log_softmax(-1), lengths // FRAME


def tones(tokenizer: Tokenizer, text: str, pause: int = 10) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Audio of ``text`` for ToneModel, then ``pause`` silent frames; and each word's (start, end) seconds."""
    pieces, spans, t, new_word = [], [], 0, False
    n = np.arange(TONE * FRAME)
    for token in tokenizer.encode(text):
        piece = tokenizer.sp.id_to_piece(token)
        pieces += [0.5 * np.sin(2 * np.pi * (200 + 100 * token) * n / RATE), np.zeros(GAP * FRAME)]
        new_word |= piece.startswith("▁")
        if piece != "▁":  # the char tokenizer's word marker is a token of its own, before the word
            if new_word:
                spans.append([t, t + TONE])
                new_word = False
            spans[-1][1] = t + TONE
        t += TONE + GAP
    pieces.append(np.zeros(pause * FRAME))
    return np.concatenate(pieces).astype(np.float32), [(a * FRAME / RATE, b * FRAME / RATE) for a, b in spans]
