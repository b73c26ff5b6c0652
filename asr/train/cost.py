"""What a run costs: throughput, model FLOPs utilisation (MFU), padding, data waits, projected bill.

``CostMonitor`` is a Lightning callback; add it to ``trainer.callbacks`` (configs/trainer.yaml
does). Every ``trainer.log_every_n_steps`` optimizer steps, and once per epoch (names ending in
``_epoch``), it logs under ``cost/``:

    x_real_time        audio seconds trained on per wall second
    utterances_per_s, tokens_per_s
    model_flops_per_s  3 x forward FLOPs of the unpadded utterances (backward = 2 x forward)
    mfu                model_flops_per_s / the devices' summed peak FLOP/s
    padding            padded samples / all samples in the batches
    padding_flops      share of the executed model FLOPs spent on padded frames
    data_wait          share of wall time between one batch's end and the next one's start
    step_seconds       wall seconds per optimizer step
    run_hours, run_device_hours, run_cost   the configured run, projected (interval logs only)

Model FLOPs are the useful work, by the usual MFU convention: padding is not in them (see
padding_flops), nor the forward that activation checkpointing recomputes. Counts are summed
over ranks (DDP/FSDP), so every figure is the whole job's, and MFU is against the sum of the
devices' peaks. Per step the callback queues a few dozen tiny tensor ops on the device (about
0.1 ms of host time) and reads them back, one sync, only at logging intervals. Validation time
is left out of the rates but kept in the projection.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import platform
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn

from asr.atomic import write_atomically
from asr.hardware import CACHE_DIR

if TYPE_CHECKING:  # annotations only: asr.data asks asr.hardware, which asks this module, for its workers
    from asr.data.batch import Batch

PEAK_CACHE = CACHE_DIR / "peak_flops.json"  # measured CPU peaks, reused across runs
TRAIN_FLOPS_PER_FORWARD = 3  # forward + backward, which costs twice the forward (grads of inputs and weights)
ASSUMED_MFU = 0.4  # a model's share of a GPU's dense bf16 peak where none is measured: large Transformers' usual

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU: (fp32, tf32, bf16, fp16). Datasheets quote tensor
# figures "with sparsity"; those are halved here. bf16/fp16 are the rates with fp32 accumulation,
# which PyTorch's matmuls use. None: the GPU has no tensor cores for that type. First match wins.
GPU_PEAKS: list[tuple[str, tuple[float | None, ...]]] = [
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5, PCIe, NVL columns)
    (r"h100.*pcie", (51, 378, 756.5, 756.5)),
    (r"h100.*nvl", (60, 417.5, 835.5, 835.5)),
    (r"h100", (67, 494.5, 989.5, 989.5)),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM, NVL columns): the H100's arithmetic with more memory
    (r"h200.*nvl", (60, 417.5, 835.5, 835.5)),
    (r"h200", (67, 494.5, 989.5, 989.5)),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe alike)
    (r"a100", (19.5, 156, 312, 312)),
    # NVIDIA L4 Tensor Core GPU datasheet
    (r"\bl4\b", (30.3, 60, 121, 121)),
    # NVIDIA A10 Tensor Core GPU datasheet: AWS's A10G is an A10 variant with no datasheet of its own
    (r"a10g", (31.2, 62.5, 125, 125)),
    # NVIDIA T4 Tensor Core GPU datasheet: fp16/fp32 mixed precision only
    (r"\bt4\b", (8.1, None, None, 65)),
    # NVIDIA V100 Tensor Core GPU datasheet (V100S PCIe, V100 PCIe, V100 SXM2)
    (r"v100s", (16.4, None, None, 130)),
    (r"v100.*pcie", (14, None, None, 112)),
    (r"v100", (15.7, None, None, 125)),
    # NVIDIA Ada GPU architecture whitepaper, appendix table for the GeForce RTX 4090
    (r"rtx 4090", (82.6, 82.6, 165.2, 165.2)),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, appendix table for the GeForce RTX 3090
    (r"rtx 3090(?! ti)", (35.6, 35.6, 71, 71)),
]
DTYPES = ("fp32", "tf32", "bf16", "fp16")  # the columns of GPU_PEAKS
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COUNTS = ("audio_samples", "batch_samples", "utterances", "tokens", "flops", "padded_flops")


class FlopCounted(Protocol):
    """What CostMonitor needs of the trained network (asr.models.ctc.CTCModel, asr.models.transducer's model)."""

    sample_rate: int  # Hz of the batches' audio

    def forward_flops(self, num_samples: torch.Tensor, num_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) lengths in samples and (B,) target tokens -> (B,) forward FLOPs of each utterance run alone (a
        transducer's prediction network and joiner grow with the tokens). ``num_tokens`` may be left out of the
        signature by a network whose FLOPs do not depend on them."""
        ...


def counted(pl_module: pl.LightningModule) -> FlopCounted:
    """The network whose FLOPs CostMonitor counts: ``pl_module.model`` if it has one, else the module itself."""
    network = getattr(pl_module, "model", pl_module)
    flops, rate = getattr(network, "forward_flops", None), getattr(network, "sample_rate", None)
    if not (callable(flops) and isinstance(rate, int)):
        raise TypeError(f"CostMonitor counts the FLOPs of {type(network).__name__}: it needs "
                        "forward_flops(num_samples) and sample_rate, as asr.models.ctc.CTCModel has")
    return network


def batch_counts(batch: Batch, model: FlopCounted, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(len(COUNTS),) totals of one batch, on the batch's device, computed without a host sync.

    ``flops`` counts each utterance at its own length and tokens; ``padded_flops`` at the longest one's, the
    length the model runs the whole batch at (``model.forward_flops`` owns what that executes).
    """
    lengths, tokens = batch.audio_lengths, batch.token_lengths
    samples = torch.cat([lengths, lengths.max().view(1)])  # one pass: utterances, then padded
    if counts_tokens(type(model).forward_flops):
        flops = model.forward_flops(samples, torch.cat([tokens, tokens.max().view(1)]))
    else:
        flops = model.forward_flops(samples)
    return torch.stack([
        lengths.sum(), lengths.new_full((), batch.audio.numel()), lengths.new_full((), len(batch.texts)),
        batch.token_lengths.sum(), flops[:-1].sum(), flops[-1] * len(lengths),
    ]).to(dtype)


@functools.cache
def counts_tokens(forward_flops) -> bool:
    """Whether a network's forward_flops takes the target tokens too (FlopCounted)."""
    return len(inspect.signature(forward_flops).parameters) > 2  # self, num_samples, num_tokens


def rates(totals: dict[str, float], seconds: float, sample_rate: int, peak_flops: float | None) -> dict[str, float]:
    """Throughput, MFU and padding of ``totals`` (keyed by COUNTS) processed in ``seconds`` of wall time."""
    model_flops = TRAIN_FLOPS_PER_FORWARD * totals["flops"] / seconds
    figures = {
        "x_real_time": totals["audio_samples"] / sample_rate / seconds,
        "utterances_per_s": totals["utterances"] / seconds,
        "tokens_per_s": totals["tokens"] / seconds,
        "model_flops_per_s": model_flops,
        "padding": 1 - totals["audio_samples"] / max(totals["batch_samples"], 1),
        "padding_flops": 1 - totals["flops"] / max(totals["padded_flops"], 1),
    }
    if peak_flops:
        figures["mfu"] = model_flops / peak_flops
    return figures


class Projection(NamedTuple):
    wall_hours: float
    device_hours: float
    cost: float  # in the currency of price_per_device_hour


def project(step_seconds: float, total_steps: float, devices: int, price_per_device_hour: float) -> Projection:
    """The whole run at ``step_seconds`` per optimizer step on ``devices`` devices (all nodes)."""
    wall = step_seconds * total_steps / 3600
    return Projection(wall, wall * devices, wall * devices * price_per_device_hour)


def compute_dtype(precision: str, float32_matmul_precision: str = "highest") -> str:
    """The column of GPU_PEAKS that matrix products run in under ``trainer.precision``."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    return "fp32" if float32_matmul_precision == "highest" else "tf32"  # "high"/"medium" allow tf32


def gpu_peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of one GPU named ``device_name`` (torch.cuda.get_device_name) in ``dtype``."""
    for pattern, peaks in GPU_PEAKS:
        if re.search(pattern, device_name.lower()):
            peak = peaks[DTYPES.index(dtype)]
            if peak is None and dtype == "tf32":  # no tf32 units: fp32 matmuls run as plain fp32
                peak = peaks[DTYPES.index("fp32")]
            return None if peak is None else peak * 1e12
    return None


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text() if cpuinfo.is_file() else "", re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or platform.machine()


def measure_matmul_flops(dtype: torch.dtype, size: int = 1024, reps: int = 5, budget_s: float = 1.0,
                         device: str | torch.device = "cpu") -> float:
    """FLOP/s of the fastest of ``reps`` (size x size) @ (size x size) products on ``device`` (this CPU); fewer
    once ``budget_s`` seconds have passed (a CPU without bf16 units takes 2.5 s for one bf16 product)."""
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b  # warm-up: thread pool start, packing buffers, kernel choice
    synchronize()
    best, began = math.inf, time.perf_counter()
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        synchronize()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() - began > budget_s:
            break
    return 2 * size**3 / best


def cpu_kernels() -> str:
    """The instruction set torch's CPU kernels use here, which decides a bf16 matmul's speed as much as the
    model does: ATen's capability (ATEN_CPU_CAPABILITY caps it) and oneDNN's cap (ONEDNN_MAX_CPU_ISA)."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return torch.backends.cpu.get_cpu_capability() + (f", oneDNN {onednn}" if onednn else "")


def cpu_peak_flops(dtype: str) -> float:
    """A CPU has no datasheet peak to look up, so measure a matmul's rate once and cache it in PEAK_CACHE
    under (CPU model, its kernels' instruction set, torch version, threads, dtype). Delete the file to measure
    again (e.g. on an idle machine)."""
    key = f"{cpu_name()} | {cpu_kernels()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {dtype}"
    try:
        cache = json.loads(PEAK_CACHE.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: measure again
        cache = {}
    if key not in cache:
        cache[key] = measure_matmul_flops(TORCH_DTYPES[dtype])
        try:  # write-then-rename, so ranks measuring at once never leave a half-written file
            PEAK_CACHE.parent.mkdir(parents=True, exist_ok=True)
            with write_atomically(PEAK_CACHE) as partial:
                partial.write_text(json.dumps(cache, indent=1))
        except OSError as err:
            rank_zero_warn(f"CostMonitor: cannot cache the CPU peak in {PEAK_CACHE} ({err}); measuring each run")
    return cache[key]


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of ``device`` at ``precision``: the GPU table, or a measured CPU peak; None if unknown."""
    dtype = compute_dtype(precision, torch.get_float32_matmul_precision())
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
    if device.type == "cpu":
        return cpu_peak_flops("fp32" if dtype == "tf32" else dtype)
    return None


class _Window:
    """Counts (on the device) and clocks since a window, a logging interval or an epoch, began."""

    def __init__(self, counts: torch.Tensor, start: float, step: int):
        self.counts, self.start, self.step, self.wait = counts, start, step, 0.0


class CostMonitor(pl.Callback):
    """Logs ``cost/...`` throughput, MFU, padding, data waits and the run's projected bill (see module doc)."""

    def __init__(self, price_per_device_hour: float = 0.0, peak_flops: float | None = None):
        """
        Args:
            price_per_device_hour: price of one device (a GPU, or a CPU machine) for one hour; 0 logs no cost.
            peak_flops: peak FLOP/s of one device, overriding the GPU table and the CPU measurement.
        """
        if price_per_device_hour < 0:
            raise ValueError(f"CostMonitor.price_per_device_hour must be >= 0, got {price_per_device_hour}")
        if peak_flops is not None and peak_flops <= 0:
            raise ValueError(f"CostMonitor.peak_flops must be positive or null, got {peak_flops}")
        self.price_per_device_hour, self.peak_flops = price_per_device_hour, peak_flops
        self._paused, self._pause_start = 0.0, None

    def _clock(self) -> float:
        """Wall seconds of training: validation time is taken out so it does not dilute the rates."""
        return time.perf_counter() - self._paused

    def _window(self, trainer: pl.Trainer) -> _Window:
        counts = torch.zeros(len(COUNTS), dtype=self._dtype, device=trainer.strategy.root_device)
        return _Window(counts, self._clock(), trainer.global_step)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._network = counted(pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = trainer.strategy.root_device
        self._dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        peak = self.peak_flops or device_peak_flops(device, str(trainer.precision))
        if peak is None:
            rank_zero_warn(f"CostMonitor: peak FLOP/s of {device} at precision {trainer.precision} unknown, so "
                           "cost/mfu is not logged; give it as the callback's peak_flops")
        known = torch.tensor([peak or 0.0, peak is None], dtype=self._dtype, device=device)
        total, missing = trainer.strategy.reduce(known, reduce_op="sum").tolist()
        self._peak = None if missing else total  # MFU is against the sum of all devices' peaks
        self._run_start, self._run_step = time.perf_counter(), trainer.global_step
        self._total_steps = trainer.estimated_stepping_batches  # inf when neither max_steps nor max_epochs
        self._interval = self._window(trainer)
        self._epoch, self._batch_end = self._window(trainer), self._clock()  # a mid-epoch resume skips epoch start

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch = self._window(trainer)
        self._batch_end = self._clock()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Batch,
                             batch_idx: int) -> None:
        # Host time in the gap between batches: mostly loading, also logger writes and checkpoints.
        # On a GPU the host runs ahead of the device, so this bounds from above what data costs.
        wait = self._clock() - self._batch_end
        self._interval.wait += wait
        self._epoch.wait += wait

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch: Batch,
                           batch_idx: int) -> None:
        counts = batch_counts(batch, self._network, self._dtype)
        self._interval.counts += counts
        self._epoch.counts += counts
        step, every = trainer.global_step, trainer.log_every_n_steps
        # Lightning writes step metrics at these optimizer steps; they are the same on every rank,
        # which the all-reduce in _figures needs.
        if every and step % every == 0 and step > self._interval.step:
            figures = self._figures(trainer, pl_module, self._interval) | self._projection(trainer)
            pl_module.log_dict({f"cost/{k}": v for k, v in figures.items()}, on_step=True, on_epoch=False)
            self._interval = self._window(trainer)
        self._batch_end = self._clock()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step > self._epoch.step:
            figures = self._figures(trainer, pl_module, self._epoch)
            # Already global, so no sync_dist: a synced epoch metric is reduced lazily, on rank 0 when its
            # progress bar asks, and that collective would deadlock against the other ranks' next one.
            pl_module.log_dict({f"cost/{k}_epoch": v for k, v in figures.items()}, on_step=False, on_epoch=True,
                               batch_size=1)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pause_start is not None:
            self._paused += time.perf_counter() - self._pause_start
            self._pause_start = None

    def _figures(self, trainer: pl.Trainer, pl_module: pl.LightningModule, window: _Window) -> dict[str, float]:
        """The window's rates. Its one host sync: the counts summed over ranks and read back."""
        summed = trainer.strategy.reduce(window.counts.clone(), reduce_op="sum")  # clone: DDP reduces in place
        totals = dict(zip(COUNTS, summed.tolist()))
        seconds = max(self._clock() - window.start, 1e-9)  # read after the sync, so the device work is in it
        figures = rates(totals, seconds, self._network.sample_rate, self._peak)
        figures["data_wait"] = window.wait / seconds
        figures["step_seconds"] = seconds / (trainer.global_step - window.step)
        return figures

    def _projection(self, trainer: pl.Trainer) -> dict[str, float]:
        steps = trainer.global_step - self._run_step
        if not steps or not math.isfinite(self._total_steps):
            return {}
        step_seconds = (time.perf_counter() - self._run_start) / steps  # validation and checkpoints included
        devices = trainer.num_devices * trainer.num_nodes
        run = project(step_seconds, self._total_steps, devices, self.price_per_device_hour)
        figures = {"run_hours": run.wall_hours, "run_device_hours": run.device_hours}
        if self.price_per_device_hour:
            figures["run_cost"] = run.cost
        return figures
