"""asr.study.plan: ``python -m asr.fit --budget_gpu_hours H --plan_only`` plans a GPU run from the corpus' size, the
presets' FLOPs and the study's fit (or the literature's passes, said as such), without training."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import soundfile

from asr.settings import ConfigError
from asr.study import plan
from tests import REPO

PRESETS = ["conformer-large", "xl"]


def index(folder, utterances: int, seconds: float):
    """A shard folder's index.json of ``utterances`` all ``seconds`` long (what asr.shard writes, less the shards)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").write_text(json.dumps({
        "format": 1, "utterances": utterances, "seconds": utterances * seconds, "durations": [seconds] * 200,
        "shards": [{"cuts": "cuts.000000.jsonl.gz", "recording": "recording.000000.tar", "utterances": utterances,
                    "seconds": utterances * seconds}]}))
    return folder


def test_the_corpus_size_comes_from_the_shard_index_without_reading_a_shard(tmp_path):
    hours, source = plan.corpus_hours(str(index(tmp_path / "s", 360_000, 10.0)), None)
    assert hours == pytest.approx(1000.0) and "360,000 utterances" in source
    assert plan.recipe_for(1000.0).name == "gpu-1000h.yaml" and plan.recipe_for(5.0).name == "gpu-100h.yaml"
    assert plan.recipe_for(20_000).name == "gpu-10000h.yaml"


def test_a_study_makes_larger_models_need_fewer_passes_and_without_one_the_literature_is_used():
    study = {"a": 1e6, "k1": 0.7, "k2": 0.2}
    small, large = (plan.epochs_needed(m, 1000.0, study, 100.0) for m in (1e8, 1e9))
    assert large < small
    assert plan.epochs_needed(1e8, 1000.0, None, 0.0) == plan.LITERATURE_EPOCHS


def test_the_plan_is_the_largest_preset_that_fits_else_the_smallest_for_the_share_it_buys():
    roomy = plan.plan(1e6, 1000.0, "NVIDIA H100 80GB HBM3", 8, 0.4, None, PRESETS)
    assert roomy["chosen"] == "xl" and roomy["fits"] and roomy["epochs_from"] == "literature"
    costs = {r["preset"]: r["gpu_hours"] for r in roomy["rows"]}
    assert costs["conformer-large"] < costs["xl"]
    tight = plan.plan(costs["conformer-large"] / 2, 1000.0, "NVIDIA H100 80GB HBM3", 8, 0.4, None, PRESETS)
    assert tight["chosen"] == "conformer-large" and not tight["fits"] and tight["share_of_passes"] == pytest.approx(0.5)


def test_each_preset_is_costed_at_its_measured_mfu_unless_one_is_given():
    """conformer-large has fewer FLOPs than large, but ran at a third of its MFU on an H200: measured, it costs more."""
    measured = plan.plan(1e6, 1000.0, "NVIDIA H100 80GB HBM3", 8, None, None, ["conformer-large", "large"])
    rows = {r["preset"]: r for r in measured["rows"]}
    assert {r["mfu_from"] for r in rows.values()} == {"measured on an H200"}
    assert rows["conformer-large"]["gpu_hours"] > rows["large"]["gpu_hours"]
    given = plan.plan(1e6, 1000.0, "NVIDIA H100 80GB HBM3", 8, 0.4, None, ["conformer-large", "large", "base"])
    rows = {r["preset"]: r for r in given["rows"]}
    assert {r["mfu_from"] for r in rows.values()} == {"given"} and {r["mfu"] for r in rows.values()} == {0.4}
    assert rows["conformer-large"]["gpu_hours"] < rows["large"]["gpu_hours"]
    unmeasured = plan.plan(1e6, 1000.0, "NVIDIA H100 80GB HBM3", 8, None, None, ["base"])["rows"][0]
    assert unmeasured["mfu_from"] == "assumed"


def test_plan_only_from_the_fit_command_prints_preset_batch_steps_workers_and_gpu_hours(tmp_path):
    shards = index(tmp_path / "shards", 360_000, 10.0)
    done = subprocess.run([sys.executable, "-m", "asr.fit", "--budget_gpu_hours", "200", "--plan_only",
                           "--data.train_shards", str(shards), "--presets", *PRESETS],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "literature's 30 passes (no study given: an assumption)" in out and "recipe gpu-1000h.yaml" in out
    plan_line = next(line for line in out.splitlines() if line.startswith("plan: "))
    assert "batch 1000 audio-seconds per GPU" in plan_line and "steps" in plan_line and "8 data workers" in plan_line
    assert "measured on an H200" in out  # each row's MFU says where it comes from
    assert "GPU-hours of NVIDIA H100" in plan_line and "python -m asr.fit --config configs/recipes/gpu-1000h.yaml" in out


def test_a_manifests_hours_are_its_usable_lines_and_one_with_none_is_refused_naming_the_first_bad_line(tmp_path):
    good = tmp_path / "a.wav"
    soundfile.write(good, [0.0] * 16000, 16000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": str(good), "duration": 1800.0, "text": "a"}) + "\n"
                        + json.dumps({"audio_filepath": str(good), "text": "no duration"}) + "\n")
    hours, source = plan.corpus_hours(None, str(manifest))
    assert hours == 0.5 and source == f"1 utterances of {manifest}, 1 bad lines left out"
    manifest.write_text(json.dumps({"audio_filepath": str(good), "text": "no duration"}) + "\n")
    with pytest.raises(ConfigError, match=rf"--data.train_manifest {manifest}: no usable line \(1 bad, the first "
                                          rf"{manifest}:1: "):
        plan.corpus_hours(None, str(manifest))


def test_a_plan_without_plan_only_or_corpus_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="--plan_only"):
        plan.main(["--budget_gpu_hours", "200", "--data.train_shards", str(index(tmp_path / "s", 10, 1.0))])
    with pytest.raises(ConfigError, match="--data.train_shards or --data.train_manifest"):
        plan.main(["--budget_gpu_hours", "200", "--plan_only"])
