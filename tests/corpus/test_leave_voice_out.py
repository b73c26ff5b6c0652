"""scripts/corpus/leave_voice_out.py: a fold trains and validates without the voices it leaves out and scores on
only them, at 16 kHz and through the telephone channel; the corpus' test split is never read; bad input is named,
and leaves no fold behind."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr.data import manifest as mf
import scripts.corpus.leave_voice_out as lvo

needs_sox = pytest.mark.skipif(not shutil.which("sox"), reason="needs sox (apt-get install sox)")
VOICES = (("flite", "rms"), ("flite", "awb"), ("espeak-ng", "en-us+m1"))


def corpus(root: Path) -> Path:
    """A corpus folder as make_corpus.py writes it: three splits, each voice twice in each, a second of tone each."""
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


@needs_sox
def test_a_fold_trains_without_the_voice_and_scores_on_its_train_and_dev_lines(tmp_path):
    source = corpus(tmp_path / "mini")
    lvo.main([str(source), "--voice", "flite/rms", "--out", str(tmp_path / "fold")])
    fold = tmp_path / "fold"
    train, dev, other, phoned = (lines(fold / f"{name}.jsonl") for name in ("train", "dev", "other16k", "other8k"))
    assert [row["text"] for row in train] == [f"train {n}" for n in (1, 2, 4, 5)]  # every other voice's line, in order
    assert [row["text"] for row in dev] == [f"dev {n}" for n in (1, 2, 4, 5)]  # validation does not hear it either
    assert [row["text"] for row in other] == ["train 0", "train 3", "dev 0", "dev 3"]  # test is never read
    assert {(row["synth"], row["speaker"]) for row in other} == {("flite", "rms")}
    assert [row["text"] for row in phoned] == [row["text"] for row in other]
    for row, call in zip(phoned, other):
        audio, rate = sf.read(row["audio_filepath"])
        original, _ = sf.read(call["audio_filepath"])
        assert rate == lvo.tts.TELEPHONE_RATE and abs(len(audio) - len(original) / 2) < 50
        assert Path(row["audio_filepath"]).parent == fold / "audio" / "8k"
    for name in ("train", "dev", "other16k", "other8k"):  # absolute paths: the manifests work from any folder
        assert all(Path(row["audio_filepath"]).is_absolute() for row in lines(fold / f"{name}.jsonl"))
        utterances, problems = mf.parse_manifest(fold / f"{name}.jsonl")
        assert len(utterances) == len(lines(fold / f"{name}.jsonl")) and not problems


@needs_sox
def test_several_voices_leave_together_and_a_second_run_needs_overwrite(tmp_path):
    source, fold = corpus(tmp_path / "mini"), tmp_path / "fold"
    assert lvo.make_fold(source, {"flite/rms", "flite/awb"}, fold) == (2, 8)
    assert {row["synth"] for row in lines(fold / "train.jsonl")} == {"espeak-ng"}
    with pytest.raises(SystemExit, match=r"--out .*fold already holds a fold .*--overwrite"):
        lvo.make_fold(source, {"flite/rms"}, fold)
    assert lvo.make_fold(source, {"flite/rms"}, fold, overwrite=True) == (4, 4)
    assert len(list((fold / "audio" / "8k").iterdir())) == 4  # nothing left from the first fold


def test_bad_input_is_named_and_leaves_no_fold(tmp_path):
    source, fold = corpus(tmp_path / "mini"), tmp_path / "fold"
    with pytest.raises(SystemExit, match=r"--voice flite/kal: not a voice of .*mini"):
        lvo.make_fold(source, {"flite/kal"}, fold)
    with pytest.raises(SystemExit, match=r"leaves no line of .*train\.jsonl to train on"):
        lvo.make_fold(source, {"flite/rms", "flite/awb", "espeak-ng/en-us+m1"}, fold)
    with pytest.raises(SystemExit, match=r"--out .*mini: is the corpus itself"):
        lvo.make_fold(source, {"flite/rms"}, source)
    with pytest.raises(SystemExit, match=r"nothing.*train\.jsonl: no such manifest"):
        lvo.make_fold(tmp_path / "nothing", {"flite/rms"}, fold)
    (source / "dev.jsonl").write_text((source / "dev.jsonl").read_text() + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"dev\.jsonl:8: not a manifest line"):  # the blank line 7 is skipped
        lvo.make_fold(source, {"flite/rms"}, fold)
    assert not fold.exists()
    (source / "dev.jsonl").write_text((source / "dev.jsonl").read_text().replace("\n{not json\n", ""))
    (source / "audio" / "dev" / "003.flac").unlink()  # flite/rms's second dev line
    with pytest.raises(SystemExit, match=r"dev\.jsonl:4: .*003\.flac"):
        lvo.make_fold(source, {"flite/rms"}, fold)
    assert not any(fold.glob("*.jsonl"))  # no manifest of a fold that could not be finished
    for split in ("train", "dev"):  # manifests that record no voice at all, as users' own often do
        rows = [{k: v for k, v in row.items() if k not in ("synth", "speaker")} for row in lines(source / f"{split}.jsonl")]
        (source / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(SystemExit, match=r"mini: its manifests record no synth and speaker"):
        lvo.make_fold(source, {"flite/rms"}, fold)
