"""Training steps that never wait for the device: what the host needs is read at logging steps.

On a GPU the host queues a step's kernels ahead of the device. Reading a device tensor on the host
(``.item()``, ``.tolist()``, ``bool(tensor)``, ``if tensor:``) or a blocking collective (Lightning's
``strategy.reduce`` adds a barrier) makes it wait for all of them, so the device idles while the next step
is queued. A training step therefore reads nothing back: each owner keeps what it counts on the device (or,
for host facts such as a signal, per rank on the host) and reads or agrees on it only at a ``host_step``, one
read and, with several ranks, one collective each:

    asr.train.module.ASRModule    train/loss_step, train/skipped_steps, max_consecutive_skips, the max_time clock
    asr.train.cost.CostMonitor    cost/...
    asr.train.resilience.Preemption  whether any rank was signalled
    asr.data.faults.DataFaults    a split's failed utterances against data.filter.max_dropped_share

What must be the same on every rank within the step (the global batch's token count that scales the loss,
whether to skip an update) is summed with ``all_sum``, which queues the collective on the device and returns.
tests/train/test_syncs.py (one process; CUDA's sync debug mode on a GPU) and tests/e2e/test_syncs.py (DDP and
FSDP) count a step's host reads and collectives.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch


def host_step(trainer: pl.Trainer) -> bool:
    """Whether the host reads device values now: at Lightning's logging steps (every ``trainer.log_every_n_steps``
    optimizer steps, and the last one when the run stops), or at every step with logging off (0). The same
    answer on every rank; call it before the step's update has been counted (before on_advance_end)."""
    return trainer.log_every_n_steps <= 0 or trainer._logger_connector.should_update_logs


def all_sum(tensor: torch.Tensor, trainer: pl.Trainer) -> torch.Tensor:
    """``tensor`` summed over the ranks in place, queued on the device with no host wait and no barrier
    (torch.distributed.all_reduce); as it is on one rank. Every rank must call it at the same point."""
    if trainer.world_size > 1:
        torch.distributed.all_reduce(tensor)
    return tensor
