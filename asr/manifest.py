"""Manifests: reading, and checking every line before training starts.

A manifest is JSON lines, one utterance each, the format NeMo uses:

    {"audio_filepath": "audio/0001.flac", "duration": 2.41, "text": "call five two nine"}

with an optional ``offset`` (seconds). A relative path resolves against the manifest's
folder. Every problem is reported as ``FILE:LINE: reason``. What happens to bad lines is
the setting ``on_bad_line``: ``error`` (default) stops before training with the list,
``skip`` drops them and logs how many and why.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import soundfile
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

BAD_LINE_POLICIES = ("error", "skip")
RESAMPLE_POLICIES = ("resample", "error")
SHOWN_PROBLEMS = 10  # how many bad lines an error message lists in full


class ManifestError(ValueError):
    """Bad manifest lines with on_bad_line=error; the message lists FILE:LINE: reason."""


@dataclass(frozen=True)
class Utterance:
    """One manifest line; ``duration`` is what is read, in seconds (the file's own length without offset)."""

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

    def __str__(self) -> str:
        return f"{self.source}: {self.kind}: {self.detail}"


def parse_manifest(path: str | Path) -> tuple[list[Utterance], list[Problem]]:
    """Parse every line of ``path``; lines that are not a usable utterance become Problems."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"manifest {path} does not exist")
    utterances, problems = [], []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            item = _parse_line(line, path, f"{path}:{number}")
            (problems if isinstance(item, Problem) else utterances).append(item)
    return utterances, problems


def _parse_line(line: str, manifest: Path, source: str) -> Utterance | Problem:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as err:
        return Problem(source, "malformed json", str(err))
    if not isinstance(entry, dict):
        return Problem(source, "malformed json", "a line must be a JSON object")
    missing = [key for key in ("audio_filepath", "duration", "text") if key not in entry]
    if missing:
        return Problem(source, "missing key", f"no {', '.join(missing)}")
    text = entry["text"]
    if not isinstance(text, str) or not text.strip():
        return Problem(source, "empty text", f"text is {text!r}")
    try:
        duration, offset = float(entry["duration"]), float(entry.get("offset", 0.0))
    except (TypeError, ValueError):
        return Problem(source, "bad number", f"duration {entry['duration']!r} / offset {entry.get('offset')!r}")
    if not isinstance(entry["audio_filepath"], str) or not entry["audio_filepath"]:
        return Problem(source, "bad audio path", f"audio_filepath is {entry['audio_filepath']!r}")
    audio = Path(entry["audio_filepath"])
    audio = audio if audio.is_absolute() else manifest.parent / audio
    if not audio.is_file():
        return Problem(source, "missing audio file", str(audio))
    return Utterance(audio, duration, " ".join(text.split()), offset, "offset" in entry, source)


def check_audio(utt: Utterance, sample_rate: int, resample: str) -> tuple[Utterance | Problem, dict]:
    """Read the file's header: unreadable, empty or (with resample=error) wrong-rate audio is a Problem.

    Returns the utterance with its real duration, and notes {"resampled": bool, "stereo": bool}.
    """
    try:
        info = soundfile.info(str(utt.audio_filepath))
    except (soundfile.LibsndfileError, RuntimeError) as err:
        return Problem(utt.source, "unreadable audio", f"{utt.audio_filepath}: {err}"), {}
    length = info.frames / info.samplerate
    if info.frames == 0 or (utt.has_offset and utt.offset >= length):
        return Problem(utt.source, "empty audio", f"{utt.audio_filepath} has no samples to read"), {}
    if info.samplerate != sample_rate and resample == "error":
        detail = f"{utt.audio_filepath} is {info.samplerate} Hz, data.sample_rate is {sample_rate} (data.resample=error)"
        return Problem(utt.source, "wrong sample rate", detail), {}
    duration = min(utt.duration, length - utt.offset) if utt.has_offset else length
    notes = {"resampled": info.samplerate != sample_rate, "stereo": info.channels > 1}
    return replace(utt, duration=duration), notes


def report(problems: list[Problem], manifest: str | Path, total: int, on_bad_line: str) -> None:
    """Raise ManifestError (on_bad_line=error) or log the skipped lines with counts per reason."""
    if not problems:
        return
    counts = ", ".join(f"{n} {kind}" for kind, n in Counter(p.kind for p in problems).most_common())
    shown = "\n  ".join(str(p) for p in problems[:SHOWN_PROBLEMS])
    more = f"\n  ... and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
    if on_bad_line == "error":
        raise ManifestError(
            f"{manifest}: {len(problems)} of {total} lines are unusable ({counts}):\n  {shown}{more}\n"
            "Fix them, or set --data.on_bad_line skip to train without them."
        )
    rank_zero_warn(f"{manifest}: skipped {len(problems)} of {total} lines ({counts}):\n  {shown}{more}")


def say_notes(notes: list[dict], manifest: str | Path, sample_rate: int) -> None:
    """Say once per manifest how many files are resampled or mixed down from stereo."""
    resampled = sum(n.get("resampled", False) for n in notes)
    stereo = sum(n.get("stereo", False) for n in notes)
    if resampled:
        rank_zero_info(f"{manifest}: {resampled} of {len(notes)} files are resampled to {sample_rate} Hz on loading")
    if stereo:
        rank_zero_info(f"{manifest}: {stereo} of {len(notes)} files have several channels and are mixed to mono")
