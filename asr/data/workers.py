"""The data workers of every loader of asr (asr.data.datamodule's and a shard stream's): how each starts, and how they
end with the process that started them.

A run stops at PREEMPTION_SIGNALS by writing a checkpoint (asr.train.resilience.Preemption). SLURM and machine
shutdowns signal every process, so a data worker ignores them (``init_data_worker``): one killed by the signal would
fail its rank before the checkpoint is written; workers end with their rank instead (``end_data_workers_at_exit``).
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing.util  # registers multiprocessing's exit handler before ours (see end_data_workers_at_exit)
import signal
import time

from lightning_fabric.utilities.seed import pl_worker_init_function

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)  # SIGINT: Ctrl-C


def init_data_worker(worker_id: int, rank: int = 0) -> None:
    """DataLoader ``worker_init_fn``: seed the worker from (seed, worker, rank) as Lightning's own
    ``pl_worker_init_function`` does (which a custom worker_init_fn replaces; without the rank, every
    rank would draw the same augmentations), and ignore the preemption signals: SLURM and machine
    shutdowns signal every process, and a data worker killed by it would fail its rank before the
    checkpoint; workers end with their rank instead."""
    pl_worker_init_function(worker_id, rank)
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@functools.cache
def end_data_workers_at_exit() -> None:
    """Call in the process that starts workers with ``init_data_worker``. At interpreter exit,
    multiprocessing stops daemonic children with SIGTERM and then joins them; a worker that ignores
    SIGTERM and whose loader is still alive (persistent workers of a DataModule that a script or test
    still holds) would be joined forever. This runs first (atexit is last in, first out)."""
    atexit.register(_end_daemonic_children)


def _end_daemonic_children(grace_seconds: float = 1.0) -> None:
    """SIGTERM every daemonic child, as multiprocessing would; SIGKILL those still alive after the grace."""
    children = [child for child in multiprocessing.active_children() if child.daemon]
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace_seconds
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
