"""The learning-rate schedule of every run: warm-up, then a cosine to a floor, by steps or by the clock."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning rate's schedule (``--model.schedule.*``; WarmupCosine runs it).

    Args:
        warmup_steps: optimizer steps of linear warm-up from 0 to the optimizer's lr.
        warmup_share: with --trainer.max_time, warm-up also ends once this share of the time has passed, if that
            comes first: it lasts at most this share of the steps this machine makes in that time, so a slower
            machine leaves warm-up too.
        min_lr_ratio: after warm-up the lr follows a cosine down to lr * min_lr_ratio at the last step, or, with
            --trainer.max_time, when the time runs out if that comes first.
    """

    warmup_steps: int = 400  # the Czech recipe's Conformer warm-up (docs/benchmarks.md, 2026-11-23 late morning)
    warmup_share: float = 0.3  # about the Czech recipe's 400 warm-up steps in its 15 minutes on the CPU it was tuned
    # on, and fewer on a slower one (docs/benchmarks.md, 2026-11-23 late morning and 2026-11-26)
    min_lr_ratio: float = 0.05

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise ValueError(f"model.schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 < self.warmup_share <= 1.0:
            raise ValueError(f"model.schedule.warmup_share must be in (0, 1], got {self.warmup_share:g}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"model.schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio:g}")


class WarmupCosine:
    """lr multiplier: a linear ramp from 0 to 1 over ``warmup`` steps, times a cosine from 1 down to ``floor``.

    The cosine's progress is the larger of the step progress, (step - warmup) / (total - warmup), and,
    when the run is bounded by time, the time progress, ``elapsed / duration`` (seconds), so the lr reaches
    the floor at whichever limit comes first. In a run bounded by time the ramp also ends once
    ``warmup_share`` of the time has passed: with N = step x duration / elapsed, the steps this machine
    will make at its rate so far (updated every step), warm-up lasts min(warmup, warmup_share x N) steps,
    so a machine that makes few steps in the time leaves warm-up all the same. ``total`` may be set after
    construction (None until then counts as no progress past warm-up); ``elapsed`` is set by the owner of
    the clock before each scheduler step (ASRModule: the ranks' mean of trainer.max_time's Timer, so every
    rank has one lr). ``ScheduleConfig`` holds its settings and their defaults.
    """

    def __init__(self, warmup: int, total: int | float | None, floor: float, duration: float | None = None, *,
                 warmup_share: float):
        self.warmup, self.total, self.floor = warmup, total, floor
        self.duration, self.elapsed, self.warmup_share = duration, 0.0, warmup_share

    @classmethod
    def of(cls, config: ScheduleConfig) -> "WarmupCosine":
        """The schedule ``config`` describes, its length (``total``, ``duration``) set later by its owner."""
        return cls(config.warmup_steps, None, config.min_lr_ratio, warmup_share=config.warmup_share)

    def progress(self, step: int) -> float:
        """How far along the cosine, 0 to 1: steps past warm-up, or the share of ``duration`` elapsed."""
        steps = (step - self.warmup) / max(1, (self.total or step) - self.warmup)
        seconds = self.elapsed / self.duration if self.duration else 0.0
        return min(1.0, max(0.0, steps, seconds))

    def ramp(self, step: int) -> float:
        """How far along warm-up, 0 to 1: steps over ``warmup``, or time over ``warmup_share`` of ``duration``."""
        if self.warmup <= 0:
            return 1.0
        seconds = self.elapsed / (self.duration * self.warmup_share) if self.duration else 0.0
        return min(1.0, max((step + 1) / self.warmup, seconds))

    def __call__(self, step: int) -> float:
        return self.ramp(step) * (self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * self.progress(step))))
