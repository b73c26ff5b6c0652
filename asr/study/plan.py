"""Plan a GPU run to a budget without training: ``python -m asr.fit --budget_gpu_hours H --plan_only``.

    python -m asr.fit --budget_gpu_hours 200 --plan_only --data.train_shards shards/train
    python -m asr.fit --budget_gpu_hours 200 --plan_only --data.train_shards shards/train --study runs/study \
        --gpu "NVIDIA A100-SXM4-80GB" --gpus 8 --mfu 0.35

From the corpus' hours (the shard indexes' durations, or a manifest's), the GPU recipe of its size
(configs/recipes/gpu-100h.yaml, gpu-1000h.yaml, gpu-10000h.yaml: batch per GPU, workers), each GPU preset's forward
FLOPs per audio-second (counted from its shapes, as asr.bench.presets does) and the passes over the corpus a
model needs:
- with ``--study OUT`` (a scaling study's study.json: steps ~ a D^k1 / M^k2 on your data), each preset's own
  steps to converge, at the study's batch, as audio-seconds;
- without one, LITERATURE_EPOCHS for every size, said as such: an assumption until a study on your data fits it.
It prints, per preset, the GPU-hours to train it that far at its MFU (each GPU preset's measured on an H200,
asr.bench.presets.MEASURED_MFU, or ``--mfu`` for all) of the GPU's dense bf16 peak, and chooses
the largest preset that fits the budget (at convergence a larger model reaches a lower error), or, when none fits,
the smallest, with the share of its passes the budget buys. Then: preset, batch, steps, workers and the expected
GPU-hours. A run on that GPU logs its own ``cost/mfu``: give it as ``--mfu`` to plan again.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import torch
import yaml

from asr.bench.gpu import GPU_PRESETS
from asr.bench.presets import mfu_of, model_of
from asr.configs import CONFIGS
from asr.data.manifest import ManifestError
from asr.data.shards import ShardIndex
from asr.data.sources import source_for
from asr.data.shard_run import shard_list
from asr.hardware import MAX_GPU_WORKERS
from asr.settings import ConfigError
from asr.train.cost import TRAIN_FLOPS_PER_FORWARD, gpu_peak_flops

LITERATURE_EPOCHS = 30.0  # passes over the corpus without a study: icefall's Zipformer and ESPnet's Conformer recipes
                          # on LibriSpeech 960 h train 30-50 epochs; the lower end, as larger corpora need fewer
RECIPES = {100: "gpu-100h.yaml", 1000: "gpu-1000h.yaml", 10000: "gpu-10000h.yaml"}  # corpus hours -> recipe
UTTERANCE_SECONDS = 15.0  # the utterance length the FLOPs are counted at (attention grows with it)


def corpus_hours(shards: str | None, manifest: str | None) -> tuple[float, str]:
    """(hours of training audio, where that came from): the shard indexes' seconds, or a manifest's durations."""
    if shards:
        indexes = [ShardIndex.read(root, "--data.train_shards") for root in shard_list(shards)]
        seconds = sum(i.seconds for i in indexes)
        return seconds / 3600, f"{sum(i.utterances for i in indexes):,} utterances in {len(indexes)} shard index(es)"
    if manifest:  # read as training reads it: the same lines kept, the same bad lines named
        utterances, problems = source_for(manifest, "--data.train_manifest").parse()
        if not utterances:
            raise ConfigError(f"--data.train_manifest {manifest}: no usable line"
                              + (f" ({len(problems):,} bad, the first {problems[0]})" if problems else ""))
        left_out = f", {len(problems):,} bad lines left out" if problems else ""
        return sum(u.duration for u in utterances) / 3600, f"{len(utterances):,} utterances of {manifest}{left_out}"
    raise ConfigError("--budget_gpu_hours --plan_only needs the corpus: --data.train_shards or --data.train_manifest")


def recipe_for(hours: float) -> Path:
    """The GPU recipe made for the corpus size nearest ``hours`` (on a log scale)."""
    size = min(RECIPES, key=lambda h: abs(math.log(max(hours, 1e-3) / h)))
    return CONFIGS / "recipes" / RECIPES[size]


@functools.lru_cache(maxsize=None)
def preset_cost(recipe: Path, preset: str) -> tuple[int, float]:
    """(parameters, forward FLOPs per audio-second in UTTERANCE_SECONDS utterances) of ``preset`` on ``recipe``,
    counted from its shapes on the meta device."""
    model = model_of(recipe, CONFIGS / "model" / f"{preset}.yaml")
    samples = round(UTTERANCE_SECONDS * model.sample_rate)
    per_second = model.forward_flops(torch.tensor([samples])).item() / UTTERANCE_SECONDS
    return sum(p.numel() for p in model.parameters()), per_second


def epochs_needed(params: float, hours: float, study: dict | None, study_batch_seconds: float) -> float:
    """Passes over ``hours`` of audio a model of ``params`` needs: the study's steps x its batch, or the literature's."""
    if not study or study.get("a") is None:
        return LITERATURE_EPOCHS
    steps = study["a"] * hours ** (study.get("k1") or 0.0) / params ** (study.get("k2") or 0.0)
    return steps * study_batch_seconds / (hours * 3600)


def plan(budget_hours: float, hours: float, gpu: str, gpus: int, mfu: float | None, study: dict | None,
         presets: list[str], study_batch_seconds: float = 0.0) -> dict:
    """Each preset's parameters, FLOPs, passes and GPU-hours, and the choice, for ``budget_hours`` of ``gpu``."""
    peak = gpu_peak_flops(gpu, "bf16")
    if peak is None:
        raise ConfigError(f"--gpu {gpu!r}: no bf16 peak known (asr.train.cost.GPU_PEAKS)")
    recipe = recipe_for(hours)
    rows = []
    for name in presets:
        params, per_second = preset_cost(recipe, name)
        epochs = epochs_needed(params, hours, study, study_batch_seconds)
        share, source = mfu_of(name, mfu)
        gpu_hours = epochs * hours * TRAIN_FLOPS_PER_FORWARD * per_second / (peak * share)
        rows.append({"preset": name, "parameters": params, "gflop_per_audio_second": per_second / 1e9,
                     "mfu": share, "mfu_from": source, "epochs": epochs, "gpu_hours": gpu_hours})
    rows.sort(key=lambda r: r["parameters"])
    fitting = [r for r in rows if r["gpu_hours"] <= budget_hours]
    chosen = fitting[-1] if fitting else rows[0]
    return {"budget_gpu_hours": budget_hours, "corpus_hours": hours, "gpu": gpu, "gpus": gpus, "mfu": mfu,
            "recipe": recipe.name, "epochs_from": "study" if study and study.get("a") else "literature",
            "rows": rows, "chosen": chosen["preset"], "fits": bool(fitting),
            "share_of_passes": min(1.0, budget_hours / chosen["gpu_hours"])}


def describe(result: dict, batch_seconds: float, workers: int) -> str:
    """The plan as printed: the table, then preset, batch, steps, workers and GPU-hours."""
    source = ("your study's fit" if result["epochs_from"] == "study" else
              f"the literature's {LITERATURE_EPOCHS:g} passes (no study given: an assumption)")
    lines = [f"{result['corpus_hours']:,.1f} h of audio, {result['gpus']} x {result['gpu']}, passes from {source}; "
             f"recipe {result['recipe']}",
             f"{'preset':<16} {'params':>8} {'GFLOP/audio-s':>13} {'MFU':>29} {'passes':>7} {'GPU-hours':>10}"]
    for r in result["rows"]:
        mfu = f"{r['mfu']:.1%} ({r['mfu_from']})"
        lines.append(f"{r['preset']:<16} {r['parameters'] / 1e6:>7.0f}M {r['gflop_per_audio_second']:>13.2f} "
                     f"{mfu:>29} {r['epochs']:>7.1f} {r['gpu_hours']:>10.1f}")
    chosen = next(r for r in result["rows"] if r["preset"] == result["chosen"])
    passes = chosen["epochs"] * result["share_of_passes"]
    global_batch = batch_seconds * result["gpus"]
    steps = round(passes * result["corpus_hours"] * 3600 / global_batch)
    hours = chosen["gpu_hours"] * result["share_of_passes"]
    why = ("the largest preset that converges within the budget" if result["fits"] else
           f"no preset converges within the budget: the smallest, for {result['share_of_passes']:.0%} of its passes")
    lines += [f"plan: {result['chosen']} ({why}); batch {batch_seconds:g} audio-seconds per GPU ({global_batch:,.0f} a "
              f"step), {steps:,} steps ({passes:.1f} passes), {workers} data workers per GPU, expected "
              f"{hours:.1f} GPU-hours of {result['gpu']}",
              f"  python -m asr.fit --config configs/recipes/{result['recipe']} --config "
              f"configs/model/{result['chosen']}.yaml --trainer.max_steps {steps} --trainer.devices {result['gpus']}"]
    return "\n".join(lines)


def study_batch_seconds(out: Path) -> float:
    """The audio-seconds of the study's batches (one data.max_batch_seconds for every trial: its trials' config.yaml)."""
    for config in sorted(out.glob("runs/*/version_*/config.yaml")):
        return float(yaml.safe_load(config.read_text())["data"]["max_batch_seconds"])
    raise ConfigError(f"--study {out}: no trial's config.yaml under runs/ to read the study's batch from")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asr.fit --budget_gpu_hours H --plan_only",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--budget_gpu_hours", type=float, required=True, help="GPU-hours to spend")
    p.add_argument("--plan_only", action="store_true", help="print the plan without training (the only mode today)")
    p.add_argument("--data.train_shards", dest="shards", help="shard folder(s) of the corpus (asr.shard)")
    p.add_argument("--data.train_manifest", dest="manifest", help="or a JSON-lines manifest of it")
    p.add_argument("--study", help="a scaling study's output folder (its study.json) fitted on your data")
    p.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="a name as torch.cuda.get_device_name gives it")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the run")
    p.add_argument("--mfu", type=float, help="share of the GPU's bf16 peak for every preset (default: each preset's "
                   "measured on an H200, asr.bench.presets.MEASURED_MFU; else asr.train.cost.ASSUMED_MFU)")
    p.add_argument("--presets", nargs="+", default=list(GPU_PRESETS))
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not args.plan_only:
        raise ConfigError("--budget_gpu_hours plans a GPU run: give --plan_only (asr does not train to GPU-hours on "
                          "its own yet); on the GPUs, run the command the plan prints")
    if args.budget_gpu_hours <= 0:
        raise ConfigError(f"--budget_gpu_hours must be positive, got {args.budget_gpu_hours:g}")
    hours, source = corpus_hours(args.shards, args.manifest)
    study, batch = None, 0.0
    if args.study:
        study_file = Path(args.study) / "study.json"
        if not study_file.is_file():
            raise ConfigError(f"--study {args.study}: no study.json there (python -m asr.study writes it)")
        study = json.loads(study_file.read_text())
        batch = study_batch_seconds(Path(args.study))
    result = plan(args.budget_gpu_hours, hours, args.gpu, args.gpus, args.mfu, study, args.presets, batch)
    recipe = yaml.safe_load((CONFIGS / "recipes" / result["recipe"]).read_text())
    batch_seconds = float(recipe["data"]["max_batch_seconds"])
    print(f"corpus: {source}")
    print(describe(result, batch_seconds, MAX_GPU_WORKERS))
    return result


def run() -> None:
    try:
        main()
    except (ConfigError, ManifestError, OSError) as err:
        sys.exit(f"asr.fit: error: {err}")
