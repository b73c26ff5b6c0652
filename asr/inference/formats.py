"""The output formats of asr.transcribe, one class each, registered by name in ``FORMATS``.

- ``jsonl``: one JSON object per utterance (``Result.to_json``): audio_filepath, duration, text,
  words, and reference when one is given; an input that failed: audio_filepath, offset if any,
  and error. Under ``--output_dir`` each file holds one such line, with the suffix ``.json``.
- ``txt``: the text; on stdout, "path<TAB>text" lines.
- ``srt`` and ``vtt``: subtitle cues of at most ``CUE_CHARS`` characters and ``CUE_SECONDS``
  seconds, broken at pauses of ``CUE_PAUSE`` seconds.

A new format is one subclass of ``Format`` with a ``name`` and a ``suffix``: defining it adds it
to ``FORMATS``, and so to ``--format``'s choices.
"""

from __future__ import annotations

import json
from typing import ClassVar

from asr.inference.result import Result, Word

CUE_CHARS = 42  # longest subtitle line, the usual broadcast limit
CUE_SECONDS = 5.0  # longest subtitle cue
CUE_PAUSE = 1.0  # a silence this long between words starts a new cue

FORMATS: dict[str, Format] = {}  # --format name -> its Format, in the order the classes are defined


class Format:
    """How one Result is written: ``render`` gives a file's text, ``printed`` what stdout shows."""

    name: ClassVar[str]  # the --format value; a class without one (a shared base) is not registered
    suffix: ClassVar[str]  # of its files under --output_dir
    prints_failures: ClassVar[bool] = False  # stdout shows a failed input's row; else it is only on stderr

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            FORMATS[cls.name] = cls()

    def render(self, result: Result) -> str:
        """The text of one output file for ``result``."""
        raise NotImplementedError

    def printed(self, result: Result) -> str:
        """What stdout shows for ``result`` when there is no output file: the file's text."""
        return self.render(result)


def get_format(name: str) -> Format:
    """The registered format ``name``; ValueError naming the choices otherwise."""
    if name not in FORMATS:
        raise ValueError(f"--format must be one of {tuple(FORMATS)}, got {name!r}")
    return FORMATS[name]


class Jsonl(Format):
    name, suffix, prints_failures = "jsonl", ".json", True

    def render(self, result: Result) -> str:
        return json.dumps(result.to_json(), ensure_ascii=False) + "\n"


class Txt(Format):
    name, suffix = "txt", ".txt"

    def render(self, result: Result) -> str:
        return result.text + "\n"

    def printed(self, result: Result) -> str:
        return f"{result.audio_filepath}\t{result.text}\n"


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


class Subtitles(Format):
    """A subtitle document of the result's ``cues``; a cue lasts at least one millisecond."""

    separator: ClassVar[str]  # between seconds and milliseconds in a timestamp
    numbered: ClassVar[bool]  # each cue starts with its number
    header: ClassVar[str] = ""

    def render(self, result: Result) -> str:
        blocks = []
        for number, cue in enumerate(cues(result.words), start=1):
            start, end = cue[0].start, max(cue[-1].end, cue[0].start + 0.001)
            timing = f"{timestamp(start, self.separator)} --> {timestamp(end, self.separator)}"
            text = " ".join(w.word for w in cue)
            blocks.append(f"{number}\n{timing}\n{text}\n" if self.numbered else f"{timing}\n{text}\n")
        return self.header + "\n".join(blocks)


class Srt(Subtitles):
    name, suffix, separator, numbered = "srt", ".srt", ",", True


class Vtt(Subtitles):
    name, suffix, separator, numbered, header = "vtt", ".vtt", ".", False, "WEBVTT\n\n"
