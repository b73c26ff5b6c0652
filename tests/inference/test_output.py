"""Where asr.transcribe's results go (asr/inference/output.py): each sink writes whole results, keeps or drops
failures as documented, and tells a rerun what an earlier run finished."""

from __future__ import annotations

import json

import pytest

from asr.inference.output import JsonlFile, OutputDir, Stdout, open_sink
from asr.inference.result import Result, Word

DONE = Result("a.flac", 1.0, "call five", [Word("call", 0.1, 0.4, 0.9), Word("five", 0.5, 0.9, 0.8)], "call five")
AT_OFFSET = Result("long.flac", 2.0, "nine", offset=30.0)
FAILED = Result("b.flac", 0.0, "", error="b.flac: unreadable audio: empty file (0 bytes)")


def test_jsonl_file_appends_every_result_and_a_rerun_skips_only_what_succeeded(tmp_path):
    path = tmp_path / "runs" / "hyps.jsonl"  # its folder is made
    sink = JsonlFile(path)
    for result in (DONE, FAILED, AT_OFFSET):
        sink.write(result, "")
        assert path.read_text().endswith("\n")  # flushed line by line: a stopped run loses no finished line
    sink.close()
    assert [json.loads(line)["audio_filepath"] for line in path.read_text().splitlines()] == ["a.flac", "b.flac",
                                                                                             "long.flac"]
    again = JsonlFile(path)
    assert again.is_done("a.flac", None, "a") and again.is_done("long.flac", 30.0, "long@30")
    assert not again.is_done("long.flac", 60.0, "long@60")  # another stretch of the same file
    assert not again.is_done("b.flac", None, "b")  # a failure is retried
    assert [row["reference"] for row in again.rows if "reference" in row] == ["call five"]  # scored again
    again.close()


def test_jsonl_file_cuts_a_torn_last_line_and_refuses_a_file_it_did_not_write(tmp_path):
    path = tmp_path / "hyps.jsonl"
    whole = json.dumps(DONE.to_json()) + "\n"
    path.write_text(whole + whole[:30])  # stopped while writing the second line
    sink = JsonlFile(path)
    sink.close()
    assert path.read_text() == whole and sink.is_done("a.flac", None, "a")
    path.write_text(whole + '{"utt": 1, "words": []}\n')
    with pytest.raises(ValueError, match="hyps.jsonl:2: not a line written by asr.transcribe; choose another"):
        JsonlFile(path)


def test_output_dir_writes_one_whole_file_per_input_and_none_for_a_failure(tmp_path):
    sink = OutputDir(tmp_path / "subs", "srt")
    assert not sink.is_done("a.flac", None, "calls/a")
    sink.write(DONE, "calls/a")
    sink.write(FAILED, "b")
    sink.close()
    files = sorted(p.relative_to(tmp_path / "subs").as_posix() for p in (tmp_path / "subs").rglob("*"))
    assert files == ["calls", "calls/a.srt"]  # no b.srt, so a rerun retries it; no temporary file left
    assert (tmp_path / "subs" / "calls" / "a.srt").read_text().startswith("1\n00:00:00,100 --> 00:00:00,900\n")
    assert sink.is_done("a.flac", None, "calls/a")
    assert not OutputDir(tmp_path / "subs", "vtt").is_done("a.flac", None, "calls/a")  # done in srt, not in vtt


def test_stdout_keeps_to_transcripts_except_jsonl_which_shows_failures_too(capsys):
    txt, jsonl = Stdout("txt"), Stdout("jsonl")
    for result in (DONE, FAILED):
        txt.write(result, "")
    assert capsys.readouterr().out == "a.flac\tcall five\n"  # the failure is on stderr, by the caller
    jsonl.write(FAILED, "")
    assert json.loads(capsys.readouterr().out) == {"audio_filepath": "b.flac", "error": FAILED.error}
    assert not txt.is_done("a.flac", None, "a") and txt.rows == []


def test_open_sink_follows_the_flags_and_refuses_what_would_overwrite_or_interleave(tmp_path):
    jsonl = open_sink(str(tmp_path / "h.jsonl"), None, "jsonl", ["a", "a"])  # manifest lines of one file: fine
    jsonl.close()
    assert isinstance(jsonl, JsonlFile)
    assert isinstance(open_sink(None, str(tmp_path), "vtt", ["a", "b"]), OutputDir)
    assert isinstance(open_sink(None, None, "srt", ["a"]), Stdout)
    with pytest.raises(ValueError, match="--output_dir: two inputs would both write 'x/a'"):
        open_sink(None, str(tmp_path), "txt", ["x/a", "b", "x/a"])
    with pytest.raises(ValueError, match="--format srt of 2 utterances needs --output_dir"):
        open_sink(None, None, "srt", ["a", "b"])
