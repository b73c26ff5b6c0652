"""scripts/leave_voice_out.py: a fold trains without the voices it leaves out and scores on only them, at 16 kHz
and through the telephone channel; the corpus' test split is never read; bad input is named."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr import manifest as mf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # the scripts import each other as siblings
import leave_voice_out as lvo  # noqa: E402

pytestmark = pytest.mark.skipif(not shutil.which("sox"), reason="needs sox (apt-get install sox)")
VOICES = (("flite", "rms"), ("flite", "awb"), ("espeak-ng", "en-us+m1"))


def corpus(root: Path) -> Path:
    """A corpus folder as make_corpus.py writes it: three splits, each voice in each split, one second of tone."""
    rng = np.random.default_rng(0)
    for split in ("train", "dev", "test"):
        (root / "audio" / split).mkdir(parents=True)
        lines = []
        for n, (synth, speaker) in enumerate(VOICES * 2):
            name = f"audio/{split}/{n:03d}.flac"
            sf.write(root / name, (0.3 * np.sin(np.arange(16000) * (0.1 + n / 50)) + 0.01 * rng.standard_normal(16000)),
                     16000, subtype="PCM_16")
            lines.append({"audio_filepath": name, "duration": 1.0, "text": f"{split} {n}", "synth": synth,
                          "speaker": speaker})
        (root / f"{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_fold_trains_without_the_voice_and_scores_on_its_train_and_dev_lines(tmp_path, monkeypatch):
    source = corpus(tmp_path / "mini")
    lvo.main([str(source), "--voice", "flite/rms", "--out", str(tmp_path / "fold")])
    fold = tmp_path / "fold"
    train, other, phoned = (lines(fold / f"{name}.jsonl") for name in ("train", "other16k", "other8k"))
    assert [row["text"] for row in train] == [f"train {n}" for n in (1, 2, 4, 5)]  # every other voice's line, in order
    assert [row["text"] for row in other] == ["train 0", "train 3", "dev 0", "dev 3"]  # test is never read
    assert {(row["synth"], row["speaker"]) for row in other} == {("flite", "rms")}
    assert [row["text"] for row in phoned] == [row["text"] for row in other]
    for row, call in zip(phoned, other):
        audio, rate = sf.read(row["audio_filepath"])
        original, _ = sf.read(call["audio_filepath"])
        assert rate == lvo.TELEPHONE_RATE and abs(len(audio) - len(original) / 2) < 50
        assert Path(row["audio_filepath"]).parent == fold / "audio" / "8k"
    monkeypatch.chdir(tmp_path / "mini" / "audio")  # absolute paths: the manifests work from any folder
    for name in ("train", "other16k", "other8k"):
        utterances, problems = mf.parse_manifest(fold / f"{name}.jsonl")
        assert len(utterances) == len(lines(fold / f"{name}.jsonl")) and not problems


def test_several_voices_leave_together(tmp_path):
    source = corpus(tmp_path / "mini")
    kept, other = lvo.make_fold(source, {"flite/rms", "flite/awb"}, tmp_path / "fold")
    assert (kept, other) == (2, 8)
    assert {row["synth"] for row in lines(tmp_path / "fold" / "train.jsonl")} == {"espeak-ng"}


def test_bad_input_is_named(tmp_path):
    source = corpus(tmp_path / "mini")
    with pytest.raises(SystemExit, match=r"--voice flite/kal: not a voice of .*mini"):
        lvo.make_fold(source, {"flite/kal"}, tmp_path / "fold")
    (source / "dev.jsonl").write_text((source / "dev.jsonl").read_text() + "{not json\n")
    with pytest.raises(SystemExit, match=r"dev\.jsonl:7: not a manifest line"):
        lvo.make_fold(source, {"flite/rms"}, tmp_path / "fold")
    with pytest.raises(SystemExit, match=r"nothing.*train\.jsonl: no such manifest"):
        lvo.make_fold(tmp_path / "nothing", {"flite/rms"}, tmp_path / "fold")
    assert not (tmp_path / "fold").exists()  # nothing written before the input is known to be good
