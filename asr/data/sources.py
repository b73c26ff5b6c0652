"""Data sources: where a split's utterances and their audio come from. ``Source`` is the contract the DataModule's
map-style path batches from and asr.transcribe's inputs are listed by: ``ManifestSource`` (NeMo's JSON lines,
asr.data.manifest), ``AudioFiles`` (an audio file, or a folder of them: transcription's, no text).
Streamed training data (Lhotse Shar shards) is asr.data.shards: a stream has no ``parse`` of every entry.

    source.parse() -> (utterances, problems)        every entry, and the entries malformed as written
    source.check(utt, sample_rate, resample) -> (utterance or problem, note)    whether its audio is usable
    source.read(utt) -> (samples (n,) float32, rate)   its audio, AudioError naming it if it cannot be read

An utterance is an ``asr.data.manifest.Utterance`` (source: "FILE:LINE", audio_filepath, duration, text,
offset). ``source_for(path, flag)`` picks the source for a path: the one place a new kind plugs in.
``read_utterance`` reads an utterance's audio whole (training, asr.shard, asr.transcribe), ``UtteranceAudio`` in
pieces from its file opened once (asr.transcribe's long files and ``--stream`` replay): one wording of every error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from asr.audio import AudioError, AudioFile, check_finite, load_audio
from asr.data import manifest as mf

AUDIO_SUFFIXES = (".flac", ".wav", ".ogg", ".mp3", ".opus", ".aiff", ".aif")  # what a folder's listing takes
MANIFEST_SUFFIXES = (".json", ".jsonl")  # a file given for transcription is a manifest by these, else audio


class Source(Protocol):
    name: str  # what messages call it: the path a flag gave

    def parse(self) -> tuple[list[mf.Utterance], list[mf.Problem]]: ...

    def check(self, utt: mf.Utterance, sample_rate: int, resample: str) -> tuple[mf.Utterance | mf.Problem, dict]: ...

    def read(self, utt: mf.Utterance) -> tuple[np.ndarray, int]: ...


@contextlib.contextmanager
def naming(utt: mf.Utterance) -> Iterator[None]:
    """An AudioError raised inside (its message names the file) also names the utterance's manifest line, FILE:LINE,
    where it has one: the one wording of an unreadable utterance, read whole or in pieces."""
    try:
        yield
    except AudioError as err:
        named = str(err) if utt.source in ("", str(utt.audio_filepath)) else f"{utt.source}: {err}"
        raise AudioError(named) from err


def check_length(utt: mf.Utterance, seconds: float) -> None:
    """AudioError if the utterance's file ended after ``seconds`` of it, shorter than its duration says (a file cut
    short since it was checked; a duration of 0: not known, never short)."""
    if mf.shorter_than_said(seconds, utt.duration):
        raise AudioError(f"{utt.audio_filepath}: holds {seconds:.3f} s, {utt.duration:.3f} s expected (its line, or "
                         "its header at start-up): cut short since it was listed")


def read_utterance(utt: mf.Utterance) -> tuple[np.ndarray, int]:
    """The utterance's samples (n,) float32 and rate: the one reader of an utterance's audio, whatever listed it.
    AudioError naming it (its FILE:LINE, and the file) if they cannot be read, are not finite, or are shorter than
    its duration says (a file cut short since it was checked)."""
    with naming(utt):
        samples, rate = load_audio(utt.audio_filepath, utt.offset, utt.duration if utt.has_offset else None)
        check_finite(samples, str(utt.audio_filepath))
        check_length(utt, len(samples) / rate)
    return samples, rate


class UtteranceAudio:
    """An utterance's audio read in pieces, its file opened once (a context manager): ``read_utterance`` for audio
    too long to hold (asr.inference.longform's chunks, asr.transcribe ``--stream``'s replay of a file). Samples are
    mono float32 at the file's own ``rate``, counted from the utterance's offset; it ends at offset + duration
    where it has an offset, else at the file's end. Every AudioError is read_utterance's: a file that cannot be
    opened or read, non-finite samples, a file that ends before its duration says."""

    def __init__(self, utt: mf.Utterance):
        self.utt = utt
        with naming(utt):
            self.file = AudioFile(utt.audio_filepath)
        self.rate = self.file.rate
        self.start = round(utt.offset * self.rate) if utt.has_offset else 0  # the file's sample of its sample 0
        self.end = round(utt.duration * self.rate) if utt.has_offset else None  # its length, None: the file's end

    def read(self, start: int, count: int) -> np.ndarray:
        """Its samples [start, start + count), (n,) float32; fewer only where it ends."""
        if self.end is not None:
            count = max(0, min(count, self.end - start))
        with naming(self.utt):
            samples = self.file.read(self.start + start, count)
            check_finite(samples, str(self.utt.audio_filepath))
            if len(samples) < count:  # the file ended
                check_length(self.utt, (start + len(samples)) / self.rate)
        return samples

    def pieces(self, size: int) -> Iterator[np.ndarray]:
        """Its samples from start to end in consecutive pieces of ``size`` (the last may be shorter)."""
        start = 0
        while len(piece := self.read(start, size)):
            yield piece
            start += len(piece)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "UtteranceAudio":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ManifestSource:
    """A JSON-lines manifest; each line's audio file is opened at start-up (``check``: header, rate, length).
    ``required``: the keys a line must have (asr.data.manifest.TRAINING_KEYS, or TRANSCRIPTION_KEYS)."""

    def __init__(self, path: str, flag: str, required: tuple[str, ...] = mf.TRAINING_KEYS):
        self.name, self.flag, self.required = path, flag, required

    def parse(self) -> tuple[list[mf.Utterance], list[mf.Problem]]:
        """``mf.parse_manifest``; a manifest that cannot be opened is a ManifestError naming its flag."""
        try:
            return mf.parse_manifest(self.name, self.required)
        except OSError as err:
            raise mf.ManifestError(f"{self.flag}: {err}") from err

    def check(self, utt: mf.Utterance, sample_rate: int, resample: str) -> tuple[mf.Utterance | mf.Problem, dict]:
        return mf.check_audio(utt, sample_rate, resample)

    def read(self, utt: mf.Utterance) -> tuple[np.ndarray, int]:
        return read_utterance(utt)


class AudioFiles(ManifestSource):
    """An audio file, or a folder and every audio file below it (sorted): utterances without text, for
    transcription. A folder without audio, or one that cannot be read, is a Problem naming it."""

    def parse(self) -> tuple[list[mf.Utterance], list[mf.Problem]]:
        if "text" in self.required:
            raise mf.ManifestError(f"{self.flag}: {self.name} is a folder or audio file: training and evaluation "
                                   "need a manifest of its utterances with their text (docs/data.md)")
        root = Path(self.name)
        if not root.is_dir():
            return [mf.Utterance(root, 0.0, "", source=self.name)], []
        errors: list[OSError] = []
        files = sorted(Path(folder) / name for folder, _, names in os.walk(root, onerror=errors.append)
                       for name in names if Path(name).suffix.lower() in AUDIO_SUFFIXES)
        problems = [mf.Problem(err.filename, "unreadable folder", err.strerror or str(err), Path(err.filename))
                    for err in errors]
        if not files and not problems:
            problems.append(mf.Problem(self.name, "no audio", f"no audio files ({', '.join(AUDIO_SUFFIXES)}) below "
                                       "this folder", root))
        return [mf.Utterance(p, 0.0, "", source=str(p)) for p in files], problems


def source_for(path: str, flag: str, required: tuple[str, ...] = mf.TRAINING_KEYS) -> Source:
    """The source of ``path`` (given by ``flag``, e.g. data.train_manifest): a folder, or where text is not
    required a file without a manifest's suffix, is audio files (AudioFiles); anything else a JSON-lines manifest."""
    if Path(path).is_dir() or ("text" not in required and Path(path).suffix.lower() not in MANIFEST_SUFFIXES):
        return AudioFiles(path, flag, required)
    return ManifestSource(path, flag, required)
