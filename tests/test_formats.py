"""Output formats (asr/formats.py): the bytes of each format, valid subtitle syntax, and the
registry, through which a new format is one class.
"""

from __future__ import annotations

import re

from asr.formats import FORMATS, timestamp
from asr.result import Result, Word


def test_subtitles_have_valid_srt_and_webvtt_syntax():
    words = [Word("call", 0.5, 0.9, 1.0), Word("five", 1.0, 1.3, 1.0), Word("two", 3.0, 3.2, 1.0),  # a pause
             *(Word(f"word{i}", 3725.0 + i * 0.3, 3725.2 + i * 0.3, 1.0) for i in range(8))]  # past an hour
    result = Result("a.flac", 3730.0, "", words)
    srt = FORMATS["srt"].render(result).split("\n\n")
    assert [block.splitlines()[0] for block in srt] == [str(i) for i in range(1, len(srt) + 1)]
    cue = re.compile(r"\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d")
    assert all(cue.fullmatch(block.splitlines()[1]) and len(block.splitlines()[2]) <= 42 for block in srt)
    assert srt[0].splitlines()[1:] == ["00:00:00,500 --> 00:00:01,300", "call five"]
    assert srt[1].splitlines()[2] == "two" and len(srt) == 4  # 8 words of 5-6 chars fill two 42-char lines
    assert timestamp(3725.25, ",") == "01:02:05,250"
    vtt = FORMATS["vtt"].render(result)
    assert vtt.startswith("WEBVTT\n\n00:00:00.500 --> 00:00:01.300\ncall five\n\n")
    assert "," not in vtt
