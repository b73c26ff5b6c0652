"""Runs that survive preemption and never hang: atomic checkpoints, SIGTERM/SIGUSR1 checkpoint-and-exit,
``--ckpt_path last`` across a run's versions, and collective timeouts that end the job with a message.

- ``AtomicCheckpointIO`` (``trainer.plugins`` in configs/trainer.yaml): each checkpoint is written to
  a temporary file beside its path and renamed over it, so a kill mid-write leaves the previous file.
- ``Preemption`` (a callback in configs/trainer.yaml): SIGTERM (spot preemption, ``kill``), SIGUSR1
  (SLURM's ``--signal=USR1@90``) or SIGINT (Ctrl-C) on any rank makes every rank stop after the same
  optimizer step (one process: the current one; several: the next logging step), write ``last.ckpt`` once
  (weights, optimizer, schedule, loop and sampler position) and exit, with status 0 (130 after Ctrl-C, as an
  interrupted command). Under SLURM, SIGUSR1 also requeues the job. A second signal ends the process at once.
  Data workers ignore these signals and end with their rank (asr.data.workers).
  A shard stream that waits for a batch heeds the signal too (asr.data.stream_loader), and a run that its data
  stops (asr.data.faults.DataFaultError: too many failures, or a stream that stalled) writes ``last.ckpt`` first
  where it trained.
- ``last_checkpoints``: what ``--ckpt_path last`` resumes from, the run folder's last*.ckpt, newest first.
- ``FitLoop`` (asr.fit's Trainer uses it): a run resumed from a checkpoint written at an epoch's end starts
  the next epoch, with ``max_steps`` set too.
- ``describe_failure``: one line naming the rank and the Lightning hook a collective timed out in.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import signal
import subprocess
import traceback
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.loop import _Loop
from pytorch_lightning.utilities import rank_zero_info

from asr.atomic import write_atomically
from asr.data.faults import DataFaultError
from asr.data.workers import PREEMPTION_SIGNALS
from asr.intervals import host_step

# Lightning's 30 minutes leave a deadlocked job burning its devices for half an hour. Ten minutes is
# far above any collective of a healthy run (a checkpoint write on rank 0, every rank's first compiled step).
COLLECTIVE_TIMEOUT_MINUTES = 10.0


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to ``<path>.<random>.partial`` in the checkpoint's folder, fsync, then rename over ``path``.

    Lightning's own writer stages the file in the system temp folder and moves it, which is a copy, not an
    atomic rename, whenever that folder is on another file system than the run.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f"{path.name}.*.partial"):  # left by a writer killed mid-write
            stale.unlink(missing_ok=True)
        try:
            with write_atomically(path) as partial:
                with open(partial, "wb") as f:
                    torch.save(checkpoint, f)
                    f.flush()
                    os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:  # torch.save on a full disk: "[enforce fail ...] unexpected pos"
            free = shutil.disk_usage(path.parent).free
            full = getattr(err, "errno", None) == errno.ENOSPC or "unexpected pos" in str(err) or free < 2**20
            reason = "no space left on the device" if full else " ".join(str(err).split())[:160]
            raise CheckpointWriteError(f"{path}: checkpoint not written ({reason}; {free / 2**20:.1f} MiB free); "
                                       "the previous one is intact") from err


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder gone read-only); names the file."""


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint is written; asr.fit exits 0 with its message
    (130 when ``signal`` is SIGINT: the user interrupted it)."""

    def __init__(self, message: str, signal_name: str | None = None):
        super().__init__(message)
        self.signal = signal_name


class Preemption(pl.Callback):
    """SIGTERM / SIGUSR1 -> finish the step, write ``last.ckpt`` on every rank's behalf, raise ``Preempted``.

    The signal only sets a flag (a handler must not enter a collective: Lightning's own SIGTERM handler
    broadcasts from inside the handler and deadlocks). One process checks it after every optimizer step.
    Several ranks sum their flags, one tiny all-reduce, at each logging step (asr.intervals, every
    ``trainer.log_every_n_steps``), so all stop after the same step even when only one was signalled: the
    first logging step at or after the signal's, up to log_every_n_steps - 1 steps later than one process
    would. Lightning's own check, a broadcast and a host read every batch, is off while these handlers are on.
    """

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}
        self._step = -1
        self._started = 0  # the global step this process's training started at
        self._loop = None  # the epoch loop whose per-batch SIGTERM broadcast is off while the handlers are ours

    def _handle(self, signum: int, frame) -> None:
        if self.received:  # a second signal: the user insists (or a rank is stuck), so die as asked
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.received = signal.Signals(signum).name

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after Lightning registered its handlers (Trainer._run), so ours replace them during training;
        # a SIGTERM that Lightning's handler took while the checkpoint and loaders were being set up counts
        self.received, self._step = ("SIGTERM" if trainer.received_sigterm else None), trainer.global_step
        self._started = trainer.global_step
        self._previous = {s: signal.signal(s, self._handle) for s in PREEMPTION_SIGNALS}
        self._loop = trainer.fit_loop.epoch_loop
        self._loop._broadcast_sigterm_tensor = lambda: None  # its flag is set by Lightning's handler, now replaced

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._loop is not None:
            vars(self._loop).pop("_broadcast_sigterm_tensor", None)
            self._loop = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Also write ``last.ckpt`` when a run from an endless stream (data.train_shards) stops by max_steps or
        max_time between checkpoints: its epoch never ends, so no epoch-end checkpoint keeps those steps."""
        self._restore()
        if trainer is None:
            return
        saved = [getattr(cb, "_last_global_step_saved", -1) for cb in trainer.checkpoint_callbacks]
        if math.isinf(trainer.num_training_batches) and trainer.global_step not in saved:
            trainer.save_checkpoint(last_checkpoint_path(trainer))  # every rank: FSDP writes its shard (or gathers for rank 0)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Also write ``last.ckpt`` where the run trained when its data stops it (every rank raises DataFaultError
        at the same point), so that it resumes once the data is mended."""
        self._restore()
        fitting = trainer.state.fn == "fit"  # not a test after fitting, whose weights may be the best checkpoint's
        if isinstance(exception, DataFaultError) and fitting and trainer.global_step > self._started:
            path = last_checkpoint_path(trainer)
            trainer.save_checkpoint(path)  # every rank, as they all stop here
            rank_zero_info(f"wrote {path} at step {trainer.global_step} before stopping: once the data is mended, "
                           "resume with the same command and --ckpt_path last")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step:  # mid gradient accumulation: wait for the update
            return
        self._step = trainer.global_step
        if self.signalled(trainer):
            self.stop(trainer)

    def stop(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` where this process trained, requeue under SLURM after SIGUSR1, raise Preempted. Every
        rank calls it at the same step; asr.data.stream_loader calls it too, where one process waits for data."""
        path, trained = last_checkpoint_path(trainer), trainer.global_step > self._started
        if trained:
            trainer.save_checkpoint(path)  # every rank: FSDP writes its shard (or gathers for rank 0)
        signalled = self.received or "a signal on another rank"
        if self.received == "SIGUSR1" and trainer.is_global_zero:
            requeue_slurm_job()
        done = f"stopped after step {trainer.global_step} and wrote {path}" if trained else \
            f"stopped at step {trainer.global_step}, before this run trained a step: nothing new to write"
        raise Preempted(f"{signalled}: {done}; resume with the same command and --ckpt_path last", self.received)

    def signalled(self, trainer: pl.Trainer) -> bool:
        """Whether any rank was signalled: this process's flag, or, with several ranks, their sum at a logging
        step (one all-reduce and one host read; False between them)."""
        if trainer.world_size == 1:
            return self.received is not None
        if not host_step(trainer):
            return False
        flag = torch.tensor([1.0 if self.received else 0.0], device=trainer.strategy.root_device)
        return bool(trainer.strategy.reduce(flag, reduce_op="sum").item())


def last_checkpoint_path(trainer: pl.Trainer) -> Path:
    """``last.ckpt`` in the folder of the trainer's ModelCheckpoint callbacks (the run's checkpoints/)."""
    folders = [cb.dirpath for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    folder = Path(folders[0]) if folders else Path(trainer.default_root_dir) / "checkpoints"
    return folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"


class FitLoop(_FitLoop):
    """Lightning's fit loop, but a run resumed from a checkpoint written at an epoch's end (ModelCheckpoint in
    on_train_epoch_end, as last.ckpt is) starts the next epoch also when ``max_steps`` is set. Lightning marks
    such a loop as restarting whenever max_steps is set (``_FitLoop.restarting``), so the resumed run replays
    the finished epoch as an empty one and counts it again: one epoch of training lost (Lightning issue 19617,
    asr issue 44). Here a finished epoch is never restarted, with or without max_steps."""

    def _set_restarting(self, restarting: bool) -> None:
        progress = self.epoch_progress.current
        unfinished = progress.ready != progress.processed or progress.started != progress.processed
        _Loop.restarting.fset(self, restarting and unfinished)

    restarting = property(_Loop.restarting.fget, _set_restarting)

    @classmethod
    def replace(cls, trainer: pl.Trainer) -> None:
        """Put one in place of ``trainer``'s fit loop, with its limits and epoch loop."""
        loop = cls(trainer, min_epochs=trainer.fit_loop.min_epochs, max_epochs=trainer.fit_loop.max_epochs)
        loop.epoch_loop = trainer.fit_loop.epoch_loop
        trainer.fit_loop = loop


def requeue_slurm_job() -> None:
    """``scontrol requeue`` this SLURM job, so it starts again (with --ckpt_path last it resumes)."""
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if job and re.fullmatch(r"[0-9_]+", job):
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        rank_zero_info(f"scontrol requeue {job}: {'done' if result.returncode == 0 else result.stderr.strip()}")


def last_checkpoints(*run_folders: Path) -> list[Path]:
    """The ``last*.ckpt`` files (or FSDP's folders) under each of ``run_folders`` (``<save_dir>/<name>``), any version
    (or, run without a logger or given one version's folder, in ``run_folder/checkpoints``), the most recently written
    first."""
    found = [p for run_folder in run_folders
             for p in (*run_folder.glob("version_*/checkpoints/last*.ckpt"), *run_folder.glob("checkpoints/last*.ckpt"))]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def set_collective_timeout(strategy, minutes: float) -> None:
    """The process group's timeout (DDP and ModelParallel strategies take it before they set up)."""
    if hasattr(strategy, "_timeout"):
        strategy._timeout = timedelta(minutes=minutes)


def is_collective_timeout(error: BaseException) -> bool:
    """A collective of torch.distributed that timed out, by the backends' own words (gloo raises a plain
    RuntimeError, nccl a DistBackendError); not any error that mentions a timeout."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out waiting" in text or "collective operation timeout" in text)


def failing_hook(error: BaseException) -> str:
    """The innermost Lightning hook on the error's traceback, as "Class.hook" ("unknown" if none)."""
    hook = "unknown"
    for frame, _ in traceback.walk_tb(error.__traceback__):
        names = frame.f_locals
        if frame.f_code.co_name == "_call_callback_hooks" and "callback" in names:
            hook = f"{type(names['callback']).__name__}.{names['hook_name']}"
        elif frame.f_code.co_name in ("_call_lightning_module_hook", "_call_strategy_hook"):
            owner = names.get("pl_module") or names["trainer"].strategy
            hook = f"{type(owner).__name__}.{names['hook_name']}"
    return hook


def describe_failure(error: BaseException, rank: int, minutes: float) -> str:
    """One line for a collective that timed out: the rank, the hook, and what to look at."""
    return (f"rank {rank}: a collective (all-reduce, broadcast or barrier) did not complete within {minutes:g} "
            f"min in {failing_hook(error)}: another rank stopped, or entered a different collective. "
            "Its log says which; --collective_timeout sets the limit.")
