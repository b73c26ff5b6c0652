"""Audio that fails to load mid-run: dropped, named once, counted, and a stop above a share.

Setup checks every file (asr.data.manifest), but a long run can outlive its files: one deleted or
truncated since then fails when its batch is loaded (unless a worker kept its audio in memory:
``asr.data.AudioCache``). ``ASRDataset`` drops it from the batch
and names it in ``Batch.dropped`` (in the worker process); the loader hands each batch's
names to this split's ``DataFaults`` in the main process.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from pytorch_lightning.utilities.rank_zero import rank_prefixed_message

from asr.audio import AudioError
from asr.train.intervals import host_step


class DataFaultError(AudioError):
    """More of a split's utterances failed to load in one pass than data.max_dropped_share allows; lists them."""


class DataFaults:
    """One split's load failures, seen by the main process of each rank.

    Each failure is named once per rank (a UserWarning) when first seen. When more than
    ``max_share`` of the split's ``size`` utterances fail in one pass, the run stops with
    DataFaultError listing them: one process checks after every batch (on the host: no sync).
    Under DDP/FSDP every rank must stop together, so the pass's failures are summed over ranks
    (one scalar all-reduce and a host read; every rank gets as many batches, so every rank enters
    it as often) and the names gathered before all ranks raise the same error. Evaluation checks
    after every batch; training, which must not wait for the device between logging steps
    (asr.train.intervals), at each logging step and when the next pass starts: up to
    trainer.log_every_n_steps steps after the share was passed, or not at all for failures after
    the run's last logging step.
    """

    def __init__(self, split: str, size: int, max_share: float, trainer=None, listing: Path | None = None):
        self.split, self.size, self.max_share, self.trainer = split, size, max_share, trainer
        self.listing = listing  # where each failure is also appended (the run folder's bad_lines.txt)
        self.named: set[str] = set()
        self.in_pass: list[str] = []  # this rank's failures since the pass began
        self.lost = 0  # the utterances they stand for
        self.passes = 0  # begun in this process

    def start_pass(self) -> None:
        if self.passes and self.distributed() and self.split == "train":
            self.check()  # what the last pass dropped after its last logging step
        self.in_pass, self.lost, self.passes = [], 0, self.passes + 1

    def record(self, dropped: tuple[str, ...], lost: int | None = None) -> None:
        """Count and name the failures of one batch (``lost`` utterances, by default one each); DataFaultError above
        the allowed share."""
        self.in_pass += dropped
        self.lost += len(dropped) if lost is None else lost
        for fault in dropped:
            if fault not in self.named:
                self.named.add(fault)
                if self.listing is not None:
                    with open(self.listing, "a") as f:
                        f.write(f"{fault} (failed mid-run, {self.split})\n")
                warnings.warn(self.say(
                    f"dropped a {self.split} utterance whose audio no longer loads: {fault} ({len(self.in_pass)} "
                    f"of {self.size} in this pass; above data.max_dropped_share={self.max_share} the run stops)"
                ), UserWarning, stacklevel=2)
        if not self.distributed() or self.split != "train" or host_step(self.trainer):
            self.check()

    def check(self) -> None:
        """DataFaultError, on every rank, when more than the allowed share of the split failed in this pass;
        with several ranks a collective that each must enter at the same point (see the class docstring)."""
        failed = self.summed_over_ranks(self.lost)
        if failed > self.max_share * self.size:
            listed = "\n  ".join(self.gathered_from_ranks(self.in_pass))
            raise DataFaultError(
                f"{failed} of {self.size} {self.split} utterances failed to load in this pass, more than "
                f"data.max_dropped_share={self.max_share} allows:\n  {listed}\n"
                "Restore or re-check the files (python -m asr.fit checks every line at start-up), "
                "or raise --data.max_dropped_share."
            )

    def distributed(self) -> bool:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        return initialized and self.trainer is not None and self.trainer.world_size > 1

    def say(self, message: str) -> str:
        return rank_prefixed_message(message, self.trainer.global_rank) if self.distributed() else message

    def summed_over_ranks(self, count: int) -> int:
        if not self.distributed():
            return count
        strategy = self.trainer.strategy
        total = strategy.reduce(torch.tensor(float(count), device=strategy.root_device), reduce_op="sum")
        return int(total.item())

    def gathered_from_ranks(self, faults: list[str]) -> list[str]:
        if not self.distributed():
            return faults
        gathered: list[list[str]] = [[] for _ in range(self.trainer.world_size)]
        torch.distributed.all_gather_object(gathered, faults)
        return [fault for rank_faults in gathered for fault in rank_faults]
