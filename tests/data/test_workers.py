"""asr.data.workers: every loader's data workers are seeded by rank and leave the preemption signals to their rank."""

from __future__ import annotations

import signal

import torch

from asr.data.workers import PREEMPTION_SIGNALS, init_data_worker


def test_data_workers_of_different_ranks_draw_different_augmentations_and_ignore_preemption():
    """A custom worker_init_fn replaces Lightning's rank-aware seeding: ours must seed by rank too."""
    saved = {signum: signal.getsignal(signum) for signum in PREEMPTION_SIGNALS}
    try:
        def draws(rank: int) -> torch.Tensor:
            torch.manual_seed(1234)  # every rank's main process is seeded alike (seed_everything)
            init_data_worker(0, rank)
            return torch.rand(4)

        assert torch.equal(draws(0), draws(0)) and not torch.equal(draws(0), draws(1))
        assert all(signal.getsignal(signum) == signal.SIG_IGN for signum in PREEMPTION_SIGNALS)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
