"""Where asr.transcribe's results go: a Sink (``--output`` FILE.jsonl, ``--output_dir`` DIR, or stdout, also as
``--output -``).

Every sink lets a rerun of the same command resume: ``is_done`` tells which inputs an earlier run
finished, and what a sink writes is complete or absent (a flushed line, an atomically renamed file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Protocol

from asr.atomic import write_atomically
from asr.inference.formats import get_format
from asr.inference.result import Result

STDOUT = "-"  # --output -: the JSON lines on standard output, as Unix commands read "-"


class Sink(Protocol):
    """What asr.transcribe writes results through."""

    rows: list[dict]  # JSONL rows an earlier run left done (their references are scored again); else []

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        """Whether an earlier run finished this input; ``name`` is its output name (asr.inference.inputs.collect)."""
        ...

    def write(self, result: Result, name: str) -> None:
        """Write one input's result (a failure too, if the sink keeps failures), complete or not at all."""
        ...

    def close(self) -> None:
        ...


def open_sink(output: str | None, output_dir: str | None, kind: str, names: list[str]) -> Sink:
    """The sink of ``--output`` (JsonlFile; ``-``: stdout), else ``--output_dir`` (OutputDir), else stdout, for
    inputs with output names ``names`` in format ``kind``; ValueError naming the flag if it cannot hold them."""
    if output == STDOUT:
        return Stdout("jsonl")
    if output:
        return JsonlFile(output)
    if output_dir:
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"--output_dir: two inputs would both write {twice!r}; transcribe them separately")
        return OutputDir(output_dir, kind)
    if kind in ("srt", "vtt") and len(names) > 1:
        raise ValueError(f"--format {kind} of {len(names)} utterances needs --output_dir")
    return Stdout(kind)


def to_stdout(output: str | None, output_dir: str | None) -> bool:
    """Whether the results go to standard output (no --output nor --output_dir, or ``--output -``): then the run's
    own lines (what was skipped, the summary) go to stderr, so that stdout holds results only."""
    return output == STDOUT or not (output or output_dir)


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
        self.file.write(get_format("jsonl").render(result))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class OutputDir:
    """``--output_dir DIR``: one file per input, ``DIR/<name><format's suffix>``, written to a temporary
    file and renamed, so an existing file is a complete one and a rerun skips its input."""

    def __init__(self, root: str | Path, kind: str):
        self.root, self.format, self.rows = Path(root), get_format(kind), []

    def target(self, name: str) -> Path:
        return self.root / (name + self.format.suffix)

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        return self.target(name).exists()

    def write(self, result: Result, name: str) -> None:
        if result.error:  # no file, so that a rerun retries it; the error is on stderr
            return
        target = self.target(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with write_atomically(target) as partial:
            partial.write_text(self.format.render(result), encoding="utf-8")

    def close(self) -> None:
        pass


class Stdout:
    """No output file: each result as its format prints it (txt: "path<TAB>text" lines); a failure only
    if the format prints failures (jsonl), since stdout keeps to transcripts and the error is on stderr."""

    def __init__(self, kind: str):
        self.format, self.rows = get_format(kind), []

    def is_done(self, audio_filepath: str, offset: float | None, name: str) -> bool:
        return False

    def write(self, result: Result, name: str) -> None:
        if result.error and not self.format.prints_failures:
            return
        sys.stdout.write(self.format.printed(result))
        sys.stdout.flush()

    def close(self) -> None:
        pass
