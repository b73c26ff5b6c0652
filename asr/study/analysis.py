"""The scaling study's numbers: steps to convergence, the power-law fit, the plateau, time and cost.

Pure functions on plain numbers (no Lightning), used by ``python -m asr.study`` (asr/study/run.py).
Definitions follow Ardalani, Hestness and Diamos (Baidu SVAIL), "Have a Larger Cake and Eat it
Faster Too": a run has converged at the first validation whose loss is within 1% of the run's
minimum validation loss, and steps to convergence are modelled as ``a * D**k1 / M**k2``
(D = training audio hours, M = parameters).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from asr.train.cost import ASSUMED_MFU, compute_dtype, gpu_peak_flops, project

CONVERGED_WITHIN = 0.01  # converged = validation loss within 1% of the run's minimum (the paper's definition)
PLATEAU_GAIN = 0.10  # a larger size that saves less than 10% of the steps is on the plateau


def steps_to_converge(steps: list[int], losses: list[float], within: float = CONVERGED_WITHIN) -> int:
    """The first validation step whose loss is within ``within`` (relative) of the curve's minimum.

    ``steps`` and ``losses`` are one run's validations in step order. Noisy, non-monotone curves
    count their first entry into the band, even if the loss leaves it again later.
    """
    if not steps or len(steps) != len(losses):
        raise ValueError(f"need one loss per validation step, got {len(steps)} steps and {len(losses)} losses")
    best = min(losses)
    bound = best + within * abs(best)
    return next(step for step, loss in zip(steps, losses) if loss <= bound)


def check_window(window: int) -> None:
    if window < 1 or window % 2 == 0:
        raise ValueError(f"the smoothing window must be an odd number of validations, got {window}")


def smoothed(steps: list[int], losses: list[float], window: int) -> tuple[list[int], list[float]]:
    """The centred moving average of a validation curve over ``window`` (odd) validations, at the steps where
    the whole window fits: a narrower window at the end would let the last one or two validations decide
    the minimum. A curve shorter than the window, or ``window`` 1, is returned as it is."""
    check_window(window)
    if window == 1 or len(losses) < window:
        return list(steps), list(losses)
    half = window // 2
    averages = [statistics.fmean(losses[i - half:i + half + 1]) for i in range(half, len(losses) - half)]
    return list(steps[half:len(steps) - half]), averages


def stopped_early(losses: list[float], patience: int) -> bool:
    """Whether ``patience`` validations followed the curve's (first) minimum without a lower loss, as
    Lightning's EarlyStopping decides; a curve cut by max_steps before that has not converged."""
    return len(losses) - 1 - losses.index(min(losses)) >= patience


class PowerLaw(NamedTuple):
    """log steps = log a + k1 log D - k2 log M, least squares; k1 or k2 is None when the grid has one D or one M."""

    a: float
    k1: float | None
    k2: float | None
    r2: float
    trials: int

    def steps(self, hours: float, params: float) -> float:
        """The fitted steps to convergence at ``hours`` of training audio and ``params`` parameters."""
        return self.a * hours ** (self.k1 or 0.0) / params ** (self.k2 or 0.0)


def fit_power_law(hours: list[float], params: list[float], steps: list[float]) -> PowerLaw:
    """Least-squares fit in log space over every trial; R^2 of log steps. Needs 2 trials or more."""
    if len(steps) < 2:
        raise ValueError(f"the fit needs at least 2 finished trials, got {len(steps)}")
    y = np.log(np.asarray(steps, dtype=float))
    log_d, log_m = np.log(np.asarray(hours, dtype=float)), np.log(np.asarray(params, dtype=float))
    columns, names = [np.ones_like(y)], ["log_a"]
    if np.ptp(log_d) > 0:  # one data size says nothing about k1
        columns.append(log_d), names.append("k1")
    if np.ptp(log_m) > 0:
        columns.append(-log_m), names.append("k2")
    x = np.stack(columns, axis=1)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(np.sum((y - x @ coef) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    found = dict(zip(names, coef.tolist()))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    return PowerLaw(math.exp(found["log_a"]), found.get("k1"), found.get("k2"), r2, len(steps))


def plateau(params: list[float], steps: list[float], gain: float = PLATEAU_GAIN) -> float | None:
    """The smallest size beyond which no larger size takes ``gain`` (10%) fewer steps; None if the grid's
    largest size still saves steps (no plateau within the grid) or there is one size only."""
    ranked = sorted(zip(params, steps))
    for i, (size, count) in enumerate(ranked[:-1]):
        if all(later > (1 - gain) * count for _, later in ranked[i + 1:]):
            return size
    return None


def geometric_means(keys: list, values: list[float]) -> dict:
    """{key: geometric mean of its values}: steps of one size averaged over data fractions, in log space."""
    logs: dict = {}
    for key, value in zip(keys, values):
        logs.setdefault(key, []).append(math.log(value))
    return {key: math.exp(sum(v) / len(v)) for key, v in logs.items()}


@dataclass(frozen=True)
class Target:
    """A GPU to project the trials onto (an estimate from their model FLOPs).

    Args:
        name: a GPU that asr.train.cost.GPU_PEAKS knows: A100, H100, H100 PCIe, L4, A10G, T4, V100, RTX 4090, ...
        mfu: the model FLOPs utilisation assumed there (0.3-0.5 is usual for large Transformers).
        devices: GPUs per trial (data parallel).
        price_per_device_hour: price of one GPU for one hour; 0 = no cost.
        step_overhead: seconds each step takes beyond its FLOPs (kernel launches, optimizer, data), e.g. the
            cost/step_seconds of a very small model on that GPU; 0 = FLOPs only, which flatters small models.
    """

    name: str = "A100"
    mfu: float = ASSUMED_MFU
    devices: int = 1
    price_per_device_hour: float = 0.0
    step_overhead: float = 0.0


def gpu_step_seconds(flops_per_step: float, target: Target, precision: str) -> float:
    """Estimated seconds per step on ``target``: its step overhead plus the step's model FLOPs at the assumed
    MFU of its peak (``flops_per_step`` counts the whole job's FLOPs, spread over ``target.devices``)."""
    dtype = compute_dtype(precision, "high")  # fp32 training on a GPU is usually allowed tf32
    peak = gpu_peak_flops(target.name, dtype)
    if peak is None:
        raise ValueError(f"gpu.name {target.name!r}: no {dtype} peak in asr.train.cost.GPU_PEAKS; "
                         f"name one of its GPUs (A100, H100, L4, A10G, T4, V100, RTX 4090, ...)")
    return target.step_overhead + flops_per_step / (peak * target.mfu * target.devices)


def projections(row: dict, target: Target, precision: str, devices_here: int, price_here: float) -> dict:
    """Time to converge (steps x seconds/step), device-hours and cost, here and on ``target`` (an estimate)."""
    here = project(row["seconds_per_step"], row["steps"], devices_here, price_here)
    gpu_seconds = gpu_step_seconds(row["flops_per_step"], target, precision)
    there = project(gpu_seconds, row["steps"], target.devices, target.price_per_device_hour)
    return {"hours_here": here.wall_hours, "device_hours_here": here.device_hours, "cost_here": here.cost,
            "gpu_seconds_per_step": gpu_seconds, "hours_gpu": there.wall_hours,
            "device_hours_gpu": there.device_hours, "cost_gpu": there.cost}


def soonest(rows: list[dict], key: str) -> dict | None:
    """The converged row of the largest data fraction with the least ``key`` (hours_here or hours_gpu): a
    trial cut by max_steps has not converged, so its time is no answer."""
    largest = max((r["fraction"] for r in rows), default=None)
    candidates = [r for r in rows
                  if r["fraction"] == largest and r["converged"] and math.isfinite(r.get(key, math.nan))]
    return min(candidates, key=lambda r: r[key], default=None)


def duration(hours: float) -> str:
    """'0.0412 s', '42 s', '7.5 min' or '3.2 h'."""
    seconds = hours * 3600
    return f"{seconds:.3g} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{hours:.1f} h"


def answer(rows: list[dict], target: Target) -> str:
    """One sentence: the size that converges soonest here, and the one that would on ``target``."""
    here, there = soonest(rows, "hours_here"), soonest(rows, "hours_gpu")
    if here is None or there is None:
        return ("No finished trial of the largest data fraction has converged within max_steps with a measured "
                "step time yet.")

    def size(row: dict) -> str:
        return f"d_model {row['width']} x {row['depth']} layers ({row['params'] / 1e6:.2f}M parameters)"

    return (f"With the largest data fraction ({here['fraction']:g}: {here['train_hours']:.2f} h of audio), "
            f"{size(here)} converges soonest on this machine ({here['steps']} steps, "
            f"{duration(here['hours_here'])}); on {target.devices} x {target.name} the soonest would be "
            f"{size(there)} ({there['steps']} steps, {duration(there['hours_gpu'])}, an estimate "
            f"from model FLOPs at MFU {target.mfu:g}).")
