"""scripts/corpus/make_corpus.py and make_heldout.py: deterministic from their seed, disjoint splits and voices,
readable 16/8 kHz FLAC, and unusable sentence lines reported by number.
Needs espeak-ng, flite and sox (apt-get install espeak-ng flite sox); the mini corpus and the held-out set
also festival and its voices (.ci/run installs them)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

import scripts.corpus.make_corpus as corpus
import scripts.corpus.make_heldout as make_heldout
import scripts.corpus.synthesizers as tts
from tests import REPO

pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("flite") and shutil.which("sox")),
    reason="needs espeak-ng, flite and sox (apt-get install)"
)
MISSING_FESTIVAL = tts.missing_tools(("festival",), corpus.FESTIVAL_VOICES + make_heldout.FESTIVAL_VOICES
                                     + make_heldout.DEV_VOICES)
needs_festival = pytest.mark.skipif(bool(MISSING_FESTIVAL),
                                    reason=f"needs apt-get install {' '.join(MISSING_FESTIVAL)}")


def make(*args: str) -> subprocess.CompletedProcess:
    """``python -m scripts.corpus.make_corpus ARGS`` from the repository root, as its docstring runs it."""
    return subprocess.run([sys.executable, "-m", "scripts.corpus.make_corpus", *args], cwd=REPO, capture_output=True,
                          text=True)


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every manifest and audio file (README.md names --out, so it differs)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "README.md"}


def manifest(folder: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]


@needs_festival
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


@needs_festival
def test_refuses_to_mix_with_an_existing_corpus(tmp_path):
    sizes = ["--train", "40", "--dev", "3", "--test", "3"]
    assert make("mini", "--out", str(tmp_path), *sizes).returncode == 0
    again = make("mini", "--out", str(tmp_path), *sizes)
    assert again.returncode != 0 and "--overwrite" in again.stderr


def test_a_draw_whose_train_split_misses_a_test_word_is_refused(tmp_path):
    result = make("mini", "--out", str(tmp_path), "--train", "2", "--dev", "1", "--test", "3")
    assert result.returncode != 0 and "train never has" in result.stderr


def voices(rows: list[dict]) -> set[str]:
    """The voices of manifest rows, as synth/voice (espeak-ng: the variant, whatever the accent)."""
    return {f"{r['synth']}/{r['speaker'].partition('+')[2] if r['synth'] == 'espeak-ng' else r['speaker']}"
            for r in rows}


@needs_festival
def test_mini_dev_and_test_hear_variants_train_never_hears_and_flite_and_festival_speak(tmp_path):
    assert make("mini", "--out", str(tmp_path), "--train", "60", "--dev", "20", "--test", "20").returncode == 0
    heard = {split: voices(manifest(tmp_path, split)) for split in ("train", "dev", "test")}
    seen = ({f"espeak-ng/{v}" for v in corpus.SEEN_VARIANTS} | {f"flite/{v}" for v in corpus.FLITE_VOICES}
            | {f"festival/{v}" for v in corpus.FESTIVAL_VOICES})
    assert any(v.startswith("festival/") for v in heard["train"])
    own = {split: {f"espeak-ng/{v}" for v in variants}
           for split, variants in (("dev", corpus.DEV_VARIANTS), ("test", corpus.TEST_VARIANTS))}
    assert heard["train"] <= seen and any(v.startswith("flite/") for v in heard["train"])
    awb = [r["pitch"] for split in ("train", "dev", "test") for r in manifest(tmp_path, split) if r["speaker"] == "awb"]
    assert len(set(awb)) > 1 and all(corpus.FLITE_F0[0] <= f0 <= corpus.FLITE_F0[1] for f0 in awb)
    for split in ("dev", "test"):
        assert heard[split] & own[split] and heard[split] <= seen | own[split]
    assert not own["dev"] & own["test"] and not (own["dev"] | own["test"]) & seen


def test_bundled_heldout_set_shares_no_voice_and_no_transcript_with_bundled_training():
    train = manifest(REPO / "data" / "mini", "train")
    for rate in ("16k", "8k"):
        heldout = manifest(REPO / "data" / "heldout", rate)
        assert not voices(heldout) & voices(train)
        assert not {r["text"] for r in heldout} & {r["text"] for r in train}
        assert {r["synth"] for r in heldout} >= {"festival", "flite", "espeak-ng"}


def test_bundled_other_voice_dev_set_shares_no_voice_with_training_or_heldout_and_no_transcript_with_either():
    train = manifest(REPO / "data" / "mini", "train")
    for rate in ("16k", "8k"):
        dev, heldout = manifest(REPO / "data" / "devother", rate), manifest(REPO / "data" / "heldout", rate)
        assert voices(dev) == {f"festival/{v}" for v in make_heldout.DEV_VOICES}
        assert not voices(dev) & (voices(train) | voices(heldout))
        assert not {r["text"] for r in dev} & ({r["text"] for r in train} | {r["text"] for r in heldout})


@needs_festival
@pytest.mark.parametrize("which", ["heldout", "dev"])
def test_heldout_set_is_byte_identical_for_a_seed_and_its_8k_copy_is_telephone_audio(tmp_path, which):
    for name in ("a", "b"):
        result = subprocess.run([sys.executable, "-m", "scripts.corpus.make_heldout", "--set", which, "--out",
                                 str(tmp_path / name), "--count", "8"], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    wide, narrow = manifest(tmp_path / "a", "16k"), manifest(tmp_path / "a", "8k")
    bundled = manifest(REPO / "data" / ("devother" if which == "dev" else "heldout"), "16k")[:8]
    assert [r["text"] for r in wide] == [r["text"] for r in bundled]
    assert [r["text"] for r in wide] == [r["text"] for r in narrow] and len(wide) == 8
    for row, rate in ((wide[0], 16000), (narrow[0], 8000)):
        assert soundfile.info(str(tmp_path / "a" / row["audio_filepath"])).samplerate == rate
    samples, rate = soundfile.read(str(tmp_path / "a" / narrow[0]["audio_filepath"]))
    spectrum = np.abs(np.fft.rfft(samples)) ** 2
    freqs = np.fft.rfftfreq(len(samples), 1 / rate)
    assert spectrum[freqs > 3600].sum() < 0.01 * spectrum.sum()  # band-limited to 300-3400 Hz


def median_f0(samples: np.ndarray, rate: int) -> float:
    """Median autocorrelation F0 (Hz) over the loud, clearly periodic 40 ms frames."""
    x = samples.astype(np.float64) / 32768
    frame, estimates = int(0.04 * rate), []
    lo, hi = rate // 400, rate // 60
    for start in range(0, len(x) - frame, frame // 2):
        w = x[start:start + frame]
        if np.abs(w).max() < 0.2 * np.abs(x).max():
            continue
        ac = np.correlate(w, w, "full")[frame - 1:]
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.5 * ac[0]:
            estimates.append(rate / lag)
    assert estimates, "no clearly periodic frame: no F0 to measure"
    return float(np.median(estimates))


def test_flite_awb_speaks_at_the_drawn_mean_f0_and_rms_is_given_none():
    low, high = (tts.speak("flite", "awb", "call five two nine", 175, f0, 20, 16000, "test")
                 for f0 in corpus.FLITE_F0)
    assert 1.8 < median_f0(high, 16000) / median_f0(low, 16000) < 3.5  # 220 / 80 Hz = 2.75
    rng = random.Random(0)
    awb = {corpus.utterance(rng, "train", 0, "go", "flite", "awb", 16000).pitch for _ in range(20)}
    assert len(awb) > 5 and all(corpus.FLITE_F0[0] <= f0 <= corpus.FLITE_F0[1] for f0 in awb)
    assert corpus.utterance(rng, "train", 0, "go", "flite", "rms", 16000).pitch is None


@needs_festival
@pytest.mark.parametrize("voice", corpus.FESTIVAL_VOICES)
def test_each_festival_voice_of_another_language_speaks_the_words(voice):
    samples = tts.speak("festival", voice, "call five two nine", None, None, 20, 16000, voice)
    seconds = len(samples) / 16000
    assert 0.8 < seconds < 4.0
    peak = np.abs(samples.astype(np.int32)).max() / 32768  # levelled like flite: -30 + 10 * 0.9 dBFS
    assert abs(20 * np.log10(peak) + 21.0) < 0.5
