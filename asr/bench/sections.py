"""The sections of asr.bench, each timing the product's own code (see asr.bench.steps) on the synthetic corpus.

Every section gets ``args``, the asr.fit overrides that point a run at the corpus (asr.bench.fit_args), and
the ASRDataModule they build, set up for fitting: its train split as configured (speed perturbation,
augmentation), its val split (the same manifest) plain. Models are built per measurement from the same
seed; the configured ``trainer.precision`` applies where a section does not name one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

import torch

from asr.bench.corpus import padding_fraction, random_batches
from asr.bench.steps import build, fastest, lightning_times, passes, plain_step, plain_times
from asr.data.batch import Batch
from asr.data.datamodule import ASRDataModule
from asr.hardware import emulates_bf16
from asr.inference.transcriber import Transcriber
from asr.models.ctc import CTCModel
from asr.train import cost

PRECISIONS = ("32-true", "bf16-mixed")  # section 2's; each MFU is against the peak of cost.compute_dtype's dtype


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run; asr.bench.QUICK and FULL."""

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


def measure_peaks(matmul_size: int, peaks: dict[str, float] | None = None) -> dict[str, float]:
    """The fastest matrix product in fp32 and bf16 so far: ``peaks`` raised to what this measurement gives.

    Called between the timed runs, so a moment of load from other processes cannot lower the denominator."""
    peaks = dict(peaks or {})
    for name in ("fp32", "bf16"):
        measured = cost.measure_matmul_flops(cost.TORCH_DTYPES[name], matmul_size, reps=10)
        peaks[name] = max(peaks.get(name, 0.0), measured)
    return peaks


def training_batches(data: ASRDataModule, count: int) -> list[Batch]:
    """The first ``count`` batches of the epoch the train loader gives (sampler, workers, augmentation), in memory."""
    return list(islice(data.train_dataloader(), count))


def train_figures(model: CTCModel, batches: list[Batch], seconds: float, peak: float | None) -> dict[str, float]:
    """asr.train.cost.rates of ``batches`` trained in ``seconds`` (x_real_time, padding, mfu if ``peak`` is given, ...)."""
    counts = sum(cost.batch_counts(b, model) for b in batches)
    figures = cost.rates(dict(zip(cost.COUNTS, counts.tolist())), seconds, model.sample_rate, peak)
    return figures | {"step_s": seconds / len(batches)}


def measure_training(settings: Settings, args: Sequence[str], batches: list[Batch], peaks: dict) -> tuple[dict, dict]:
    """Figures of each preset and precision, and the peaks (raised by measurements between the runs)."""
    results = {}
    precisions = [p for p in PRECISIONS if p == "32-true" or not emulates_bf16(peaks["fp32"], peaks["bf16"])]
    if len(precisions) < len(PRECISIONS):
        print(f"asr.bench: bf16-mixed not timed: a bf16 matmul ran {peaks['bf16'] / 1e9:.1f} GFLOP/s against "
              f"fp32's {peaks['fp32'] / 1e9:.1f} (this CPU emulates bf16)", file=sys.stderr)
    for preset in settings.train_presets:
        for precision in precisions:
            cli = build(preset, *args, f"--trainer.precision={precision}")
            seconds = fastest(plain_times(cli, passes(batches, settings.passes)), settings.passes)
            results[f"{preset}/{precision}"] = train_figures(cli.model.model, batches[1:], seconds, None)
            peaks = measure_peaks(settings.matmul_size, peaks)
    for name, figures in results.items():
        figures["mfu"] = figures["model_flops_per_s"] / peaks[cost.compute_dtype(name.split("/")[1])]
    return results, peaks


def measure_batching(settings: Settings, args: Sequence[str], data: ASRDataModule) -> dict:
    """The train loader's sampler against random batches of the same max_batch_seconds: padding over an
    epoch, and training throughput on the first batches of each."""
    sampler, dataset = data.train_dataloader().sampler, data.datasets["train"]
    results = {}
    for name, batches in (("bucketed", list(sampler)), ("random", random_batches(sampler, settings.seed))):
        loaded = [dataset[b] for b in batches[: settings.steps + 1]]
        times = plain_times(build(settings.preset, *args), passes(loaded, settings.passes))
        audio = sum(float(b.audio_lengths.sum()) for b in loaded[1:]) / dataset.sample_rate
        results[name] = {"padding": padding_fraction(sampler.item_seconds, batches),
                         "x_real_time": audio / fastest(times, settings.passes), "batches": len(batches)}
    return results


def measure_loop(settings: Settings, args: Sequence[str], batches: list[Batch]) -> dict:
    """Lightning's step time over the plain loop's, each run from the same initial weights and batches.

    The two loops alternate, one pass per run, so a burst of load elsewhere spoils one pass, not one side."""
    plain, lightning = [], []
    for _ in range(settings.passes):
        plain += plain_times(build(settings.preset, *args), batches)
        lightning += lightning_times(build(settings.preset, *args, f"--trainer.max_steps={len(batches)}"), batches)
    plain_s, lightning_s = fastest(plain, settings.passes), fastest(lightning, settings.passes)
    return {"plain_s": plain_s, "lightning_s": lightning_s, "overhead": lightning_s / plain_s - 1}


def measure_features(settings: Settings, args: Sequence[str], data: ASRDataModule) -> dict:
    """x real time of the model's feature front end on one thread, with the FLAC decoding and without it."""
    extractor, threads = build(settings.preset, *args).model.model.features, torch.get_num_threads()
    dataset = data.datasets["val"]  # the corpus without augmentation: decoding and features only
    torch.set_num_threads(1)
    try:
        start, loaded = time.perf_counter(), []
        for indices in data.val_dataloader().sampler:
            loaded.append(dataset[indices])
            extractor(loaded[-1].audio, loaded[-1].audio_lengths)
        with_decoding = time.perf_counter() - start
        start = time.perf_counter()
        for batch in loaded:
            extractor(batch.audio, batch.audio_lengths)
        features = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    audio = sum(float(b.audio_lengths.sum()) for b in loaded) / dataset.sample_rate
    return {"decode_features_x_real_time": audio / with_decoding, "features_x_real_time": audio / features,
            "audio_seconds": audio}


def measure_data_wait(settings: Settings, args: Sequence[str], data: ASRDataModule) -> dict:
    """Share of training wall time spent waiting for the configured train loader (first batch excluded)."""
    step = plain_step(build(settings.preset, *args), settings.steps + 1)
    data.datasets["train"].cache.clear()  # measure_batching filled it: read as a run's first epoch does
    loader = iter(data.train_dataloader())
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
    return {"wait_share": wait / total, "num_workers": data.workers,
            "speed_perturb": list(data.hparams.speed_perturb)}


def measure_inference(settings: Settings, args: Sequence[str], data: ASRDataModule) -> dict:
    """Real-time factor of asr.transcribe's Transcriber (its batching, FLAC decoding, model, greedy search and
    word alignment; fp32) on the corpus' first ``settings.inference_seconds`` of audio."""
    transcriber = Transcriber(build(settings.preset, *args).model)
    utterances, chosen, audio = data.datasets["val"].utterances, [], 0.0
    for utt in utterances:
        if audio >= settings.inference_seconds:
            break
        chosen.append(utt)
        audio += utt.duration
    transcriber.transcribe_utterances(chosen[:1])  # warm-up
    start = time.perf_counter()
    transcriber.transcribe_utterances(chosen)
    return {"rtf": (time.perf_counter() - start) / audio, "audio_seconds": audio, "preset": settings.preset}
