"""What a run costs, measured on this machine: ``python -m asr.bench [--quick] [--out bench.json]``.

Prints one table (section, figure, value, target, met) and writes it as JSON. Every figure is a
rate or a ratio of two timings taken in this run, so a slower machine moves both sides:

1. peak: the fastest (size x size) matrix product in fp32 and bf16, measured before and between the
   training runs (the best counts): the MFU denominators.
2. train: forward, CTC loss, backward and AdamW step of the ``small`` and ``base`` presets on
   length-bucketed batches, in 32-true and bf16-mixed; audio seconds per second and
   MFU = 3 x forward FLOPs of the unpadded utterances (asr.cost) / seconds / peak of the same dtype.
3. batching: BucketBatchSampler against random batches with the same ``max_batch_seconds``:
   padded share of the audio over a whole epoch, and training throughput.
4. loop: ``pl.Trainer.fit`` on ASRModule against a plain PyTorch loop (same model, batches,
   optimizer, and torch.autocast precision): step-time overhead.
5. features (1 thread, with and without decoding the FLAC files), data wait share of a training
   step with the DataLoader as configs/default.yaml configures it, and batched greedy inference RTF.

The corpus is synthetic and generated from a seed into a temporary folder: FLAC files at 16 kHz
whose lengths follow a LibriSpeech-like distribution (1-20 s, mean ~12 s) with ~3 tokens a second.
``--quick`` (CI) uses the tiny preset, a small corpus of utterances a quarter as long and few steps,
and checks nothing but that every section runs; its figures are not the targets' figures.
``--profile`` prints torch.profiler's top operators of one ``base`` training step in fp32 and bf16.

Models are built as ``python -m asr.fit --config configs/model/<preset>.yaml`` builds them: the model
section of configs/default.yaml under the preset's shapes (so attention_window, dropout, ... are the defaults').
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import soundfile
import torch
import yaml
from torch.utils.data import DataLoader

from asr import cost
from asr.audio import FeatureConfig, FeatureExtractor
from asr.data import ASRDataModule, Batch
from asr.sampler import BucketBatchSampler
from asr.model import CTCModel
from asr.module import ASRModule, WarmupCosine, ctc_loss
from asr.atomic import write_atomically
from asr.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 16000  # the corpus and every model here are 16 kHz (80 log-mel features)
TOKENS_PER_SECOND = 3.0  # LibriSpeech with a ~1k-piece tokenizer: ~2.7 words/s, ~1.2 pieces per word
DTYPE = {"32-true": "fp32", "bf16-mixed": "bf16"}  # precision -> the matmul dtype of its MFU peak
INFERENCE_BATCH_SECONDS = 120.0  # as asr.transcribe.Transcriber batches by default
TARGETS = {  # figure -> (comparison, threshold); the goals for the full mode
    "train/base/32-true/mfu": (">=", 0.40), "train/base/bf16-mixed/mfu": (">=", 0.40),
    "batching/bucketed/padding": ("<", 0.03), "loop/overhead": ("<=", 0.03),
    "features/features_x_real_time": (">=", 1000.0), "data/wait_share": ("<", 0.05),
    "inference/rtf": ("<=", 0.005),
}


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run; QUICK and FULL below."""

    train_presets: tuple[str, ...]  # configs/model presets timed in section 2
    preset: str  # the preset of sections 3-5 (batching, loop, data wait, inference)
    utterances: int  # synthetic corpus size
    length_scale: float  # utterance lengths are LibriSpeech-like (1-20 s) times this
    batch_seconds: float  # data.max_batch_seconds of every training batch
    steps: int  # timed training steps per measurement, after one warm-up step
    passes: int  # timed passes over the steps' batches; each batch's fastest pass counts
    inference_seconds: float  # audio transcribed for the RTF
    matmul_size: int  # side of the square matrices of the peak measurement
    seed: int = 0


FULL = Settings(("small", "base"), "small", 400, 1.0, 60.0, 4, 2, 600.0, 1024)
QUICK = Settings(("tiny",), "tiny", 48, 0.25, 10.0, 1, 1, 10.0, 512)


# ---- synthetic corpus ----

def corpus_durations(n: int, seed: int, scale: float = 1.0) -> list[float]:
    """``n`` durations in seconds, 1-20 s, mean ~12 s, skewed long like LibriSpeech's training sets; all
    multiplied by ``scale`` (quick mode: shorter utterances, the same shape of distribution)."""
    rng = np.random.default_rng(seed)
    return [round(scale * (1.0 + 19.0 * x), 2) for x in rng.beta(2.2, 1.6, n)]  # Beta mean 0.58 -> 12.0 s


def speech_like(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """(n,) float32: a gliding harmonic tone under a ~4 Hz syllable envelope, plus noise (FLAC-compressible)."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t)  # Hz
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6)), 0, None)
    return (0.2 * voice * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def write_corpus(root: Path, n: int, seed: int, scale: float = 1.0) -> tuple[Path, Path]:
    """Write ``n`` FLAC files, ``root/train.jsonl`` and a unigram tokenizer; returns (manifest, tokenizer).

    Texts are pseudo-words drawn until the tokenizer gives ~TOKENS_PER_SECOND tokens per second.
    """
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = sorted({"".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(400)})
    tokenizer = Tokenizer.train([" ".join(rng.permutation(words)) for _ in range(20)], "unigram", 256)
    word_tokens = {w: len(tokenizer.encode(w)) for w in words}  # pieces never cross spaces: counts add up
    (root / "audio").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, seconds in enumerate(corpus_durations(n, seed, scale)):
        text, tokens = [], 0
        while tokens < round(TOKENS_PER_SECOND * seconds):
            text.append(str(rng.choice(words)))
            tokens += word_tokens[text[-1]]
        soundfile.write(root / "audio" / f"{i:05d}.flac", speech_like(seconds, rng), SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"audio_filepath": f"audio/{i:05d}.flac", "duration": seconds, "text": " ".join(text)}))
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    tokenizer.save(root / "tokenizer.model")
    return root / "train.jsonl", root / "tokenizer.model"


# ---- batching arithmetic ----

def random_batches(durations: list[float], max_batch_seconds: float, seed: int) -> list[list[int]]:
    """Utterances in random order, cut greedily into batches of at most ``max_batch_seconds`` padded audio."""
    order = list(range(len(durations)))
    random.Random(seed).shuffle(order)
    return BucketBatchSampler(durations, max_batch_seconds).cut(order)


def padding_fraction(durations: list[float], batches: list[list[int]]) -> float:
    """Padded share of the audio the batches hold: 1 - sum of durations / sum of (size x longest)."""
    padded = sum(len(b) * max(durations[i] for i in b) for b in batches)
    return 1.0 - sum(durations[i] for b in batches for i in b) / padded


def check_target(value: float, comparison: str, threshold: float) -> bool:
    return {">=": value >= threshold, "<": value < threshold, "<=": value <= threshold}[comparison]


# ---- models and training steps ----

def model_settings(preset: str) -> dict:
    """ASRModule's arguments in ``python -m asr.fit --config configs/model/<preset>.yaml``: the model section of
    configs/default.yaml under the preset's, the optimizer built from its class_path and init_args."""
    path = REPO / "configs" / "model" / f"{preset}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no preset {preset!r}: {path} does not exist")
    settings = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())["model"]
    settings |= yaml.safe_load(path.read_text())["model"]
    if "optimizer" in settings:
        optimizer = settings["optimizer"]
        module, name = optimizer["class_path"].rsplit(".", 1)
        settings["optimizer"] = functools.partial(getattr(importlib.import_module(module), name),
                                                  **optimizer.get("init_args", {}))
    return settings


def build_module(preset: str, tokenizer: Tokenizer) -> ASRModule:
    """ASRModule of ``model_settings(preset)``, weights from seed 0."""
    torch.manual_seed(0)
    return ASRModule(tokenizer=tokenizer, **model_settings(preset))


def plain_step(module: ASRModule, precision: str, total_steps: int, keep_gradients: bool = False):
    """step(batch): forward and CTC loss under torch.autocast, backward, the module's optimizer and lr schedule.

    bf16-true casts the module to bf16 first: weights, gradients and optimizer state, as Lightning's bf16-true.
    Gradients are freed after each step, as Lightning does, unless ``keep_gradients`` (zeroed instead, so
    that a step's peak memory above the memory before it is activations only).
    """
    if precision not in (*DTYPE, "bf16-true"):
        raise ValueError(f"precision must be one of {[*DTYPE, 'bf16-true']}, got {precision!r}")
    if precision == "bf16-true":
        module.to(torch.bfloat16)
    optimizer = module.optimizer_factory(module.parameters())
    schedule = WarmupCosine(module.hparams.warmup_steps, total_steps, module.hparams.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    module.train()

    def step(batch: Batch) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            log_probs, lengths = module.model(batch.audio, batch.audio_lengths)
            loss = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lengths)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=not keep_gradients)
        scheduler.step()

    return step


def passes(batches: list[Batch], n: int) -> list[Batch]:
    """batches[0] (the warm-up: allocations, thread pool, kernel selection) then ``n`` passes over batches[1:]."""
    return batches[:1] + batches[1:] * n


def fastest(times: list[float], n: int) -> float:
    """Seconds of one pass: each batch's fastest of its ``n`` passes, summed (other processes only ever slow a step)."""
    per_pass = len(times) // n
    return sum(min(times[i::per_pass]) for i in range(per_pass))


def plain_times(module: ASRModule, precision: str, sequence: list[Batch]) -> list[float]:
    """Wall seconds of each plain-loop step over sequence[1:], after a warm-up step on sequence[0]."""
    step = plain_step(module, precision, len(sequence))
    step(sequence[0])
    stamps = [time.perf_counter()]
    for batch in sequence[1:]:
        step(batch)
        stamps.append(time.perf_counter())
    return np.diff(stamps).tolist()


def train_figures(model: CTCModel, batches: list[Batch], seconds: float, peak: float | None) -> dict[str, float]:
    """asr.cost.rates of ``batches`` trained in ``seconds`` (x_real_time, padding, mfu if ``peak`` is given, ...)."""
    counts = sum(cost.batch_counts(b, model) for b in batches)
    figures = cost.rates(dict(zip(cost.COUNTS, counts.tolist())), seconds, SAMPLE_RATE, peak)
    return figures | {"step_s": seconds / len(batches)}


class _Clock(pl.Callback):
    """Stamps the start of every batch and the end of the last: a batch's time includes the loop's work around it."""

    def __init__(self):
        self.stamps: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end = time.perf_counter()


def lightning_times(module: ASRModule, precision: str, sequence: list[Batch]) -> list[float]:
    """Wall seconds of each ``pl.Trainer.fit`` step over sequence[1:] (no logger, checkpoints, progress bar
    or validation); sequence[0] warms up, as in plain_times."""
    clock = _Clock()
    loader = DataLoader(sequence, batch_size=None, collate_fn=_as_is)  # already collated, in memory
    with _quiet():
        trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision, max_steps=len(sequence),
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                             callbacks=[clock])
        trainer.fit(module, train_dataloaders=loader)
    return np.diff(clock.stamps[1:] + [clock.end]).tolist()


LIGHTNING_LOGGERS = ("pytorch_lightning", "pytorch_lightning.utilities.rank_zero", "lightning_fabric",
                     "lightning_fabric.utilities.rank_zero")


def _as_is(batch: Batch) -> Batch:
    return batch


@contextlib.contextmanager
def _quiet():
    """Silence Lightning's info lines, its few-batches warnings and ASRModule's epoch line during a timed fit."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# ---- the sections ----

def measure_peaks(settings: Settings, peaks: dict[str, float] | None = None) -> dict[str, float]:
    """The fastest matrix product in fp32 and bf16 so far: ``peaks`` raised to what this measurement gives.

    Called between the timed runs, so a moment of load from other processes cannot lower the denominator."""
    peaks = dict(peaks or {})
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        peaks[name] = max(peaks.get(name, 0.0), cost.measure_matmul_flops(dtype, settings.matmul_size, reps=10))
    return peaks


def measure_training(settings: Settings, tokenizer: Tokenizer, batches: list[Batch], peaks: dict) -> tuple[dict, dict]:
    """Figures of each preset and precision, and the peaks (raised by measurements between the runs)."""
    results = {}
    for preset in settings.train_presets:
        for precision in DTYPE:
            module = build_module(preset, tokenizer)
            seconds = fastest(plain_times(module, precision, passes(batches, settings.passes)), settings.passes)
            results[f"{preset}/{precision}"] = train_figures(module.model, batches[1:], seconds, None)
            peaks = measure_peaks(settings, peaks)
    for name, figures in results.items():
        figures["mfu"] = figures["model_flops_per_s"] / peaks[DTYPE[name.split("/")[1]]]
    return results, peaks


def measure_batching(settings: Settings, tokenizer: Tokenizer, dataset, durations: list[float]) -> dict:
    bucketed = BucketBatchSampler(durations, settings.batch_seconds, seed=settings.seed).global_batches()
    shuffled = random_batches(durations, settings.batch_seconds, settings.seed)
    results = {}
    for name, batches in (("bucketed", bucketed), ("random", shuffled)):
        loaded = [dataset[b] for b in batches[: settings.steps + 1]]
        times = plain_times(build_module(settings.preset, tokenizer), "bf16-mixed", passes(loaded, settings.passes))
        seconds = fastest(times, settings.passes)
        audio = sum(float(b.audio_lengths.sum()) for b in loaded[1:]) / SAMPLE_RATE
        results[name] = {"padding": padding_fraction(durations, batches), "x_real_time": audio / seconds,
                         "batches": len(batches)}
    return results


def measure_loop(settings: Settings, tokenizer: Tokenizer, batches: list[Batch]) -> dict:
    """Lightning's step time over the plain loop's, bf16-mixed, each run from the same initial weights.

    The two loops alternate, one pass per run, so a burst of load elsewhere spoils one pass, not one side."""
    plain, lightning = [], []
    for _ in range(settings.passes):
        plain += plain_times(build_module(settings.preset, tokenizer), "bf16-mixed", batches)
        lightning += lightning_times(build_module(settings.preset, tokenizer), "bf16-mixed", batches)
    plain_s, lightning_s = fastest(plain, settings.passes), fastest(lightning, settings.passes)
    return {"plain_s": plain_s, "lightning_s": lightning_s, "overhead": lightning_s / plain_s - 1}


def measure_features(dataset, batches: list[list[int]]) -> dict:
    """x real time of the feature front end on one thread, with the FLAC decoding and without it."""
    extractor, threads = FeatureExtractor(FeatureConfig.preset(SAMPLE_RATE)), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start, loaded = time.perf_counter(), []
        for indices in batches:
            loaded.append(dataset[indices])
            extractor(loaded[-1].audio, loaded[-1].audio_lengths)
        with_decoding = time.perf_counter() - start
        start = time.perf_counter()
        for batch in loaded:
            extractor(batch.audio, batch.audio_lengths)
        features = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    audio = sum(float(b.audio_lengths.sum()) for b in loaded) / SAMPLE_RATE
    return {"decode_features_x_real_time": audio / with_decoding, "features_x_real_time": audio / features,
            "audio_seconds": audio}


def measure_data_wait(settings: Settings, tokenizer: Tokenizer, datamodule: ASRDataModule) -> dict:
    """Share of training wall time spent waiting for the configured DataLoader (first batch excluded)."""
    step = plain_step(build_module(settings.preset, tokenizer), "bf16-mixed", settings.steps + 1)
    loader = iter(datamodule.train_dataloader())
    step(next(loader))  # worker start-up and the model's warm-up
    start, wait = time.perf_counter(), 0.0
    for _ in range(settings.steps):
        before = time.perf_counter()
        batch = next(loader, None)
        wait += time.perf_counter() - before
        if batch is None:
            break
        step(batch)
    total = time.perf_counter() - start
    return {"wait_share": wait / total, "num_workers": datamodule.hparams.num_workers,
            "speed_perturb": list(datamodule.hparams.speed_perturb)}


@torch.inference_mode()
def measure_inference(settings: Settings, tokenizer: Tokenizer, dataset, durations: list[float]) -> dict:
    """Real-time factor of batched greedy transcription (model(audio, lengths) + greedy + detokenise), fp32."""
    module = build_module(settings.preset, tokenizer).eval()
    batches, audio = [], 0.0
    for indices in BucketBatchSampler(durations, INFERENCE_BATCH_SECONDS, shuffle=False):
        if audio >= settings.inference_seconds:
            break
        batches.append(dataset[indices])
        audio += float(batches[-1].audio_lengths.sum()) / SAMPLE_RATE
    module.transcribe_batch(batches[0].audio, batches[0].audio_lengths)  # warm-up
    start = time.perf_counter()
    for batch in batches:
        module.transcribe_batch(batch.audio, batch.audio_lengths)
    return {"rtf": (time.perf_counter() - start) / audio, "audio_seconds": audio, "preset": settings.preset}


def datamodule(manifest: Path, tokenizer_model: Path, settings: Settings) -> ASRDataModule:
    """The DataModule as configs/default.yaml sets it up (workers, speed perturbation), on the synthetic corpus."""
    data = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())["data"]
    data.update(train_manifest=str(manifest), val_manifest=str(manifest), test_manifest=None,
                tokenizer_model=str(tokenizer_model), max_batch_seconds=settings.batch_seconds, seed=settings.seed)
    module = ASRDataModule(**data)
    module.setup("fit")
    return module


def run(settings: Settings, workdir: Path) -> dict:
    """Every section on a corpus generated into ``workdir``; returns the results (see the module doc)."""
    began, clock = time.perf_counter(), _SectionClock()
    results: dict = {"peak": measure_peaks(settings)}
    manifest, tokenizer_model = write_corpus(workdir, settings.utterances, settings.seed, settings.length_scale)
    data = datamodule(manifest, tokenizer_model, settings)
    tokenizer, dataset = data.tokenizer, data.load_split(str(manifest))  # dataset: no speed perturbation
    durations = [u.duration for u in dataset.utterances]
    bucketed = BucketBatchSampler(durations, settings.batch_seconds, seed=settings.seed).global_batches()
    batches = [dataset[b] for b in bucketed[: settings.steps + 1]]
    clock("corpus")
    results["train"], results["peak"] = measure_training(settings, tokenizer, batches, results["peak"])
    clock("train")
    results["batching"] = clock("batching", measure_batching(settings, tokenizer, dataset, durations))
    results["loop"] = clock("loop", measure_loop(settings, tokenizer, batches))
    results["features"] = clock("features", measure_features(dataset, bucketed))
    results["data"] = clock("data", measure_data_wait(settings, tokenizer, data))
    results["inference"] = clock("inference", measure_inference(settings, tokenizer, dataset, durations))
    results["corpus"] = {"utterances": len(durations), "hours": sum(durations) / 3600,
                         "mean_seconds": sum(durations) / len(durations)}
    results["machine"] = {"cpu": cost.cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
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

    with tempfile.TemporaryDirectory() as tmp:
        manifest, tokenizer_model = write_corpus(Path(tmp), 40, settings.seed, settings.length_scale)
        dataset = datamodule(manifest, tokenizer_model, settings).load_split(str(manifest))
        durations = [u.duration for u in dataset.utterances]
        batches = BucketBatchSampler(durations, settings.batch_seconds, shuffle=False).global_batches()
        batch = dataset[max(batches, key=lambda b: sum(durations[i] for i in b))]  # the fullest batch
        for precision in DTYPE:
            step = plain_step(build_module("base", Tokenizer.load(tokenizer_model)), precision, 2)
            step(batch)
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                step(batch)
            print(f"## base, {precision}, batch of {batch.audio.shape[0]} x {batch.audio.shape[1] / SAMPLE_RATE:.1f} s")
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
        results = run(settings, Path(tmp))
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


if __name__ == "__main__":
    main()
