"""Word timings (asr/result.py): forced alignment puts each decoded token on the frames where the
model emitted it, and words get times in seconds and confidences from their tokens' frames.

The log-probs are built by hand: each token of the text spikes for SPIKE frames after GAP blank
frames, with posterior CONFIDENCE, so every token's frames, and so every word's times, are known.
"""

from __future__ import annotations

import pytest
import torch

from asr.result import align, words_of
from asr.tokenizer import BLANK_ID, WORD_START, Tokenizer

SPIKE, GAP, CONFIDENCE = 2, 3, 0.9
FRAME_SECONDS = 0.04


def spiky(tokenizer: Tokenizer, text: str) -> tuple[torch.Tensor, list[int], list[int]]:
    """(log-probs (T', V), the text's token ids, the first frame of each token's spike)."""
    ids, frames, starts = tokenizer.encode(text), [], []
    for token in ids:
        frames += [BLANK_ID] * GAP
        starts.append(len(frames))
        frames += [token] * SPIKE
    frames += [BLANK_ID] * GAP
    vocab = tokenizer.vocab_size
    probs = torch.full((len(frames), vocab), (1 - CONFIDENCE) / (vocab - 1))
    probs[torch.arange(len(frames)), torch.tensor(frames)] = CONFIDENCE
    return probs.log(), ids, starts


def test_each_token_is_aligned_to_the_frames_of_its_spike(char_tokenizer):
    log_probs, ids, starts = spiky(char_tokenizer, "call five")
    spans = align(log_probs, ids)
    assert [(s.token, s.start, s.end) for s in spans] == [(t, a, a + SPIKE) for t, a in zip(ids, starts)]
    assert all(s.score == pytest.approx(CONFIDENCE) for s in spans)
    later = align(log_probs, ids, first_frame=100)  # a segment of a long file, from its frame 100
    assert [(s.start, s.end) for s in later] == [(a + 100, a + 100 + SPIKE) for a in starts]
    assert align(log_probs, []) == []


def test_words_start_at_their_first_letter_and_end_after_their_last_in_seconds(char_tokenizer):
    log_probs, ids, starts = spiky(char_tokenizer, "call five")
    words = words_of(align(log_probs, ids), char_tokenizer, FRAME_SECONDS, duration=10.0)
    assert [w.word for w in words] == ["call", "five"]
    pieces = [char_tokenizer.sp.id_to_piece(t) for t in ids]
    letters = [a for a, piece in zip(starts, pieces) if piece != WORD_START]  # "▁" spikes in the pause before
    for word, first, last in ((words[0], letters[0], letters[3]), (words[1], letters[4], letters[7])):
        assert word.start == pytest.approx(first * FRAME_SECONDS)
        assert word.end == pytest.approx((last + SPIKE) * FRAME_SECONDS)
        assert word.confidence == pytest.approx(CONFIDENCE)


def test_word_times_never_pass_the_end_of_the_audio(char_tokenizer):
    log_probs, ids, _ = spiky(char_tokenizer, "nine")
    duration = 0.5  # the last spike ends at frame 25, 1.0 s
    words = words_of(align(log_probs, ids), char_tokenizer, FRAME_SECONDS, duration)
    assert words[0].word == "nine" and words[0].start <= words[0].end == duration
