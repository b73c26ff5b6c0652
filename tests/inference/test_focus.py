"""The second pass (asr/inference/focus.py): speech framed by seconds of non-speech keeps its words, whether the
model takes the statistics' samples or is run on the speech's audio alone, in one pass and in chunks; speech that
fills its file and files without speech are run once.

LevelModel hears a tone only where it is louder than a share of the mean power of the frames its statistics come
from, as a model whose features are normalised by them hears speech on the scale they set. QuietModel hears
nothing where most of those frames are near-silent, as a model whose statistics silence drags down (the Czech
recipe's, trained with every frame counted): there the first pass decodes nothing, and the loud part of the
file (asr.inference.result.speech_mask) stands for the speech.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from asr.inference.transcriber import Transcriber
from asr.tokenizer import BLANK_ID
from tests.tones import FRAME, RATE, TONE, ToneModel, tones

HEARD = 1 / 5  # of the statistics' mean power: a tone's frame below it is not heard
WORDS = [("call", 1.0), ("five", 0.3), ("two", 0.3), ("nine", 1.0)]  # the middle words 10 dB quieter


def counted(statistics: torch.Tensor | None, out_lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, frames): the frames of ``statistics``' samples (all of the utterance's without them)."""
    start, end = (torch.zeros_like(out_lengths), out_lengths) if statistics is None else (statistics // FRAME).T
    index = torch.arange(frames)[None, :]
    return (index >= start[:, None]) & (index < end[:, None]) & (index < out_lengths[:, None])


def heard_only(log_probs: torch.Tensor, heard: torch.Tensor) -> torch.Tensor:
    """ToneModel's ``log_probs`` with blank on the frames not ``heard``."""
    best = torch.where(heard, log_probs.argmax(-1), BLANK_ID)
    return (torch.nn.functional.one_hot(best, log_probs.shape[-1]) * 6.0).log_softmax(-1)


class LevelModel(ToneModel):
    """ToneModel that hears a frame's tone only if its power is above HEARD x the mean power of the frames of
    ``statistics``' samples (all of the utterance's without them); nothing below 150 Hz (mains hum)."""

    def log_probs(self, audio, lengths, statistics=None):
        log_probs, out_lengths = super().log_probs(audio, lengths)
        frames = log_probs.shape[1]
        x = audio[:, : frames * FRAME].reshape(len(audio), frames, FRAME)
        power = x.pow(2).mean(-1)
        within = counted(statistics, out_lengths, frames)
        mean = (power * within).sum(1, keepdim=True) / within.sum(1, keepdim=True)
        low = torch.fft.rfft(x).abs().argmax(-1) * RATE / FRAME < 150
        return heard_only(log_probs, (power > HEARD * mean) & ~low), out_lengths


class QuietModel(ToneModel):
    """ToneModel that hears nothing where over 2/3 of the frames of ``statistics``' samples are near-silent
    (power under 1e-6: -60 dB)."""

    def log_probs(self, audio, lengths, statistics=None):
        log_probs, out_lengths = super().log_probs(audio, lengths)
        frames = log_probs.shape[1]
        power = audio[:, : frames * FRAME].reshape(len(audio), frames, FRAME).pow(2).mean(-1)
        within = counted(statistics, out_lengths, frames)
        deaf = ((power < 1e-6) & within).sum(1) > within.sum(1) * 2 / 3
        return heard_only(log_probs, ~deaf[:, None].expand(-1, frames)), out_lengths


class CroppedQuietModel(QuietModel):
    """QuietModel without a ``statistics`` argument: the second pass crops."""

    def log_probs(self, audio, lengths):
        return super().log_probs(audio, lengths)


class CroppedModel(LevelModel):
    """The same without a ``statistics`` argument (an exported model, or your own): the second pass crops."""

    def log_probs(self, audio, lengths):
        return super().log_probs(audio, lengths)


def framed(tmp_path, tokenizer, before: float, after: float | None = None, name: str = "framed.wav"):
    """WORDS as LevelModel's tones with seconds of loud 60 Hz hum ``before`` and ``after`` them (default: as
    before): (path, each word's (start, end) seconds)."""
    speech, spans, offset = [], [], before
    for word, level in WORDS:
        audio, word_spans = tones(tokenizer, word, pause=2)
        spans += [(a + offset, b + offset) for a, b in word_spans]
        speech.append(audio * level)
        offset += len(audio) / RATE
    path = tmp_path / name
    soundfile.write(path, np.concatenate([hum(before), *speech, hum(before if after is None else after)]), RATE,
                    subtype="FLOAT")
    return path, spans


def hum(seconds: float) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * 60 * np.arange(round(seconds * RATE)) / RATE)).astype(np.float32)


def hiss(seconds: float, seed: int = 0) -> np.ndarray:
    """White noise at -80 dBFS: a quiet line, or dither."""
    return (1e-4 * np.random.default_rng(seed).standard_normal(round(seconds * RATE))).astype(np.float32)


@pytest.mark.parametrize("model_class", [QuietModel, CroppedQuietModel])
@pytest.mark.parametrize("chunk_seconds", [0.0, 10.0])
def test_speech_in_long_quiet_that_the_first_pass_decodes_nothing_of_keeps_its_words(tmp_path, char_tokenizer,
                                                                                      model_class, chunk_seconds):
    """No token to find the speech by: the loud part of the file stands for it, in one pass and in chunks."""
    before, after = (2.0, 10.0) if chunk_seconds else (4.0, 4.0)
    speech, spans = tones(char_tokenizer, "call five two nine", pause=2)
    path = tmp_path / "quiet.wav"
    silence = [np.zeros(round(seconds * RATE), np.float32) for seconds in (before, after)]
    audio = np.concatenate([silence[0], speech, silence[1]])
    soundfile.write(path, audio + hiss(len(audio) / RATE), RATE, subtype="FLOAT")  # the line's hiss throughout
    model = model_class(char_tokenizer)
    options = {"chunk_seconds": chunk_seconds, "overlap_seconds": 2.0}
    assert Transcriber(model, second_pass=0, **options).transcribe([path]) == [""]  # the hiss in the statistics
    result = Transcriber(model, **options).transcribe_results([path])[0]
    assert result.text == "call five two nine" and not result.error
    for word, (start, end) in zip(result.words, spans):
        assert word.start == pytest.approx(start + before, abs=0.041)
        assert word.end == pytest.approx(end + before, abs=0.041)
    only_hiss = tmp_path / "hiss.wav"  # steady non-speech: nothing loud to run again
    soundfile.write(only_hiss, hiss(8.0), RATE, subtype="FLOAT")
    model.calls = 0
    assert Transcriber(model, **options).transcribe([only_hiss]) == [""] and model.calls == 1


@pytest.mark.parametrize("model_class", [LevelModel, CroppedModel])
@pytest.mark.parametrize("chunk_seconds", [0.0, 10.0])
def test_speech_framed_by_hum_keeps_its_words_in_a_second_pass(tmp_path, char_tokenizer, model_class, chunk_seconds):
    """In chunks (16 s in 10 s chunks), each segment cut at the first pass's pauses is run again as a file is."""
    path, spans = framed(tmp_path, char_tokenizer, before=2.0, after=10.0) if chunk_seconds else \
        framed(tmp_path, char_tokenizer, before=4.0)
    model = model_class(char_tokenizer)
    options = {"chunk_seconds": chunk_seconds, "overlap_seconds": 2.0}
    once = Transcriber(model, second_pass=0, **options).transcribe_results([path])[0]
    assert once.text == "call nine"  # the hum's power in the statistics: the quiet words are not heard
    result = Transcriber(model, **options).transcribe_results([path])[0]
    assert result.text == "call five two nine" and not result.error
    for word, (start, end) in zip(result.words, spans):  # times in the file, not in the span run again
        assert word.start == pytest.approx(start, abs=0.041) and word.end == pytest.approx(end, abs=0.041)
    tone_frames = TONE * sum(len(char_tokenizer.encode(word)) for word, _ in WORDS)  # the rest is blank
    assert result.blank_share == pytest.approx(1 - tone_frames / (result.duration / model.frame_seconds), abs=0.01)


def test_the_second_pass_runs_where_the_speech_is_under_its_share_of_the_file(tmp_path, char_tokenizer):
    model = LevelModel(char_tokenizer)
    alone, _ = framed(tmp_path, char_tokenizer, before=0.0, name="alone.wav")  # speech fills the file
    short, _ = framed(tmp_path, char_tokenizer, before=0.5, name="short.wav")  # 0.5 s a side: the span is 90%
    only_hum = tmp_path / "hum.wav"  # no word: nothing to run again
    soundfile.write(only_hum, hum(5.0), RATE)
    for path, text in [(alone, "call five two nine"), (short, "call five two nine"), (only_hum, "")]:
        model.calls = 0
        assert Transcriber(model).transcribe([path]) == [text] and model.calls == 1, path.name
    model.calls = 0
    assert Transcriber(model, second_pass=1.0).transcribe([short]) == ["call five two nine"] and model.calls == 2


def test_second_pass_out_of_range_is_refused_by_its_flag(char_tokenizer):
    with pytest.raises(ValueError, match="--second_pass must be between 0 and 1, got 1.5"):
        Transcriber(ToneModel(char_tokenizer), second_pass=1.5)
