"""What a transcription gives back: words with times and confidences, the output formats, and scores.

Word timings come from CTC forced alignment (``torchaudio.functional.forced_align``) of the
decoded token ids against the model's log-probabilities: each token gets the encoder frames
its path occupies. Sentencepiece marks the first piece of a word with "▁", so a word is a
run of tokens starting with such a piece. Times are seconds from the start of the audio
read (a manifest line's ``offset`` is not added): ``start = first frame * frame_seconds``,
``end = (last frame + 1) * frame_seconds``, clipped to the duration. CTC emits a token on
one or a few frames (a "spike"), so ``start`` and ``end`` bracket the spikes, not the
acoustic onset and release: expect them to lag the sound by up to a few frames.
``confidence`` is the mean posterior of the word's aligned frames, in [0, 1].

Formats: ``jsonl`` (one JSON object per utterance: audio_filepath, duration, text, words,
and reference when one is given; an input that failed: audio_filepath, offset if any, and
error), ``txt`` (the text), ``srt`` and ``vtt`` (subtitle cues
of at most ``CUE_CHARS`` characters and ``CUE_SECONDS`` seconds, broken at pauses).

Every file asr writes whole (outputs, checkpoints, exports, caches) goes through
``write_atomically``: it appears under its name complete, or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jiwer
import torch
import torchaudio.functional as AF

from asr.tokenizer import BLANK_ID, WORD_START, Tokenizer

CUE_CHARS = 42  # longest subtitle line, the usual broadcast limit
CUE_SECONDS = 5.0  # longest subtitle cue
CUE_PAUSE = 1.0  # a silence this long between words starts a new cue
FORMATS = ("jsonl", "txt", "srt", "vtt")


@contextlib.contextmanager
def write_atomically(path: str | Path) -> Iterator[Path]:
    """Yield a new temporary file beside ``path`` to write; when the block ends without an error it is
    renamed to ``path``, otherwise deleted. A reader, or a resumed run, never sees half a file, and
    writers racing for one path (ranks caching the same figure) each rename a whole file of their own."""
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".partial")
    os.close(handle)
    partial = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o666 & ~umask)  # mkstemp makes it 0600: a checkpoint teammates cannot read
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


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


def cues(words: list[Word]) -> list[list[Word]]:
    """Words grouped into subtitle cues: a cue ends at a pause, at CUE_CHARS characters or CUE_SECONDS."""
    groups: list[list[Word]] = []
    for word in words:
        if groups:
            cue = groups[-1]
            chars = sum(len(w.word) + 1 for w in cue) + len(word.word)
            if word.start - cue[-1].end < CUE_PAUSE and chars <= CUE_CHARS and word.end - cue[0].start <= CUE_SECONDS:
                cue.append(word)
                continue
        groups.append([word])
    return groups


def timestamp(seconds: float, separator: str) -> str:
    """HH:MM:SS,mmm (SRT, separator ",") or HH:MM:SS.mmm (WebVTT, separator ".")."""
    millis = int(round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def subtitles(result: Result, kind: str) -> str:
    """The result as an SRT or WebVTT document; a cue lasts at least one millisecond."""
    separator = "," if kind == "srt" else "."
    blocks = []
    for number, cue in enumerate(cues(result.words), start=1):
        start, end = cue[0].start, max(cue[-1].end, cue[0].start + 0.001)
        timing = f"{timestamp(start, separator)} --> {timestamp(end, separator)}"
        text = " ".join(w.word for w in cue)
        blocks.append(f"{number}\n{timing}\n{text}\n" if kind == "srt" else f"{timing}\n{text}\n")
    header = "" if kind == "srt" else "WEBVTT\n\n"
    return header + "\n".join(blocks)


def render(result: Result, kind: str) -> str:
    """The text of one output file (or stdout block) for ``result`` in format ``kind`` (FORMATS)."""
    if kind == "jsonl":
        return json.dumps(result.to_json(), ensure_ascii=False) + "\n"
    if kind == "txt":
        return result.text + "\n"
    if kind in ("srt", "vtt"):
        return subtitles(result, kind)
    raise ValueError(f"--format must be one of {FORMATS}, got {kind!r}")


def score(references: list[str], hypotheses: list[str]) -> dict:
    """WER and CER with jiwer's edit counts: {"wer", "cer", "words": {...}, "chars": {...}}.

    Each count dict holds substitutions, deletions, insertions and the reference length ``n``;
    error rate = (substitutions + deletions + insertions) / n over the whole set.
    """
    out = {}
    for unit, edits in (("words", jiwer.process_words), ("chars", jiwer.process_characters)):
        o = edits(references, hypotheses)
        out[unit] = {"substitutions": o.substitutions, "deletions": o.deletions, "insertions": o.insertions,
                     "n": o.hits + o.substitutions + o.deletions}
    for rate, unit in (("wer", "words"), ("cer", "chars")):
        c = out[unit]
        out[rate] = (c["substitutions"] + c["deletions"] + c["insertions"]) / max(c["n"], 1)
    return out


def score_line(scores: dict, utterances: int) -> str:
    w = scores["words"]
    return (f"WER {scores['wer']:.4f}  CER {scores['cer']:.4f}  ({utterances} references, {w['n']} words: "
            f"{w['substitutions']} substitutions, {w['deletions']} deletions, {w['insertions']} insertions)")


@dataclass
class Tally:
    """What a run of asr.transcribe did, for its closing lines and exit code."""

    done: int = 0  # inputs transcribed in this run
    failed: int = 0
    skipped: int = 0  # inputs already done in the output by an earlier run
    audio_seconds: float = 0.0  # of the inputs transcribed
    scored: list[tuple[str, str]] = field(default_factory=list)  # (reference, hypothesis), earlier runs' too
    unscored: int = 0  # transcribed without a reference text

    def add(self, result: Result) -> None:
        if result.error:
            self.failed += 1
            return
        self.done, self.audio_seconds = self.done + 1, self.audio_seconds + result.duration
        if result.reference:
            self.scored.append((result.reference, result.text))
        else:
            self.unscored += 1

    def summary(self, elapsed: float) -> str:
        """Files and audio transcribed, real-time factor (``elapsed`` s), failures, WER/CER of the references."""
        text = f"{self.done} files, {self.audio_seconds:.1f} s of audio in {elapsed:.2f} s"
        if self.audio_seconds:
            text += f": real-time factor {elapsed / self.audio_seconds:.4f}"
        if self.failed:
            text += f"\n{self.failed} of {self.done + self.failed} inputs failed (each named above)"
        if self.scored:
            text += "\n" + score_line(score(*map(list, zip(*self.scored))), len(self.scored))
            if self.unscored:
                text += f"; {self.unscored} without text not scored"
        return text


class JsonlFile:
    """``--output FILE.jsonl``: appends one line per result (failures too) and flushes it; a rerun skips
    what is there and retries what failed.

    Done means: a complete line (ending in a newline) with the same audio_filepath and offset, and
    no error. A last line without its newline, torn when a run was stopped, is cut off and redone.
    ``rows``: the done lines, for scoring.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = [row for row in self._read_done() if "error" not in row]
        self.done = {(row["audio_filepath"], row.get("offset")) for row in self.rows}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")

    def _read_done(self) -> list[dict]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            with self.path.open("r+b") as f:
                f.truncate(len(data))
        rows = []
        for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            try:
                row = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                row = "bad"
            if row is not None and not (isinstance(row, dict) and "audio_filepath" in row
                                        and ("text" in row or "error" in row)):
                raise ValueError(f"{self.path}:{number}: not a line written by asr.transcribe; "
                                 "choose another --output or move this file away")
            rows += [row] if row else []
        return rows

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        return (audio_filepath, offset) in self.done

    def write(self, result: Result, name: str) -> None:
        self.file.write(render(result, "jsonl"))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class OutputDir:
    """``--output_dir DIR``: one file per input, ``DIR/<name><suffix>``, written to a temporary file and
    renamed, so an existing file is a complete one and a rerun skips its input."""

    SUFFIXES = {"jsonl": ".json", "txt": ".txt", "srt": ".srt", "vtt": ".vtt"}

    def __init__(self, root: str | Path, kind: str):
        self.root, self.kind, self.rows = Path(root), kind, []

    def target(self, name: str) -> Path:
        return self.root / (name + self.SUFFIXES[self.kind])

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        return self.target(name).exists()

    def write(self, result: Result, name: str) -> None:
        if result.error:  # no file, so that a rerun retries it; the error is on stderr
            return
        target = self.target(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with write_atomically(target) as partial:
            partial.write_text(render(result, self.kind), encoding="utf-8")

    def close(self) -> None:
        pass


class Stdout:
    """No output file: txt prints "path<TAB>text" lines, the other formats their documents; of a failure,
    only jsonl prints its row."""

    def __init__(self, kind: str):
        self.kind, self.rows = kind, []

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        return False

    def write(self, result: Result, name: str) -> None:
        if result.error and self.kind != "jsonl":  # the error is on stderr; stdout keeps to transcripts
            return
        text = f"{result.audio_filepath}\t{result.text}\n" if self.kind == "txt" else render(result, self.kind)
        sys.stdout.write(text)
        sys.stdout.flush()

    def close(self) -> None:
        pass
