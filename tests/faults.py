"""Fault injection for tests of asr.fit runs: ``--trainer.callbacks+={"class_path": "tests.faults.SignalAt", ...}``.

A real signal, sent by the training process to itself (rank 0) after a chosen optimizer step, so a test
interrupts a run at a known point instead of guessing with timers.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytorch_lightning as pl


class SignalAt(pl.Callback):
    """After optimizer step ``step`` on rank 0, send ``signal`` to this process, or with ``group`` to its
    whole process group (every rank of a local run, as when a machine dies)."""

    def __init__(self, step: int, signal: str = "SIGTERM", group: bool = False):
        self.step, self.signal, self.group = step, signal, group

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.is_global_zero and trainer.global_step == self.step:
            self.step = -1  # once
            number = getattr(signal, self.signal)
            os.killpg(os.getpgid(0), number) if self.group else os.kill(os.getpid(), number)


def signal_at(step: int, name: str = "SIGTERM", group: bool = False) -> list[str]:
    """The asr.fit arguments that add a SignalAt callback."""
    spec = {"class_path": "tests.faults.SignalAt", "init_args": {"step": step, "signal": name, "group": group}}
    return [f"--trainer.callbacks+={json.dumps(spec)}"]


class SleepOnRank(pl.Callback):
    """Rank ``rank`` sleeps ``seconds`` in its first on_train_epoch_end: a stuck rank, for timeout tests."""

    def __init__(self, rank: int = 1, seconds: float = 60.0):
        self.rank, self.seconds = rank, seconds

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module) -> None:
        if trainer.global_rank == self.rank and self.seconds:
            seconds, self.seconds = self.seconds, 0
            time.sleep(seconds)
