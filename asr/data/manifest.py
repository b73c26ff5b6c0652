"""Manifests: reading, and checking every line before training starts.

A manifest is JSON lines, one utterance each, the format NeMo uses:

    {"audio_filepath": "audio/0001.flac", "duration": 2.41, "text": "call five two nine"}

with an optional ``offset`` (seconds). A relative path resolves against the manifest's
folder. Training needs every key (``TRAINING_KEYS``); transcription only ``audio_filepath``
(``TRANSCRIPTION_KEYS``): a line without ``duration`` is read to the end of the file (its
length comes from the header, ``check_audio``), one without ``text`` has no reference.

Every problem is reported as ``FILE:LINE: reason``. What happens to bad lines in training is
the setting ``on_bad_line``: ``skip`` (default) drops them, logs how many and why, lists them all in
the run folder, and stops before training only when they are more than ``max_dropped_share`` of the
lines (the rule for files that break mid-run too, asr.data.faults); ``error`` stops at any one.
asr.transcribe reports each and goes on.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import soundfile
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

BAD_LINE_POLICIES = ("error", "skip")
RESAMPLE_POLICIES = ("resample", "error")
TRAINING_KEYS = ("audio_filepath", "duration", "text")  # what a training or evaluation line must have
TRANSCRIPTION_KEYS = ("audio_filepath",)  # what asr.transcribe needs; text is the reference, if any
SHOWN_PROBLEMS = 10  # how many bad lines an error message lists in full
DURATION_TOLERANCE = (0.1, 0.01)  # seconds, and share of the duration: audio this much shorter than its line says is cut short


class ManifestError(ValueError):
    """Bad manifest lines with on_bad_line=error; the message lists FILE:LINE: reason."""


@dataclass(frozen=True)
class FilterConfig:
    """Which lines a run trains and evaluates on, and what becomes of the others (``--data.filter.*``).

    Args:
        min_duration: utterances shorter than this (seconds) are bad lines.
        max_duration: utterances longer than this (seconds), or than data.max_batch_seconds, are bad lines.
        on_bad_line: "skip" drops bad lines (unreadable, truncated or empty audio, bad JSON, text too long
            for the audio, ...), counts them by reason and lists them in the run folder's bad_lines.txt;
            "error" stops before training at the first manifest with any.
        max_dropped_share: the one limit on bad data: with on_bad_line skip, more bad lines than this share
            of a manifest's stop the run before training; audio that fails to load mid-run (deleted or cut
            short since start-up) is dropped from its batch and named, and more than this share of a
            split failing in one pass stops the run.
    """

    min_duration: float = 0.1
    max_duration: float = 20.0
    on_bad_line: Literal["error", "skip"] = "skip"
    max_dropped_share: float = 0.01

    def __post_init__(self):
        if not 0 <= self.min_duration < self.max_duration:
            raise ValueError(f"data.filter.min_duration and max_duration must be 0 <= min_duration < max_duration, "
                             f"got {self.min_duration:g} and {self.max_duration:g}")
        if self.on_bad_line not in BAD_LINE_POLICIES:
            raise ValueError(f"data.filter.on_bad_line must be one of {BAD_LINE_POLICIES}, got {self.on_bad_line!r}")
        if not 0 <= self.max_dropped_share <= 1:
            raise ValueError(f"data.filter.max_dropped_share must be between 0 and 1, got {self.max_dropped_share}")


@dataclass(frozen=True)
class Utterance:
    """One manifest line; ``duration`` is what is read, in seconds (the file's own length without offset;
    ``math.inf`` when the line has none, until ``check_audio`` reads the real one). ``text`` may be ""
    only for transcription (no reference)."""

    audio_filepath: Path
    duration: float
    text: str
    offset: float = 0.0
    has_offset: bool = False  # read only [offset, offset + duration) of the file
    source: str = ""  # "FILE:LINE", for messages


@dataclass(frozen=True)
class Problem:
    source: str  # "FILE:LINE"
    kind: str  # short category for the counts: "malformed json", "missing audio file", ...
    detail: str
    audio: Path | None = None  # the audio file the line names, when it names one

    def __str__(self) -> str:
        return f"{self.source}: {self.kind}: {self.detail}"


def parse_manifest(path: str | Path, required: tuple[str, ...] = TRAINING_KEYS
                   ) -> tuple[list[Utterance], list[Problem]]:
    """Parse every line of ``path``; lines that are not a usable utterance become Problems.

    ``required``: the keys a line must have (TRAINING_KEYS or TRANSCRIPTION_KEYS). A manifest that
    cannot be opened raises OSError (FileNotFoundError, IsADirectoryError, PermissionError).
    """
    path = Path(path)
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative paths start from the current folder, {Path.cwd()})"
        raise FileNotFoundError(f"manifest {path} does not exist{where}")
    utterances, problems = [], []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                problems.append(Problem(f"{path}:{number}", "malformed json", f"not UTF-8 text ({err.reason})"))
                continue
            if not line.strip():
                continue
            item = _parse_line(line, path, f"{path}:{number}", required)
            (problems if isinstance(item, Problem) else utterances).append(item)
    return utterances, problems


def _parse_line(line: str, manifest: Path, source: str, required: tuple[str, ...]) -> Utterance | Problem:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as err:
        return Problem(source, "malformed json", str(err))
    if not isinstance(entry, dict):
        return Problem(source, "malformed json", "a line must be a JSON object")
    missing = [key for key in required if key not in entry]
    if missing:
        return Problem(source, "missing key", f"no {', '.join(missing)}")
    if not isinstance(entry["audio_filepath"], str) or not entry["audio_filepath"]:
        return Problem(source, "bad audio path", f"audio_filepath is {entry['audio_filepath']!r}")
    audio = Path(entry["audio_filepath"])
    audio = audio if audio.is_absolute() else manifest.parent / audio
    text = entry.get("text", "")
    if not isinstance(text, str) or ("text" in required and not text.strip()):
        return Problem(source, "empty text", f"text is {text!r}", audio)
    try:
        duration, offset = float(entry.get("duration", math.inf)), float(entry.get("offset", 0.0))
    except (TypeError, ValueError):
        duration = offset = math.nan
    if not (0 <= offset < math.inf and 0 <= duration and ("duration" not in entry or duration < math.inf)):
        detail = f"duration {entry.get('duration')!r} / offset {entry.get('offset')!r}: seconds, 0 or more"
        return Problem(source, "bad number", detail, audio)
    if not audio.is_file():
        return Problem(source, "missing audio file", str(audio), audio)
    return Utterance(audio, duration, " ".join(text.split()), offset, "offset" in entry, source)


def check_audio(utt: Utterance, sample_rate: int, resample: str) -> tuple[Utterance | Problem, dict]:
    """Read the file's header: unreadable, empty or (with resample=error) wrong-rate audio is a Problem.

    Returns the utterance with its real duration, and notes {"resampled": bool, "stereo": bool}.
    """
    audio = utt.audio_filepath
    try:
        info = soundfile.info(str(audio))
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        reason = "empty file (0 bytes)" if audio.is_file() and audio.stat().st_size == 0 else \
            getattr(err, "error_string", None) or str(err)  # libsndfile's reason without its "Error opening ..."
        return Problem(utt.source, "unreadable audio", _naming(audio, utt.source, reason), audio), {}
    length = info.frames / info.samplerate
    if info.frames == 0 or (utt.has_offset and utt.offset >= length):
        return Problem(utt.source, "empty audio", _naming(audio, utt.source, "no samples to read"), audio), {}
    cut = cut_short(audio, info)
    if cut:
        return Problem(utt.source, "truncated audio", _naming(audio, utt.source, cut), audio), {}
    said = utt.offset + utt.duration if utt.has_offset else utt.duration
    if math.isfinite(said) and shorter_than_said(length, said):
        detail = (f"the line says {'offset + duration' if utt.has_offset else 'duration'} {said:g} s, the audio holds "
                  f"{length:.3f} s")
        return Problem(utt.source, "audio shorter than its line", _naming(audio, utt.source, detail), audio), {}
    if info.samplerate != sample_rate and resample == "error":
        detail = f"{audio} is {info.samplerate} Hz, data.sample_rate is {sample_rate} (data.resample=error)"
        return Problem(utt.source, "wrong sample rate", detail, audio), {}
    duration = min(utt.duration, length - utt.offset) if utt.has_offset else length
    notes = {"resampled": info.samplerate != sample_rate, "stereo": info.channels > 1}
    return replace(utt, duration=duration), notes


def shorter_than_said(seconds: float, said: float) -> bool:
    """Whether ``seconds`` of audio fall short of the ``said`` seconds by more than DURATION_TOLERANCE."""
    return said > seconds + DURATION_TOLERANCE[0] + DURATION_TOLERANCE[1] * said


def cut_short(audio: Path, info) -> str:
    """Why a file holds fewer frames than its header promises ("" if it holds them all): a WAV's data chunk
    is checked against the file's size (libsndfile quietly counts only what is there); any other format
    by reading its last promised frame."""
    if info.format in ("WAV", "WAVEX") and info.subtype.startswith(("PCM", "FLOAT", "DOUBLE", "ULAW", "ALAW")):
        promised = wav_data_bytes(audio)
        width = {"PCM_S8": 1, "PCM_U8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4, "DOUBLE": 8,
                 "ULAW": 1, "ALAW": 1}.get(info.subtype)
        if promised not in (None, 0, 0xFFFFFFFF) and width and promised // (width * info.channels) > info.frames:
            frames = promised // (width * info.channels)
            return (f"its header promises {frames} frames ({frames / info.samplerate:.3f} s), the file holds "
                    f"{info.frames} ({info.frames / info.samplerate:.3f} s): cut short")
        return ""
    try:
        with soundfile.SoundFile(str(audio)) as f:
            f.seek(info.frames - 1)
            if len(f.read(1)) == 1:
                return ""
    except (soundfile.LibsndfileError, RuntimeError, OSError):
        pass
    return f"its header promises {info.frames} frames ({info.frames / info.samplerate:.3f} s) and the last cannot be read: cut short"


def wav_data_bytes(audio: Path) -> int | None:
    """The size a RIFF/WAVE file's header gives its data chunk (None if there is none to read; a stream
    written before its length was known says 0 or 0xFFFFFFFF)."""
    with open(audio, "rb") as f:
        if f.read(12)[8:12] != b"WAVE":
            return None
        while len(chunk := f.read(8)) == 8:
            name, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if name == b"data":
                return size
            f.seek(size + size % 2, 1)
    return None


def _naming(audio: Path, source: str, reason: str) -> str:
    """``reason``, after the audio path unless the message's source already is that path."""
    return reason if source == str(audio) else f"{audio}: {reason}"


def report(problems: list[Problem], manifest: str | Path, total: int, on_bad_line: str, max_share: float = 0.0,
           listing: Path | None = None, settings: str = "data.filter.") -> None:
    """Bad lines of a manifest of ``total``: with on_bad_line=skip they are dropped, counted by reason and
    listed (the first SHOWN_PROBLEMS in the log, all in ``listing`` if given), and ManifestError stops the
    run only when they are more than ``max_share`` of the lines; with on_bad_line=error, any one stops it.
    The messages name the settings as the calling command spells them: ``settings`` + on_bad_line (asr.fit's
    data.filter.on_bad_line, asr.shard's on_bad_line)."""
    if not problems:
        return
    counts = ", ".join(f"{n} {kind}" for kind, n in Counter(p.kind for p in problems).most_common())
    shown = "\n  ".join(str(p) for p in problems[:SHOWN_PROBLEMS])
    if listing is not None:
        listing.parent.mkdir(parents=True, exist_ok=True)
        with open(listing, "a") as f:
            f.writelines(f"{p}\n" for p in problems)
    rest = f"\n  ... and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
    more = f"{rest}{f' (all in {listing})' if listing is not None and rest else ''}"
    if on_bad_line == "error":
        raise ManifestError(
            f"{manifest}: {len(problems)} of {total} lines are unusable ({counts}):\n  {shown}{more}\n"
            f"Fix them, or set --{settings}on_bad_line skip to train without them."
        )
    if len(problems) > max_share * total:
        raise ManifestError(
            f"{manifest}: {len(problems)} of {total} lines are unusable ({counts}), more than "
            f"{settings}max_dropped_share={max_share} allows:\n  {shown}{more}\n"
            f"Fix them, or raise --{settings}max_dropped_share to train without them."
        )
    rank_zero_warn(f"{manifest}: skipped {len(problems)} of {total} lines ({counts}; "
                   f"{settings}max_dropped_share={max_share}):\n  {shown}{more}")


def say_notes(notes: list[dict], manifest: str | Path, sample_rate: int,
              say: Callable[[str], None] = lambda message: rank_zero_info(message)) -> None:
    """Say once per manifest (or run) how many files are resampled or mixed down from stereo, with ``say``."""
    resampled = sum(n.get("resampled", False) for n in notes)
    stereo = sum(n.get("stereo", False) for n in notes)
    if resampled:
        say(f"{manifest}: {resampled} of {len(notes)} files are resampled to {sample_rate} Hz on loading")
    if stereo:
        say(f"{manifest}: {stereo} of {len(notes)} files have several channels and are mixed to mono")
