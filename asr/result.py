"""What a transcription gives back: a Result with its words, their times and confidences.

Word timings come from CTC forced alignment (``torchaudio.functional.forced_align``) of the
decoded token ids against the model's log-probabilities: each token gets the encoder frames
its path occupies. Sentencepiece marks the first piece of a word with "▁", so a word is a
run of tokens starting with such a piece. Times are seconds from the start of the audio
read (a manifest line's ``offset`` is not added): ``start = first frame * frame_seconds``,
``end = (last frame + 1) * frame_seconds``, clipped to the duration. CTC emits a token on
one or a few frames (a "spike"), so ``start`` and ``end`` bracket the spikes, not the
acoustic onset and release: expect them to lag the sound by up to a few frames.
``confidence`` is the mean posterior of the word's aligned frames, in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torchaudio.functional as AF

from asr.tokenizer import BLANK_ID, WORD_START, Tokenizer


@dataclass(frozen=True)
class Span:
    """One decoded token on encoder frames [start, end) of the whole utterance; score = mean posterior."""

    token: int
    start: int
    end: int
    score: float


@dataclass(frozen=True)
class Word:
    word: str
    start: float  # seconds
    end: float  # seconds
    confidence: float  # mean posterior of its aligned frames, 0..1


@dataclass
class Result:
    """One utterance's transcription, or (``error`` set) why an input could not be transcribed."""

    audio_filepath: str | None  # None only for a manifest line that names no file
    duration: float  # seconds of audio transcribed
    text: str
    words: list[Word] = field(default_factory=list)
    reference: str = ""  # the manifest's text, if any
    offset: float | None = None  # the manifest line's offset, if it had one
    error: str = ""  # one line naming the file (and manifest line), e.g. "m.jsonl:4: missing audio file: a.wav"

    def to_json(self) -> dict:
        """The JSONL row: audio_filepath, [offset], duration, text, words, [reference]; a failure's row
        is audio_filepath, [offset], error."""
        row = {"audio_filepath": self.audio_filepath}
        if self.offset is not None:
            row["offset"] = self.offset
        if self.error:
            return row | {"error": self.error}
        row |= {"duration": round(self.duration, 3), "text": self.text}
        row["words"] = [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3),
                         "confidence": round(w.confidence, 3)} for w in self.words]
        if self.reference:
            row["reference"] = self.reference
        return row


def align(log_probs: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]:
    """Token spans of ``ids`` on ``log_probs`` (T', V) fp32; frames are counted from ``first_frame``.

    ``ids`` must be a CTC-feasible labelling of the T' frames (tokens plus repeats <= T'),
    as every CTC decoder's output is.
    """
    if not ids:
        return []
    targets = torch.tensor([ids], dtype=torch.int32)
    path, scores = AF.forced_align(log_probs[None].float().contiguous(), targets, blank=BLANK_ID)
    return [Span(s.token, s.start + first_frame, s.end + first_frame, s.score)
            for s in AF.merge_tokens(path[0], scores[0].exp(), blank=BLANK_ID)]


def words_of(spans: list[Span], tokenizer: Tokenizer, frame_seconds: float, duration: float) -> list[Word]:
    """Group token spans into words (a piece starting with "▁" starts one); times in seconds."""
    groups: list[list[Span]] = []
    for span in spans:
        if not groups or tokenizer.sp.id_to_piece(span.token).startswith(WORD_START):
            groups.append([])
        groups[-1].append(span)
    words = []
    for group in groups:
        text = tokenizer.decode([s.token for s in group]).strip()
        if not text:
            continue
        # a char tokenizer's "▁" is a token of its own, spiking in the pause before the word
        group = [s for s in group if tokenizer.sp.id_to_piece(s.token) != WORD_START] or group
        frames = sum(s.end - s.start for s in group)
        confidence = sum(s.score * (s.end - s.start) for s in group) / frames
        start, end = group[0].start * frame_seconds, group[-1].end * frame_seconds
        words.append(Word(text, min(start, duration), min(end, duration), confidence))
    return words
