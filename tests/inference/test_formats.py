"""Output formats (asr/inference/formats.py): the bytes of each format, valid subtitle syntax, and the
registry, through which a new format is one class.
"""

from __future__ import annotations

import json
import re

import pytest

from asr.inference.formats import FORMATS, Format, get_format, timestamp
from asr.inference.output import OutputDir
from asr.inference.result import Result, Word
from asr.inference.transcribing import parse_args


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


WORDS = [Word("call", 0.32, 0.56, 0.9712), Word("fïve", 0.8, 1.1, 0.5)]


def test_jsonl_is_one_line_per_utterance_and_a_failure_is_its_file_and_error():
    done = Result("a.flac", 1.23456, "call fïve", WORDS, reference="call five", offset=2.0)
    row = FORMATS["jsonl"].render(done)
    assert row.endswith("\n") and row.count("\n") == 1 and "fïve" in row  # UTF-8 as it is, not \u escapes
    assert json.loads(row) == {
        "audio_filepath": "a.flac", "offset": 2.0, "duration": 1.235, "text": "call fïve",
        "words": [{"word": "call", "start": 0.32, "end": 0.56, "confidence": 0.971},
                  {"word": "fïve", "start": 0.8, "end": 1.1, "confidence": 0.5}],
        "reference": "call five"}
    failed = Result("b.flac", 0.0, "", error="b.flac: unreadable audio")
    assert json.loads(FORMATS["jsonl"].render(failed)) == {"audio_filepath": "b.flac",
                                                           "error": "b.flac: unreadable audio"}
    assert FORMATS["jsonl"].printed(failed) == FORMATS["jsonl"].render(failed) and FORMATS["jsonl"].prints_failures


def test_txt_is_the_text_in_a_file_and_path_tab_text_on_stdout():
    result = Result("a.flac", 1.0, "call five", WORDS)
    assert FORMATS["txt"].render(result) == "call five\n"
    assert FORMATS["txt"].printed(result) == "a.flac\tcall five\n"
    assert not any(FORMATS[k].prints_failures for k in ("txt", "srt", "vtt"))


def test_each_format_has_the_suffix_of_its_files_and_an_unknown_one_is_named():
    assert {name: f.suffix for name, f in FORMATS.items()} == {"jsonl": ".json", "txt": ".txt", "srt": ".srt",
                                                               "vtt": ".vtt"}
    with pytest.raises(ValueError, match=r"--format must be one of \('jsonl', 'txt', 'srt', 'vtt'\), got 'doc'"):
        get_format("doc")


@pytest.fixture
def tsv():
    """A new format, defined as a user would add one: one class. Removed from the registry after the test."""

    class Tsv(Format):
        name, suffix = "tsv", ".tsv"

        def render(self, result: Result) -> str:
            return "".join(f"{w.start:.2f}\t{w.end:.2f}\t{w.word}\n" for w in result.words)

    yield Tsv
    del FORMATS["tsv"]


def test_a_new_format_is_one_class_and_the_cli_and_sinks_take_it(tsv, tmp_path, capsys):
    assert isinstance(get_format("tsv"), tsv)
    sink = OutputDir(tmp_path, "tsv")
    sink.write(Result("a.flac", 1.0, "call five", WORDS), "a")
    assert (tmp_path / "a.tsv").read_text() == "0.32\t0.56\tcall\n0.80\t1.10\tfïve\n"
    assert parse_args(["--checkpoint", "x.ckpt", "a.flac", "--output_dir", "out", "--format", "tsv"]).format == "tsv"
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "jsonl, txt, srt, vtt, tsv (asr.inference.formats)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint", "x.ckpt", "a.flac", "--format", "doc"])
    choices = capsys.readouterr().err.split("invalid choice: 'doc' (choose from ")[1]  # quoted or not by version
    assert [c.strip("' ") for c in choices.split(")")[0].split(",")] == ["jsonl", "txt", "srt", "vtt", "tsv"]
