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
from asr.intervals import host_step


class DataFaultError(AudioError):
    """More of a split's utterances failed to load in one pass than data.filter.max_dropped_share allows; lists them."""


class DataStalled(DataFaultError):
    """A training stream could make no progress on some rank (asr.data.stream_loader): every rank raises it
    together, with each stalled rank's reasons, and the run writes last.ckpt first (asr.train.resilience)."""


class DataFaults:
    """One split's load failures, seen by the main process of each rank.

    A failure is "SOURCE: reason" and stands for one utterance or, for a shard given up, the utterances it still
    held. Each source counts once per pass, as the most it stood for (a stream meets a bad shard again every pass),
    and is named once per rank (a UserWarning) when first seen. When more than ``max_share`` of the split's ``size``
    utterances fail in one pass, the run stops with DataFaultError listing them: one process checks after every
    batch (on the host: no sync). Under DDP/FSDP every rank must stop together, so the pass's failures are summed
    over ranks (one all-reduce and a host read; every rank gets as many batches, so every rank enters it as often)
    and, only when that sum passes the share, gathered by source (two ranks may meet the same shard in different
    passes of a stream: it counts once) before all ranks raise the same error. The same all-reduce carries whether
    a rank's stream stalled (``stalled``, set by asr.data.stream_loader): then every rank raises DataStalled.
    Evaluation checks after every batch; training, which must not wait for the device between logging steps
    (asr.intervals), at each logging step, when the next pass starts and when asked (``record``'s
    ``agree``): up to trainer.log_every_n_steps steps after the share was passed, or not at all for failures
    after the run's last logging step.
    """

    def __init__(self, split: str, size: int, max_share: float, trainer=None, listing: Path | None = None,
                 mend: str = "Restore or re-check the files (python -m asr.fit checks every line at start-up)"):
        self.split, self.size, self.max_share, self.trainer = split, size, max_share, trainer
        self.mend = mend  # how the error tells the user to mend the data
        self.listing = listing  # where each failure is also appended (the run folder's bad_lines.txt)
        self.named: set[str] = set()  # sources named by this rank
        self.in_pass: dict[str, tuple[str, int]] = {}  # source -> (failure, utterances): this rank's, this pass
        self.passes = 0  # begun in this process
        self.stalled: str | None = None  # why this rank's stream can make no progress
        self.gathered_at = -1  # the summed count when the ranks last gathered their failures by source

    @property
    def lost(self) -> int:
        """The utterances this rank's failures of this pass stand for."""
        return sum(count for _, count in self.in_pass.values())

    def start_pass(self) -> None:
        if self.passes and self.distributed() and self.split == "train":
            self.check()  # what the last pass dropped after its last logging step
        self.in_pass, self.passes, self.gathered_at = {}, self.passes + 1, -1

    def record(self, dropped: tuple[str, ...], counts: tuple[int, ...] = (), agree: bool = False) -> None:
        """Count the failures of one batch (``count``), and check them where the class docstring says: DataFaultError
        above the allowed share. ``agree``: check now on every rank (each must ask at this batch)."""
        self.count(dropped, counts)
        if agree or not self.distributed() or self.split != "train" or host_step(self.trainer):
            self.check()

    def count(self, dropped: tuple[str, ...], counts: tuple[int, ...] = ()) -> None:
        """Count and name failures (``counts``: the utterances each stands for, by default one), without a check."""
        for fault, count in zip(dropped, counts or (1,) * len(dropped)):
            source = fault.split(": ", 1)[0]
            if count > self.in_pass.get(source, ("", 0))[1]:
                self.in_pass[source] = (fault, count)
            if source not in self.named:
                self.named.add(source)
                self.name(fault)

    def name(self, fault: str) -> None:
        """Name a failure seen for the first time: a warning, and a line of the listing."""
        if self.listing is not None:
            with open(self.listing, "a") as f:
                f.write(f"{fault} (failed mid-run, {self.split})\n")
        warnings.warn(self.say(
            f"dropped a {self.split} utterance whose audio no longer loads: {fault} ({self.lost} of {self.size} "
            f"in this pass; above data.filter.max_dropped_share={self.max_share} the run stops)"), UserWarning, stacklevel=4)

    def check(self) -> None:
        """DataStalled when a rank's stream stalled, DataFaultError when more than the allowed share of the split
        failed in this pass, on every rank; with several ranks a collective that each must enter at the same point
        (see the class docstring)."""
        failed, stalled = self.summed_over_ranks([self.lost, self.stalled is not None])
        if stalled:
            raise DataStalled("\n".join(self.gathered_from_ranks([self.stalled] if self.stalled else [])))
        if failed <= self.max_share * self.size or failed == self.gathered_at:
            return
        merged: dict[str, tuple[str, int]] = {}
        for part in self.gathered_from_ranks([self.in_pass]):  # a source once, however many ranks met it
            for source, (fault, count) in part.items():
                if count > merged.get(source, ("", 0))[1]:
                    merged[source] = (fault, count)
        self.gathered_at, counted = failed, sum(count for _, count in merged.values())
        if counted > self.max_share * self.size:
            listed = "\n  ".join(fault for fault, _ in merged.values())
            raise DataFaultError(
                f"{counted} of {self.size} {self.split} utterances failed to load in this pass, more than "
                f"data.filter.max_dropped_share={self.max_share} allows:\n  {listed}\n"
                f"{self.mend}, or raise --data.filter.max_dropped_share."
            )

    def distributed(self) -> bool:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        return initialized and self.trainer is not None and self.trainer.world_size > 1

    def say(self, message: str) -> str:
        return rank_prefixed_message(message, self.trainer.global_rank) if self.distributed() else message

    def summed_over_ranks(self, counts: list[float]) -> list[int]:
        if not self.distributed():
            return [int(count) for count in counts]
        strategy = self.trainer.strategy
        total = strategy.reduce(torch.tensor([float(c) for c in counts], device=strategy.root_device),
                                reduce_op="sum")
        return [int(count) for count in total.tolist()]

    def gathered_from_ranks(self, items: list) -> list:
        """Every rank's ``items``, in rank order (this rank's alone without several ranks)."""
        if not self.distributed():
            return items
        gathered: list[list] = [[] for _ in range(self.trainer.world_size)]
        torch.distributed.all_gather_object(gathered, items)
        return [item for rank_items in gathered for item in rank_items]
