"""What a run costs, measured on this machine: ``python -m asr.bench [--quick] [--out bench.json]``.

Prints one table (section, figure, value, target, met) and writes it as JSON. Every figure is a
rate or a ratio of two timings taken in this run, so a slower machine moves both sides:

1. peak: the fastest (size x size) matrix product in fp32 and bf16, measured before and between the
   training runs (the best counts): the MFU denominators.
2. train: ASRModule's own training step (asr.bench.steps.plain_step: training_step, its optimizer and lr
   schedule, under the trainer's precision plugin) of the ``small`` and ``base`` presets on the train
   loader's batches, in 32-true and bf16-mixed; audio seconds per second and
   MFU = 3 x forward FLOPs of the unpadded utterances (asr.train.cost) / seconds / peak of the same dtype.
3. batching: the train loader's BucketBatchSampler against random batches with the same
   ``max_batch_seconds``: padded share of the audio over a whole epoch, and training throughput.
4. loop: ``pl.Trainer.fit`` on ASRModule against the same step in a plain PyTorch loop (same model,
   batches, optimizer, schedule and precision plugin): step-time overhead.
5. features (the model's front end, 1 thread, with and without decoding the FLAC files), data wait share
   of a training step with the train loader as the default run configures it, and the real-time
   factor of asr.transcribe's Transcriber.

Nothing is re-implemented: model, data and trainer are built by asr.train.fitting.build from configs/model/<preset>.yaml
and overrides that point data.* at the corpus (``fit_args``), as ``python -m asr.fit --config
configs/model/<preset>.yaml ...`` builds them (asr.bench.steps).
The corpus is synthetic and generated from a seed into a temporary folder (asr.bench.corpus): FLAC files
at the configured data.sample_rate whose lengths follow a LibriSpeech-like distribution (1-20 s, mean
~12 s) with ~3 tokens a second. ``--quick`` (CI) uses the tiny preset, a small corpus of utterances a
quarter as long and few steps, and checks nothing but that every section runs; its figures are not the
targets' figures. ``--profile`` prints torch.profiler's top operators of one ``base`` training step in
fp32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from asr.bench.corpus import write_corpus, write_tokenizer
from asr.train import cost
from asr.bench.sections import (PRECISIONS, Settings, measure_batching, measure_data_wait, measure_features,
                                measure_inference, measure_loop, measure_peaks, measure_training, training_batches)
from asr.atomic import write_atomically
from asr.bench.steps import build, plain_step
from asr.data.datamodule import ASRDataModule

TARGETS = {  # figure -> (comparison, threshold); the goals for the full mode
    "train/base/32-true/mfu": (">=", 0.40), "train/base/bf16-mixed/mfu": (">=", 0.40),
    "batching/bucketed/padding": ("<", 0.03), "loop/overhead": ("<=", 0.03),
    "features/features_x_real_time": (">=", 1000.0), "data/wait_share": ("<", 0.05),
    "inference/rtf": ("<=", 0.005),
}
FULL = Settings(("small", "base"), "small", 400, 1.0, 60.0, 4, 2, 600.0, 1024)
QUICK = Settings(("tiny",), "tiny", 48, 0.25, 10.0, 1, 1, 10.0, 512)


def check_target(value: float, comparison: str, threshold: float) -> bool:
    return {">=": value >= threshold, "<": value < threshold, "<=": value <= threshold}[comparison]


def fit_args(workdir: Path, settings: Settings) -> tuple[str, ...]:
    """asr.fit overrides that train on the corpus in ``workdir`` (train and val: the same manifest, no test)
    with its tokenizer, ``settings``' batch seconds and seed, and the run folder in ``workdir``."""
    manifest = workdir / "train.jsonl"
    return (f"--data.train_manifest={manifest}", f"--data.val_manifest={manifest}", "--data.test_manifest=null",
            f"--data.tokenizer.model={workdir / 'tokenizer.model'}",
            f"--data.max_batch_seconds={settings.batch_seconds}", f"--data.seed={settings.seed}",
            f"--seed_everything={settings.seed}", f"--trainer.default_root_dir={workdir}")


def prepare(settings: Settings, workdir: Path) -> tuple[tuple[str, ...], ASRDataModule]:
    """Write the corpus into ``workdir`` at the configured sample rate; (fit_args, the DataModule set up for fit)."""
    write_tokenizer(workdir, settings.seed)
    args = fit_args(workdir, settings)
    data = build(settings.preset, *args).datamodule  # not set up yet: its sample rate says how to write the audio
    write_corpus(workdir, settings.utterances, settings.seed, settings.length_scale, data.hparams.sample_rate,
                 data.tokenizer)
    data.setup("fit")
    return args, data


def run_sections(settings: Settings, workdir: Path) -> dict:
    """Every section on a corpus generated into ``workdir``; returns the results (see the module doc)."""
    began, clock = time.perf_counter(), _SectionClock()
    results: dict = {"peak": measure_peaks(settings.matmul_size)}
    args, data = prepare(settings, workdir)
    batches = training_batches(data, settings.steps + 1)
    clock("corpus")
    results["train"], results["peak"] = measure_training(settings, args, batches, results["peak"])
    clock("train")
    results["batching"] = clock("batching", measure_batching(settings, args, data))
    results["loop"] = clock("loop", measure_loop(settings, args, batches))
    results["features"] = clock("features", measure_features(settings, args, data))
    results["data"] = clock("data", measure_data_wait(settings, args, data))
    results["inference"] = clock("inference", measure_inference(settings, args, data))
    durations = [u.duration for u in data.datasets["val"].utterances]
    results["corpus"] = {"utterances": len(durations), "hours": sum(durations) / 3600,
                         "mean_seconds": sum(durations) / len(durations), "sample_rate": data.hparams.sample_rate}
    results["machine"] = {"cpu": f"{cost.cpu_name()} ({cost.cpu_kernels()})", "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "settings": asdict(settings), "wall_seconds": time.perf_counter() - began,
                          "section_seconds": clock.seconds}
    results["targets"] = targets(results)
    return results


class _SectionClock:
    """clock(name, value) records the wall seconds since the previous call under ``name`` and returns value."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, name: str, value=None):
        now = time.perf_counter()
        self.seconds[name], self.last = now - self.last, now
        print(f"asr.bench: {name} done in {self.seconds[name]:.0f} s", file=sys.stderr, flush=True)  # progress
        return value


def flatten(results: dict, prefix: str = "") -> dict[str, float]:
    """{"train/base/32-true/mfu": 0.31, ...}: every number of the sections, by its path."""
    flat = {}
    for key, value in results.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


def targets(results: dict) -> dict[str, dict]:
    """Each TARGETS figure this run measured: its value, the target and whether it was met."""
    flat = flatten(results)
    return {name: {"value": flat[name], "target": f"{comparison} {threshold:g}",
                   "met": check_target(flat[name], comparison, threshold)}
            for name, (comparison, threshold) in TARGETS.items() if name in flat}


SHOWN = ("peak/", "train/", "batching/", "loop/", "features/decode", "features/features", "data/wait", "inference/rtf")


def table(results: dict) -> str:
    """Markdown table of the headline figures: | figure | value | target | met |."""
    goals = results["targets"]
    rows = ["| figure | value | target | met |", "|---|---|---|---|"]
    for name, value in flatten({k: v for k, v in results.items() if k not in ("targets", "machine")}).items():
        if not name.startswith(SHOWN) or name.endswith(("/utterances_per_s", "/tokens_per_s", "/batches")):
            continue
        shown = f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
        goal = goals.get(name)
        rows.append(f"| {name} | {shown} | {goal['target'] if goal else ''} | "
                    f"{('yes' if goal['met'] else 'NO') if goal else ''} |")
    return "\n".join(rows)


def write_json(results: dict, path: Path) -> None:
    """Write-then-rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with write_atomically(path) as partial:
        partial.write_text(json.dumps(results, indent=1))


def profile(settings: Settings, rows: int = 15) -> None:
    """Print torch.profiler's top operators (self CPU time) of one ``base`` training step per precision."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with tempfile.TemporaryDirectory(prefix="asr-bench-") as tmp:
        args, data = prepare(replace(settings, utterances=40), Path(tmp))
        dataset, batches = data.datasets["val"], list(data.val_dataloader().sampler)
        batch = dataset[max(batches, key=lambda b: sum(dataset.utterances[i].duration for i in b))]  # the fullest
        for precision in PRECISIONS:
            step = plain_step(build("base", *args, f"--trainer.precision={precision}"), 2)
            step(batch)
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                step(batch)
            seconds = batch.audio.shape[1] / dataset.sample_rate
            print(f"## base, {precision}, batch of {batch.audio.shape[0]} x {seconds:.1f} s")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny preset, 48 utterances of 0.25-5 s, 1 timed step each (CI, < 3 min)")
    parser.add_argument("--out", type=Path, default=Path("bench.json"), help="where to write the results as JSON")
    parser.add_argument("--profile", action="store_true", help="only profile one base step in fp32 and bf16")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.profile:
        profile(settings)
        return None
    with tempfile.TemporaryDirectory(prefix="asr-bench-") as tmp:
        results = run_sections(settings, Path(tmp))
    write_json(results, args.out)
    machine = results["machine"]
    print(f"{'quick' if args.quick else 'full'} mode, {machine['cpu']}, {machine['threads']} threads, "
          f"torch {machine['torch']}, {machine['wall_seconds']:.0f} s; corpus {results['corpus']['utterances']} "
          f"utterances, {results['corpus']['hours'] * 60:.1f} min")
    if args.quick:
        print("quick mode checks that every section runs: tiny preset and sizes, so no figure here is a target's")
    print(table(results))
    print(f"wrote {args.out}")
    return results


def run() -> None:
    """The command, as ``asr bench`` and ``python -m asr.bench`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
