"""The data a scaling study's trials share (asr/study/data.py): nested, reproducible subsets of the
training manifest that run from any folder, and one tokenizer for every trial."""

from __future__ import annotations

import json

from asr.data.manifest import parse_manifest
from asr.study.data import draw_subsets, subset_path, tokenizer_path


def study_folder(path):
    """OUT with its data folder, as asr.study's prepare makes it before drawing."""
    (path / "data").mkdir(parents=True)
    return path


def lines(out, fraction) -> list[dict]:
    return [json.loads(line) for line in subset_path(out, fraction).read_text().splitlines()]


def test_subsets_are_nested_reproducible_and_name_audio_by_absolute_path(corpus, tmp_path):
    out = study_folder(tmp_path / "study")
    subsets = draw_subsets(str(corpus.train), [1.0, 0.4, 0.7], seed=3, out=out)
    assert {f: s["utterances"] for f, s in subsets.items()} == {"0.4": 2, "0.7": 4, "1": 5}  # of 5 lines
    assert json.loads((out / "data" / "subsets.json").read_text()) == subsets
    small, middle, whole = (lines(out, f) for f in (0.4, 0.7, 1.0))
    assert all(row in middle for row in small) and all(row in whole for row in middle)
    assert subsets["1"]["hours"] == sum(row["duration"] for row in whole) / 3600
    utterances, problems = parse_manifest(subset_path(out, 0.7))  # readable wherever a trial runs
    assert not problems and all(u.audio_filepath.is_absolute() for u in utterances)
    again = draw_subsets(str(corpus.train), [0.4], seed=3, out=study_folder(tmp_path / "again"))
    assert lines(tmp_path / "again", 0.4) == small and again["0.4"] == subsets["0.4"]


def test_bad_manifest_lines_are_left_out_and_said_on_stderr(corpus, tmp_path, capsys):
    corpus.write(train_extra=({"audio_filepath": "audio/missing.flac", "duration": 1.0, "text": "x"},))
    subsets = draw_subsets(str(corpus.train), [1.0], seed=0, out=study_folder(tmp_path / "study"))
    captured = capsys.readouterr()
    assert subsets["1"]["utterances"] == 5 and captured.out == ""  # stdout stays --print_commands' lines
    assert "1 bad lines of" in captured.err and "train.jsonl:6" in captured.err


def test_one_tokenizer_for_every_trial_trained_once_unless_the_config_gives_one(corpus, tmp_path, char_tokenizer):
    data = {"train_manifest": str(corpus.train), "tokenizer": {"model": None, "type": "char", "vocab_size": 64}}
    out = study_folder(tmp_path / "study")
    path = tokenizer_path({"data": data}, out)
    assert path == out / "data" / "tokenizer.model" and path.is_file()
    written = path.stat().st_mtime_ns
    assert tokenizer_path({"data": data}, out) == path and path.stat().st_mtime_ns == written  # not retrained
    given = tmp_path / "given.model"
    char_tokenizer.save(given)
    assert tokenizer_path({"data": data | {"tokenizer": {"model": str(given)}}}, out) == given.resolve()
