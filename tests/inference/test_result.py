"""Word timings (asr/inference/result.py): forced alignment puts each decoded token on the frames where the
model emitted it, and words get times in seconds and confidences from their tokens' frames;
given the audio's loudness, the times move onto the speech around the spikes.

The log-probs are built by hand: each token of the text spikes for SPIKE frames after GAP blank
frames, with posterior CONFIDENCE, so every token's frames, and so every word's times, are known.
"""

from __future__ import annotations

import random

import pytest
import torch

from asr.inference.result import Word, runs, snap_to_speech, speech_mask, words_of
from asr.models.ctc_decoding import align
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


def loud(*stretches: tuple[float, float], seconds: float = 3.0, hop: float = 0.01) -> torch.Tensor:
    """Loudness (dB per hop): -60 dB of quiet, -10 dB in each (start, end) stretch of speech."""
    levels = torch.full((round(seconds / hop),), -60.0)
    for start, end in stretches:
        levels[round(start / hop): round(end / hop)] = -10.0
    return levels


def test_words_take_the_speech_around_their_spikes_not_the_silence_they_spiked_in():
    # a Conformer's spikes: the first word's at 0.00 s in the lead silence, the second's one frame before its onset
    words = [Word("call", 0.0, 0.04, 0.9), Word("five", 0.76, 0.8, 0.9), Word("two", 1.52, 1.56, 0.9)]
    levels = loud((0.25, 0.62), (0.8, 1.1), (1.5, 1.8))
    snapped = snap_to_speech(words, levels, 0.01)
    assert [(w.word, w.confidence) for w in snapped] == [(w.word, w.confidence) for w in words]
    assert [t for w in snapped for t in (w.start, w.end)] == pytest.approx([0.25, 0.62, 0.8, 1.1, 1.5, 1.8])


def test_a_word_spanning_a_pause_keeps_both_stretches_and_never_crosses_its_neighbours():
    # "ty" spikes at 0.52 and 0.70 s (two pieces) over a 0.1 s pause, so both stretches are its; "two"
    # follows it with no pause, so "ty" ends at "two"'s spike
    words = [Word("seven", 0.3, 0.34, 0.9), Word("ty", 0.52, 0.74, 0.9), Word("two", 0.9, 0.94, 0.9)]
    levels = loud((0.3, 0.42), (0.52, 0.6), (0.7, 1.2))
    snapped = [t for w in snap_to_speech(words, levels, 0.01) for t in (w.start, w.end)]
    assert snapped == pytest.approx([0.3, 0.42, 0.52, 0.9, 0.9, 1.2])


def test_a_word_emitted_before_its_speech_shares_the_next_words_speech_by_letters():
    # the Conformer's "enter number": "enter" at 0.00 s in the lead silence, "number" at the onset of "enter"
    words = [Word("enter", 0.0, 0.04, 0.9), Word("number", 0.12, 0.16, 0.9)]
    snapped = snap_to_speech(words, loud((0.12, 0.89)), 0.01)
    assert [t for w in snapped for t in (w.start, w.end)] == pytest.approx([0.12, 0.47, 0.47, 0.89])
    # a word far before any speech (an insertion in a long pause) keeps its times
    far = [Word("oh", 0.2, 0.24, 0.5), Word("two", 1.5, 1.54, 0.9)]
    assert snap_to_speech(far, loud((1.5, 1.8)), 0.01)[0] == far[0]


def test_a_stop_closure_inside_speech_is_speech_and_a_longer_pause_is_not():
    mask = speech_mask(loud((0.2, 0.5), (0.54, 0.8), (0.9, 1.2)), 0.01)
    assert mask[52] and not mask[85] and not mask[10]


def test_without_quiet_stretches_to_tell_apart_the_words_keep_their_spike_times():
    words = [Word("call", 0.0, 0.04, 0.9), Word("five", 0.76, 0.8, 0.9)]
    noisy = -20 + 10 * torch.rand(300, generator=torch.Generator().manual_seed(0))  # 10 dB of noise, no pause
    assert speech_mask(noisy, 0.01) is None
    assert snap_to_speech(words, noisy, 0.01) == words


def test_digital_silence_around_a_recording_does_not_count_as_its_quiet():
    levels = loud((0.3, 0.7), (1.2, 1.6), seconds=2.0) + torch.rand(200, generator=torch.Generator().manual_seed(0))
    padded = torch.cat([torch.full((100,), -100.0), levels, torch.full((100,), -100.0)])  # 1 s of zeros each side
    words = [Word("a", 1.28, 1.32, 0.9), Word("b", 2.16, 2.2, 0.9)]
    assert [t for w in snap_to_speech(words, padded, 0.01) for t in (w.start, w.end)] == pytest.approx([1.3, 1.7, 2.2, 2.6])


def test_clean_connected_speech_is_one_stretch_though_its_quietest_sounds_are_quiet():
    # data/mini/audio/test/000000.flac, "enter number": zeros before and after, and between the words 30 ms of
    # zeros then a quiet nasal onset 30 dB under the vowels
    levels = torch.cat([torch.full((12,), -100.0), torch.full((16,), -28.0), torch.full((3,), -100.0),
                        torch.tensor([-57.0, -57.0, -51.0, -52.0, -57.0]), torch.full((50,), -30.0), torch.full((20,), -100.0)])
    assert runs(speech_mask(levels, 0.01)) == [(12, 86)]


def test_a_word_past_the_measured_audio_keeps_its_times():
    words = [Word("b", 1.08, 1.12, 0.9)]  # a model with more frames than the loudness has hops for
    assert snap_to_speech(words, loud((0.05, 0.3), seconds=1.0), 0.01) == words


def test_snapped_words_keep_their_number_and_order_and_never_overlap():
    rng = random.Random(0)
    for trial in range(300):
        hops = rng.randint(20, 300)
        levels = -60 + torch.randn(hops, generator=torch.Generator().manual_seed(trial))
        for _ in range(rng.randint(1, 6)):
            a = rng.randrange(hops)
            levels[a: a + rng.randint(1, 60)] = rng.uniform(-30, -5)
        frames = sorted(rng.sample(range(hops // 4), rng.randint(1, min(8, hops // 4))))
        words = [Word("w" * rng.randint(1, 5), f * 0.04, (f + 1) * 0.04, 0.9) for f in frames]
        snapped = snap_to_speech(words, levels, 0.01)
        assert [w.word for w in snapped] == [w.word for w in words]
        assert all(w.start < w.end for w in snapped)
        assert all(b.start >= a.end - 1e-9 for a, b in zip(snapped, snapped[1:]))
