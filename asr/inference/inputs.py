"""What a user asks asr.transcribe to transcribe -> utterances, with a Problem for anything unusable,
and what becomes of each input: a Result, in input order, a failed one for each Problem.

Inputs are audio files, folders (every audio file below them) and JSON-lines manifests, which
need only ``audio_filepath`` (asr.data.manifest.TRANSCRIPTION_KEYS). Each unusable thing (a path
that does not exist, a folder without audio or that cannot be read, a manifest line that is no
utterance) becomes an ``asr.data.manifest.Problem`` in its place, so one bad input never hides the
others and each is reported as ``SOURCE: reason``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from asr.data import manifest as mf
from asr.data.sources import AudioFiles, source_for
from asr.inference.result import Result


def collect(inputs: list[str]) -> list[tuple[mf.Utterance | mf.Problem, str]]:
    """Audio files, folders (every audio file below, sorted) and manifests -> (utterance, output name),
    in the order given, each listed by its source (asr.data.sources.source_for). What cannot be used (a
    missing path, a folder without audio or that cannot be read, a manifest line that is not an utterance)
    is a Problem in its place, naming it.

    The output name is the audio's path relative to the folder or manifest it came from (a file
    given on its own: its name), without the audio suffix; a manifest line with an offset adds "@offset".
    """
    found = []
    for name in inputs:
        path = Path(name)
        if not path.exists():
            found.append((mf.Problem(name, "missing input", "no such audio file, folder or manifest", path), name))
            continue
        source = source_for(name, "input", mf.TRANSCRIPTION_KEYS)
        try:
            utterances, problems = source.parse()
        except mf.ManifestError as err:
            reason = err.__cause__.strerror if isinstance(err.__cause__, OSError) else None
            found.append((mf.Problem(name, "unreadable manifest", reason or str(err), path), name))
            continue
        if not path.is_dir() and isinstance(source, AudioFiles):
            found += [(utt, path.stem) for utt in utterances]
            continue
        root = path if path.is_dir() else path.parent
        lines = utterances + problems if path.is_dir() else sorted(
            utterances + problems, key=lambda item: int(item.source.rpartition(":")[2]))
        if not lines:
            lines = [mf.Problem(name, "empty manifest", "no lines", path)]
        found += [(u, output_name(u.audio_filepath, root, u.offset if u.has_offset else None)
                   if isinstance(u, mf.Utterance) else u.source) for u in lines]
    return found


def output_name(audio: Path, root: Path, offset: float | None = None) -> str:
    try:
        relative = audio.resolve().relative_to(root.resolve())
    except ValueError:  # a manifest may name audio outside its own folder
        relative = Path(audio.name)
    return relative.with_suffix("").as_posix() + (f"@{offset:g}" if offset is not None else "")


def failed(utt: mf.Utterance | mf.Problem, error: str) -> Result:
    """The Result of an input that could not be transcribed: ``error`` is its one-line message."""
    audio = utt.audio_filepath if isinstance(utt, mf.Utterance) else utt.audio
    offset = utt.offset if isinstance(utt, mf.Utterance) and utt.has_offset else None
    return Result(None if audio is None else str(audio), 0.0, "", offset=offset, error=error)


def check_all(check: Callable[[mf.Utterance], tuple[mf.Utterance | mf.Problem, dict]],
              todo: list[tuple[mf.Utterance | mf.Problem, str]]
              ) -> tuple[list[Result | int], list[mf.Utterance], list[dict]]:
    """Read every input's header (``check``: Transcriber.check) before transcribing: per input, a failed
    Result or the index of its checked utterance; the checked utterances; their notes (resampled, stereo)."""
    order, checked, notes = [], [], []
    for utt, _ in todo:
        item, note = (utt, {}) if isinstance(utt, mf.Problem) else check(utt)
        if isinstance(item, mf.Problem):
            order.append(failed(item, str(item)))
        else:
            order.append(len(checked))
            checked.append(item)
            notes.append(note)
    return order, checked, notes


def in_order(order: list[Result | int], streamed: Iterator[tuple[int, Result]]) -> Iterator[tuple[int, Result]]:
    """(input position, Result) in input order: the failures of ``order`` between the streamed results
    of the checked utterances (which come in the order of their indices)."""
    pending = iter(enumerate(order))
    for i, result in streamed:
        for position, item in pending:
            if isinstance(item, Result):
                yield position, item
            else:
                assert item == i, "the stream yields in input order"
                yield position, result
                break
    yield from pending
