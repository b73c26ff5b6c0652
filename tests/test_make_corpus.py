"""scripts/make_corpus.py: deterministic from its seed, disjoint splits, readable 16/8 kHz FLAC,
and unusable sentence lines reported by number. Needs espeak-ng and sox (apt-get install espeak-ng sox)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_corpus.py"
pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("sox")), reason="needs espeak-ng and sox (apt-get install)"
)


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every manifest and audio file (README.md names --out, so it differs)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "README.md"}


def manifest(folder: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]


def test_mini_corpus_is_byte_identical_for_a_seed_and_splits_are_disjoint(tmp_path):
    sizes = ["--train", "40", "--dev", "3", "--test", "3"]  # 40: enough for train to hold every dev/test word
    for name in ("a", "b"):
        assert make("mini", "--out", str(tmp_path / name), *sizes).returncode == 0
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    texts = {split: {row["text"] for row in manifest(tmp_path / "a", split)} for split in ("train", "dev", "test")}
    assert not (texts["train"] & texts["dev"] or texts["train"] & texts["test"] or texts["dev"] & texts["test"])
    row = manifest(tmp_path / "a", "train")[0]
    info = soundfile.info(str(tmp_path / "a" / row["audio_filepath"]))
    assert (info.samplerate, info.channels) == (16000, 1)
    assert abs(info.duration - row["duration"]) < 1e-3


def test_text_mode_speaks_8khz_and_reports_unusable_lines(tmp_path):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("the cat sat\nprice 1984 dollars\nhello world\nsee you soon\nwhat a day\n")
    result = make("text", "--sentences", str(sentences), "--count", "4", "--sample-rate", "8000",
                  "--out", str(tmp_path / "out"), "--dev-fraction", "0.25", "--test-fraction", "0.25")
    assert result.returncode == 0, result.stderr
    assert "digits: 1 lines: 2" in result.stderr  # line 2 is dropped, by number
    rows = [r for split in ("train", "dev", "test") for r in manifest(tmp_path / "out", split)]
    assert len(rows) == 4
    assert soundfile.info(str(tmp_path / "out" / rows[0]["audio_filepath"])).samplerate == 8000


def test_refuses_to_mix_with_an_existing_corpus(tmp_path):
    sizes = ["--train", "40", "--dev", "3", "--test", "3"]
    assert make("mini", "--out", str(tmp_path), *sizes).returncode == 0
    again = make("mini", "--out", str(tmp_path), *sizes)
    assert again.returncode != 0 and "--overwrite" in again.stderr


def test_a_draw_whose_train_split_misses_a_test_word_is_refused(tmp_path):
    result = make("mini", "--out", str(tmp_path), "--train", "2", "--dev", "1", "--test", "3")
    assert result.returncode != 0 and "train never has" in result.stderr
