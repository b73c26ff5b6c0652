"""asr.tools.import_corpus (``asr import``) on small generated LibriSpeech, Common Voice and Kaldi trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from asr.data.manifest import parse_manifest
import asr.tools.import_corpus as importer
from tests import REPO
from tests.conftest import sine


def audio(path: Path, seconds: float, rate: int = 16000, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, sine(seconds, rate), rate, **kwargs)
    return path


def read(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines()]


def librispeech_tree(root: Path) -> Path:
    chapter = root / "LibriSpeech" / "dev-clean" / "84" / "121123"
    audio(chapter / "84-121123-0000.flac", 1.0)
    audio(chapter / "84-121123-0001.flac", 1.5)
    (chapter / "84-121123.trans.txt").write_text("84-121123-0000 GO DO YOU HEAR\n84-121123-0001 BUT IN LESS THAN FIVE MINUTES\n")
    return root / "LibriSpeech" / "dev-clean"


def test_librispeech_documented_command_writes_a_manifest_training_reads(tmp_path):
    source, out = librispeech_tree(tmp_path), tmp_path / "out" / "dev.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "asr", "import", "librispeech", str(source), str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "2 utterances" in done.stdout
    rows = read(out)
    assert [r["text"] for r in rows] == ["go do you hear", "but in less than five minutes"]
    assert rows[0]["audio_filepath"] == "../LibriSpeech/dev-clean/84/121123/84-121123-0000.flac"
    assert [r["duration"] for r in rows] == [1.0, 1.5]
    utterances, problems = parse_manifest(out)  # the training side resolves the relative paths
    assert len(utterances) == 2 and not problems


def test_librispeech_missing_audio_is_reported_with_file_and_line_and_nothing_written(tmp_path, capsys):
    source = librispeech_tree(tmp_path)
    trans = next(source.rglob("*.trans.txt"))
    trans.write_text(trans.read_text() + "84-121123-0002 NOT RECORDED\n")
    out = tmp_path / "dev.jsonl"
    with pytest.raises(SystemExit, match="nothing written"):
        importer.main(["librispeech", str(source), str(out)])
    assert f"{trans}:3: missing audio file" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob("dev.jsonl*"))  # no partial file either
    importer.main(["librispeech", str(source), str(out), "--on-bad-row", "skip"])
    assert len(read(out)) == 2


def test_commonvoice_mp3_clips_and_normalised_sentences(tmp_path, capsys):
    cv = tmp_path / "cv-corpus" / "cs"
    audio(cv / "clips" / "common_voice_cs_1.mp3", 2.0, format="MP3")
    audio(cv / "clips" / "common_voice_cs_2.mp3", 1.0, format="MP3")
    (cv / "clips" / "common_voice_cs_3.mp3").write_bytes(b"not an mp3" * 50)
    header = "client_id\tpath\tsentence_id\tsentence\tsentence_domain\tup_votes\tdown_votes\n"
    lines = ["a\tcommon_voice_cs_1.mp3\t1\t\u201eDobr\u00fd den,\u201c \u0159ekla.\t\t2\t0",
             "b\tcommon_voice_cs_2.mp3\t2\tJak se m\u00e1\u0161?\t\t2\t0",
             "c\tcommon_voice_cs_3.mp3\t3\tRozbit\u00fd soubor.\t\t2\t0"]
    tsv = cv / "train.tsv"
    tsv.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "train.jsonl"
    importer.main(["commonvoice", str(tsv), str(out), "--on-bad-row", "skip"])
    assert f"{tsv}:4: unreadable audio" in capsys.readouterr().err
    rows = read(out)
    assert [r["text"] for r in rows] == ["dobr\u00fd den \u0159ekla", "jak se m\u00e1\u0161"]
    assert rows[0]["duration"] == pytest.approx(2.0, abs=0.01)  # libsndfile >= 1.1 reads mp3 headers
    assert rows[0]["audio_filepath"] == "cv-corpus/cs/clips/common_voice_cs_1.mp3"


def test_commonvoice_tsv_without_its_columns_is_one_clear_error(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("file\ttranscript\nx.mp3\thello\n")
    with pytest.raises(SystemExit, match=r"train.tsv:1: not a Common Voice TSV: no column path, sentence"):
        importer.main(["commonvoice", str(tsv), str(tmp_path / "out.jsonl")])


def test_kaldi_segments_become_offset_and_duration(tmp_path, capsys):
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    audio(tmp_path / "rec1.wav", 4.0)
    (data / "wav.scp").write_text(f"rec1 {tmp_path / 'rec1.wav'}\nrec2 sox x.wav -t wav - |\n")
    (data / "segments").write_text("u1 rec1 0.00 1.50\nu2 rec1 1.50 3.25\nu3 rec1 3.00 9.00\nu4 rec2 0 1\nu5 rec1 x 2\n")
    (data / "text").write_text("u1 HELLO THERE\nu2 GENERAL KENOBI\nu3 TOO LONG\nu4 PIPED\nu5 BAD\nu6 NO SEGMENT\n")
    out = tmp_path / "train.jsonl"
    importer.main(["kaldi", str(data), str(out), "--on-bad-row", "skip"])
    err = capsys.readouterr().err
    for expected in [f"{data / 'wav.scp'}:2: piped command", f"{data / 'segments'}:3: bad segment",
                     f"{data / 'segments'}:4: unknown recording", f"{data / 'segments'}:5: bad number",
                     f"{data / 'text'}:6: unknown utterance"]:
        assert expected in err
    rows = read(out)
    assert [(r["text"], r["offset"], r["duration"]) for r in rows] == [("hello there", 0.0, 1.5),
                                                                      ("general kenobi", 1.5, 1.75)]
    utterances, problems = parse_manifest(out)
    assert [u.offset for u in utterances] == [0.0, 1.5] and all(u.has_offset for u in utterances)


def test_kaldi_without_segments_reads_whole_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    audio(tmp_path / "a.flac", 1.25)
    (data / "wav.scp").write_text(f"a {tmp_path / 'a.flac'}\n")
    (data / "text").write_text("a one two\n")
    importer.main(["kaldi", str(data), str(tmp_path / "m.jsonl")])
    assert read(tmp_path / "m.jsonl") == [{"audio_filepath": "a.flac", "duration": 1.25, "text": "one two"}]


def test_normalise_text_keeps_letters_of_any_language_and_inner_apostrophes():
    assert importer.normalise_text("DON'T stop, 'quoted’ Chceš-li  vypad\u2019.") == "don't stop quoted chceš li vypad"
    assert importer.normalise_text("Žluťoučký kůň úpěl: ďábelské ódy!") == "žluťoučký kůň úpěl ďábelské ódy"
    assert importer.normalise_text("... - !") == ""
