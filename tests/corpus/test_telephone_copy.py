"""scripts/corpus/telephone_copy.py: every line of a manifest, in order, through the held-out set's telephone channel at
8 kHz, with absolute paths; a bad line, an empty manifest or an --out holding the manifest's own audio is named,
and the folder stays as it was."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr.data import manifest as mf
import scripts.corpus.telephone_copy as tc
from tests import REPO
from tests.corpus.test_leave_voice_out import corpus, lines, needs_sox

COMMAND = [sys.executable, "-m", "scripts.corpus.telephone_copy"]  # as its docstring runs it, from the repository root


def band_share(audio: np.ndarray, rate: int, low: float, high: float) -> float:
    """The share of ``audio``'s energy between ``low`` and ``high`` Hz."""
    power = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(len(audio), 1 / rate)
    return float(power[(freqs >= low) & (freqs <= high)].sum() / power.sum())


@needs_sox
def test_a_copy_keeps_every_line_in_order_at_8_khz_in_the_telephone_band(tmp_path):
    source = corpus(tmp_path / "mini")
    noise = np.random.default_rng(1).uniform(-0.5, 0.5, 16000)  # energy at every frequency
    sf.write(source / "audio" / "dev" / "000.flac", noise, 16000, subtype="PCM_16")
    out = tmp_path / "devtel"
    done = subprocess.run([*COMMAND, str(source / "dev.jsonl"), "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    copy, original = lines(out / "8k.jsonl"), lines(source / "dev.jsonl")
    assert [row["text"] for row in copy] == [row["text"] for row in original]
    assert [(row["synth"], row["speaker"]) for row in copy] == [(row["synth"], row["speaker"]) for row in original]
    for row in copy:
        audio, rate = sf.read(row["audio_filepath"])
        assert Path(row["audio_filepath"]).is_absolute() and rate == 8000 and abs(len(audio) - 8000) < 50
    audio, rate = sf.read(copy[0]["audio_filepath"])
    assert band_share(audio, rate, 300, 3400) > 0.95  # white noise had 78% of its energy there
    utterances, problems = mf.parse_manifest(out / "8k.jsonl")
    assert len(utterances) == len(copy) and not problems


@needs_sox
def test_bad_input_is_named_and_leaves_the_folder_as_it_was(tmp_path):
    source, out = corpus(tmp_path / "mini"), tmp_path / "devtel"
    assert tc.make_copy(source / "train.jsonl", out) == 6
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    (source / "audio" / "dev" / "002.flac").unlink()
    with pytest.raises(SystemExit, match=r"dev\.jsonl:3: .*002\.flac"):
        tc.make_copy(source / "dev.jsonl", out, overwrite=True)
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before  # the old copy, whole
    with pytest.raises(SystemExit, match=r"--out .*devtel already holds a copy .*--overwrite"):
        tc.make_copy(source / "train.jsonl", out)
    with pytest.raises(SystemExit, match=r"nothing\.jsonl: no such manifest"):
        tc.make_copy(tmp_path / "nothing.jsonl", out, overwrite=True)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SystemExit, match=r"empty\.jsonl: no lines to copy"):
        tc.make_copy(tmp_path / "empty.jsonl", out, overwrite=True)
    with pytest.raises(SystemExit, match=r"--out .*mini: holds the manifest's own audio"):  # never the corpus' own audio
        tc.make_copy(source / "train.jsonl", source, overwrite=True)
    assert len(list((source / "audio" / "train").iterdir())) == 6
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


@needs_sox
def test_an_error_names_the_script_that_was_run(tmp_path):
    done = subprocess.run([*COMMAND, str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "devtel")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("telephone_copy.py: error: ") and "none.jsonl: no such manifest" in done.stderr
