"""Import a corpus you have into the NeMo JSON-lines manifest asr trains on.

    asr import librispeech LibriSpeech/dev-clean my/dev.jsonl
    asr import commonvoice cv-corpus-17.0/cs/train.tsv my/train.jsonl
    asr import kaldi kaldi/data/train my/train.jsonl

- librispeech: every ``*.trans.txt`` under the folder (lines ``ID TEXT``; audio ``ID.flac`` beside it).
- commonvoice: a Common Voice TSV (columns ``path`` and ``sentence``); the mp3 clips are in
  ``clips/`` beside it (``--clips`` to say otherwise). soundfile reads mp3 (libsndfile >= 1.1).
- kaldi: a data dir with ``wav.scp`` and ``text``, and ``segments`` if utterances are parts of
  recordings (they become ``offset`` + ``duration``). Relative paths in ``wav.scp`` are relative
  to the current directory, as in Kaldi; piped commands (``... |``) are not supported.

Text is normalised (see ``normalise_text``). ``audio_filepath`` is written relative to the
manifest's folder and ``duration`` read from the audio header. A bad row is reported as
``FILE:LINE: reason``; by default nothing is written then (``--on-bad-row skip`` writes the rest).
The manifest appears whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

import soundfile

from asr.atomic import write_atomically
from asr.data.manifest import Problem

Row = dict  # one manifest line: audio_filepath (Path while importing), duration, text, optional offset
SHOWN_PROBLEMS = 10  # bad rows listed in full
SEGMENT_SLACK = 0.05  # seconds a Kaldi segment may run past its recording's end (rounding in segments files)


def normalise_text(text: str) -> str:
    """Lowercase words of letters and digits; apostrophes kept only inside a word, everything else a space."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"[^\w']|_", " ", text)  # \w is Unicode: Czech, German, ... letters stay
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)
    return " ".join(text.split())


def audio_duration(path: Path) -> float:
    """Seconds of audio in ``path`` from its header; ValueError naming the file if soundfile cannot read it."""
    try:
        return soundfile.info(str(path)).duration
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise ValueError(f"{path}: cannot read audio ({err})") from err


def audio_row(source: str, audio: Path, text: str) -> Row | Problem:
    """A manifest row for the whole of ``audio``, or the Problem that prevents one."""
    text = normalise_text(text)
    if not text:
        return Problem(source, "empty text", "no words after normalisation")
    if not audio.is_file():
        return Problem(source, "missing audio file", str(audio))
    try:
        return {"audio_filepath": audio, "duration": round(audio_duration(audio), 3), "text": text}
    except ValueError as err:
        return Problem(source, "unreadable audio", str(err))


def write_manifest(rows: Iterable[Row], path: Path) -> int:
    """Write ``rows`` to ``path`` as JSON lines, audio paths relative to its folder; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with write_atomically(path) as partial, partial.open("w", encoding="utf-8") as f:
        for row in rows:
            relative = os.path.relpath(Path(row["audio_filepath"]).resolve(), path.parent.resolve())
            f.write(json.dumps({**row, "audio_filepath": relative}, ensure_ascii=False) + "\n")
            count += 1
    return count


def finish(items: list[Row | Problem], out: Path, on_bad_row: str) -> None:
    """Report bad rows and write the good ones; with on_bad_row=error any bad row stops before writing."""
    rows = [item for item in items if not isinstance(item, Problem)]
    problems = [item for item in items if isinstance(item, Problem)]
    if problems:
        counts = ", ".join(f"{n} {kind}" for kind, n in Counter(p.kind for p in problems).most_common())
        shown = "\n  ".join(str(p) for p in problems[:SHOWN_PROBLEMS])
        more = f"\n  ... and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        print(f"{len(problems)} of {len(items)} rows are unusable ({counts}):\n  {shown}{more}", file=sys.stderr)
        if on_bad_row == "error":
            sys.exit(f"nothing written; fix them, or pass --on-bad-row skip to write the other {len(rows)} rows")
    if not rows:
        sys.exit("no usable row: nothing written")
    write_manifest(rows, out)
    hours = sum(row["duration"] for row in rows) / 3600
    print(f"wrote {out}: {len(rows)} utterances, {hours:.2f} h")


def librispeech(root: Path) -> list[Row | Problem]:
    """Rows from every ``*.trans.txt`` under ``root`` (LibriSpeech layout: ``ID TEXT`` with ``ID.flac`` beside it)."""
    transcripts = sorted(root.rglob("*.trans.txt"))
    if not transcripts:
        sys.exit(f"{root}: no *.trans.txt file under it (not a LibriSpeech-style folder)")
    items = []
    for trans in transcripts:
        for number, line in enumerate(trans.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            utt_id, _, text = line.strip().partition(" ")
            items.append(audio_row(f"{trans}:{number}", trans.parent / f"{utt_id}.flac", text))
    return items


def commonvoice(tsv: Path, clips: Path | None = None) -> list[Row | Problem]:
    """Rows from a Common Voice TSV (``path``, ``sentence`` columns); clips default to ``clips/`` beside it."""
    clips = clips or tsv.parent / "clips"
    with tsv.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = {"path", "sentence"} - set(reader.fieldnames or ())
        if missing:
            sys.exit(f"{tsv}:1: not a Common Voice TSV: no column {', '.join(sorted(missing))}")
        items = []
        for record in reader:
            source = f"{tsv}:{reader.line_num}"
            if not record["path"] or record["sentence"] is None:
                items.append(Problem(source, "malformed row", "needs a path and a sentence"))
            else:
                items.append(audio_row(source, clips / record["path"], record["sentence"]))
    return items


def read_table(path: Path, fields: int) -> Iterable[tuple[str, list[str] | None]]:
    """(``FILE:LINE``, [key, value...]) per non-empty line of a Kaldi table; the list is None if too short."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            parts = line.split(maxsplit=fields - 1)
            yield f"{path}:{number}", parts if len(parts) == fields else None


def kaldi(data_dir: Path) -> list[Row | Problem]:
    """Rows from a Kaldi data dir: ``text`` and ``wav.scp``, with ``segments`` if present."""
    for name in ("wav.scp", "text"):
        if not (data_dir / name).is_file():
            sys.exit(f"{data_dir}: no {name} (not a Kaldi data dir)")
    items: list[Row | Problem] = []
    audio: dict[str, tuple[str, Path]] = {}
    for source, parts in read_table(data_dir / "wav.scp", 2):
        if parts is None or parts[1].rstrip().endswith("|"):
            kind = "malformed row" if parts is None else "piped command"
            items.append(Problem(source, kind, "wav.scp lines must be 'ID PATH' (extract piped audio to files first)"))
        else:
            audio[parts[0]] = (source, Path(parts[1].strip()))
    segments = {}
    if (data_dir / "segments").is_file():
        for source, parts in read_table(data_dir / "segments", 4):
            if parts is None:
                items.append(Problem(source, "malformed row", "segments lines are 'UTT REC START END'"))
            else:
                segments.setdefault(parts[0], (source, parts[1:]))
    for source, parts in read_table(data_dir / "text", 2):
        if parts is None:
            items.append(Problem(source, "malformed row", "text lines are 'UTT WORDS...'"))
        elif segments:
            items.append(kaldi_segment(source, parts, segments, audio))
        elif parts[0] not in audio:
            items.append(Problem(source, "unknown utterance", f"{parts[0]} is not in wav.scp"))
        else:
            items.append(audio_row(source, audio[parts[0]][1], parts[1]))
    return items


def kaldi_segment(source: str, parts: list[str], segments: dict, audio: dict) -> Row | Problem:
    """The row for one ``text`` line of a data dir with ``segments``: offset and duration within its recording."""
    utt_id, text = parts
    if utt_id not in segments:
        return Problem(source, "unknown utterance", f"{utt_id} is not in segments")
    seg_source, (rec_id, start, end) = segments[utt_id]
    if rec_id not in audio:
        return Problem(seg_source, "unknown recording", f"{rec_id} is not in wav.scp")
    try:
        start, end = float(start), float(end)
    except ValueError:
        return Problem(seg_source, "bad number", f"start {start!r} / end {end!r}")
    row = audio_row(source, audio[rec_id][1], text)
    if isinstance(row, Problem):
        return row
    if not 0 <= start < end <= row["duration"] + SEGMENT_SLACK:
        return Problem(seg_source, "bad segment", f"[{start}, {end}] s is not inside {row['duration']} s of {rec_id}")
    return {**row, "offset": start, "duration": round(min(end, row["duration"]) - start, 3)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind, source_help in [("librispeech", "folder holding *.trans.txt files (searched recursively)"),
                              ("commonvoice", "a Common Voice .tsv file"), ("kaldi", "a Kaldi data dir")]:
        command = sub.add_parser(kind)
        command.add_argument("source", type=Path, help=source_help)
        command.add_argument("out", type=Path, help="the manifest to write (.jsonl)")
        command.add_argument("--on-bad-row", choices=("error", "skip"), default="error",
                             help="error: list bad rows and write nothing; skip: list them and write the rest")
        if kind == "commonvoice":
            command.add_argument("--clips", type=Path, help="folder of the mp3 clips (default: clips/ beside the TSV)")
    return parser.parse_args(argv)


IMPORTERS: dict[str, Callable[[argparse.Namespace], list[Row | Problem]]] = {
    "librispeech": lambda args: librispeech(args.source),
    "commonvoice": lambda args: commonvoice(args.source, args.clips),
    "kaldi": lambda args: kaldi(args.source),
}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.source.exists():
        sys.exit(f"{args.source} does not exist")
    finish(IMPORTERS[args.kind](args), args.out, args.on_bad_row)


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
