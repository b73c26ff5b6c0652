"""What asr.bench and asr.bench.scaling time: the product's own model, data, trainer and training step.

``build(preset, *overrides)`` is ``python -m asr.fit --config configs/model/<preset>.yaml OVERRIDES`` up to the point where it would fit (asr.train.fitting.build), with the trainer's logger, callbacks, checkpoints, progress bar and validation off
(BENCH_TRAINER): a benchmark times the loop, not what a run writes. ``plain_step`` takes one optimizer step
of the built ASRModule as Lightning's automatic optimization takes it (its training_step, optimizer and lr
schedule, under the trainer's precision plugin) in a plain PyTorch loop; ``lightning_times`` runs the same
module through ``pl.Trainer.fit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.cli import SaveConfigCallback
from torch.utils.data import DataLoader

from asr.data.batch import Batch
from asr.train import fitting
from asr.train.module import ASRModule

BENCH_TRAINER = ("--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
                 "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                 "--trainer.limit_val_batches=0")
LIGHTNING_LOGGERS = ("pytorch_lightning", "pytorch_lightning.utilities.rank_zero", "lightning_fabric",
                     "lightning_fabric.utilities.rank_zero", "asr")


def preset_config(preset: str) -> Path:
    """configs/model/<preset>.yaml; FileNotFoundError naming it if there is no such preset."""
    path = fitting.CONFIGS / "model" / f"{preset}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no preset {preset!r}: {path} does not exist")
    return path


def build(preset: str, *overrides: str) -> fitting.ASRCLI:
    """Model, data and trainer as ``python -m asr.fit --config configs/model/<preset>.yaml OVERRIDES`` builds them,
    plus BENCH_TRAINER; weights from ``seed_everything`` (the default: 0). Nothing is set up."""
    with quiet():
        return fitting.build(["--config", str(preset_config(preset)), *BENCH_TRAINER, *overrides])


def build_module(preset: str, *overrides: str) -> ASRModule:
    """The ASRModule of ``build(preset, *overrides)``."""
    return build(preset, *overrides).model


def plain_step(cli: fitting.ASRCLI, total_steps: int, keep_gradients: bool = False) -> Callable[[Batch], None]:
    """step(batch): one optimizer step of ``cli.model``, in Lightning's order, without Lightning's loop.

    As ``trainer.fit`` sets up (configure_model, then the precision plugin's convert_module: bf16 weights for
    bf16-true, then configure_optimizers, its lr schedule ``total_steps`` long as on_train_start sets it) and
    steps: convert_input, training_step in the plugin's train_step_context (autocast for bf16-mixed), zero_grad,
    backward, configure_gradient_clipping with the trainer's settings, optimizer step, scheduler step.
    Gradients are freed by zero_grad, or with ``keep_gradients`` zeroed in place (so that a step's memory above
    the memory before it is activations only). Hooks that log (on_before_optimizer_step) need Lightning's loop;
    their cost is part of the loop's overhead.
    """
    module, trainer = cli.model, cli.trainer
    module.trainer = trainer  # training_step asks it for the world size (1: no collectives)
    plugin = trainer.precision_plugin
    module.configure_model()
    module = plugin.convert_module(module)
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    module.schedule.total = total_steps
    module.train()

    def step(batch: Batch) -> None:
        with plugin.train_step_context():
            loss = module.training_step(plugin.convert_input(batch), 0)
        optimizer.zero_grad(set_to_none=not keep_gradients)
        loss.backward()
        module.configure_gradient_clipping(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        optimizer.step()
        scheduler.step()

    return step


def passes(batches: list[Batch], n: int) -> list[Batch]:
    """batches[0] (the warm-up: allocations, thread pool, kernel selection) then ``n`` passes over batches[1:]."""
    return batches[:1] + batches[1:] * n


def fastest(times: list[float], n: int) -> float:
    """Seconds of one pass: each batch's fastest of its ``n`` passes, summed (other processes only ever slow a step)."""
    per_pass = len(times) // n
    return sum(min(times[i::per_pass]) for i in range(per_pass))


def plain_times(cli: fitting.ASRCLI, sequence: list[Batch]) -> list[float]:
    """Wall seconds of each ``plain_step`` over sequence[1:], after a warm-up step on sequence[0]."""
    step = plain_step(cli, len(sequence))
    step(sequence[0])
    stamps = [time.perf_counter()]
    for batch in sequence[1:]:
        step(batch)
        stamps.append(time.perf_counter())
    return np.diff(stamps).tolist()


class _Clock(pl.Callback):
    """Stamps the start of every batch and the end of the last: a batch's time includes the loop's work around it."""

    def __init__(self):
        self.stamps: list[float] = []
        self.end = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end = time.perf_counter()


def lightning_times(cli: fitting.ASRCLI, sequence: list[Batch]) -> list[float]:
    """Wall seconds of each ``cli.trainer.fit`` step over sequence[1:] (sequence[0] warms up, as in plain_times).

    ``cli`` is built with ``--trainer.max_steps len(sequence)``; the batches are fed from memory."""
    if cli.trainer.max_steps != len(sequence):
        raise ValueError(f"build with --trainer.max_steps={len(sequence)}, not {cli.trainer.max_steps}")
    clock = _Clock()
    # LightningCLI's SaveConfigCallback would write config.yaml into the run folder: a benchmark writes none
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, SaveConfigCallback)] + [clock]
    loader = DataLoader(sequence, batch_size=None)  # batch_size None: each item is already a collated Batch
    with quiet():
        cli.trainer.fit(cli.model, train_dataloaders=loader)
    return np.diff(clock.stamps[1:] + [clock.end]).tolist()


@contextlib.contextmanager
def quiet():
    """Silence Lightning's and asr's info lines, warnings and ASRModule's epoch line while building or timing."""
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
