"""The training loader of a shard stream (asr.data.shards.ShardStream), in each rank's main process: it counts what
the stream drops (asr.data.faults) and it never waits for ever.

Each dropped cut, and each shard given up, counts once in the run, as the utterances it stood for: the readers say
them as they meet them (asr.data.shards.Notes), a batch's own failures come with it.

A stream stalls when no training batch comes and none can: every shard a pass reads fails (tars that are not tars, a
server gone), or a read does not return (a server that stopped answering). So the loader waits for a batch in slices
of POLL_SECONDS in the main thread, while a helper thread (``Fetcher``) runs the DataLoader's ``next`` (without data
workers, the readers themselves), and it stops waiting

- when, since the last sign of progress (a batch, or usable cuts on their way to the sampler), each reader (data
  worker) has read a whole pass of its shards of each corpus without a cut: nothing will come;
- when no progress came for ``stall_seconds`` (data.shards.stall_seconds; 0: never) of this wait (time spent
  training or validating does not count);
- when the run's Preemption callback heard SIGTERM, SIGUSR1 or SIGINT (asr.train.resilience).

A stall stops the run with DataStalled, naming the shards and what failed, on every rank; the Preemption callback
writes last.ckpt first where the run trained. One rank stops at once. Several must stop together: a stalled rank
repeats its last batch, without waiting, up to the next step at which the ranks agree (the first batch, and each
logging step: the all-reduce of asr.data.faults.DataFaults.check), and every rank raises there. A signal while waiting
stops one rank as after a step (asr.train.resilience.Preemption.stop); several repeat the last batch up to the
Preemption callback's own agreement at the next logging step, as after a step; a signal before any batch, with
several ranks, stops them all as a stall agreed at the first batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from torch.utils.data import DataLoader

from asr.data.batch import Batch
from asr.data.faults import DataFaults, DataStalled
from asr.data.manifest import SHOWN_PROBLEMS

POLL_SECONDS = 0.5  # how often a wait for a batch looks at the readers' notes, the clock and the signals


@runtime_checkable
class SignalStop(Protocol):
    """What a wait for a batch heeds of the run's preemption callback (asr.train.resilience.Preemption, found among
    the trainer's callbacks by these members)."""

    received: str | None  # the name of the signal this rank heard; None: none yet

    def stop(self, trainer) -> None:
        """Write last.ckpt where this process trained and raise (the run exits as after a step)."""
        ...


class Fetcher:
    """``next(iterator)`` in a thread of its own, one at a time when asked, so that the main thread can give up
    waiting while the thread is still blocked (a read without an answer). The main thread only waits meanwhile:
    nothing runs beside the readers, so a run without data workers draws its random numbers as before."""

    def __init__(self, iterator: Iterator):
        self.iterator, self.asked = iterator, False
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.serve, daemon=True, name="asr-stream-fetcher").start()

    def serve(self) -> None:
        while True:
            self.requests.get()
            try:
                self.answers.put((True, next(self.iterator)))
            except BaseException as err:  # noqa: BLE001 - handed to the main thread, StopIteration included
                self.answers.put((False, err))
                return

    def answer(self, timeout: float) -> tuple[bool, object] | None:
        """(True, the next item) or (False, the error next raised); None if it has not come within ``timeout``."""
        if not self.asked:
            self.requests.put(None)
            self.asked = True
        try:
            got = self.answers.get(timeout=timeout)
        except queue.Empty:
            return None
        self.asked = False
        return got


class Watch:
    """What a rank's main process knows of its ``readers`` (data workers, or itself) of ``corpora`` from their
    notes: when it last saw progress, what each reads now and since when, which read a whole pass of a corpus
    without a cut since, and the failures since; ``stalled`` says whether that is a stall, and why, naming the
    shards."""

    def __init__(self, readers: int, stall_seconds: float, clock: Callable[[], float] = time.monotonic,
                 corpora: int = 1):
        self.readers, self.corpora, self.stall_seconds, self.clock = readers, corpora, stall_seconds, clock
        self.progressed_at = clock()
        self.reading: dict[int, tuple[str, float]] = {}  # worker -> (the shard it reads, since when)
        self.empty_passes: set[tuple[int, str]] = set()  # (worker, corpus) read a pass without a cut since progress
        self.failures: list[str] = []  # since the last progress

    def progress(self) -> None:
        self.progressed_at, self.empty_passes, self.failures = self.clock(), set(), []

    def waiting(self) -> None:
        """A wait for a batch begins: the time since the last progress, spent training or validating, is no stall."""
        self.progressed_at = self.clock()

    def hear(self, notes: list[tuple]) -> list[tuple[str, int]]:
        """Take in the readers' notes (asr.data.shards.Notes); returns the failures among them, (fault,
        utterances it stands for)."""
        failures = []
        for kind, *rest in notes:
            if kind == "reading":
                self.reading[rest[0]] = (rest[1], self.clock())
            elif kind == "pass" and rest[2] == 0:
                self.empty_passes.add((rest[0], rest[1]))
            elif kind == "fault":
                failures.append((rest[0], rest[1]))
                self.failures.append(rest[0])
            elif kind == "progress":
                self.progress()
        return failures

    def stalled(self) -> str | None:
        """Why the stream cannot make progress, naming the shards; None while it may."""
        if len(self.empty_passes) >= self.readers * self.corpora:
            who = "its reader" if self.readers == 1 else f"each of its {self.readers} readers (data workers)"
            return (f"every shard that {who} read in a whole pass failed, since the last batch:{self.listed()}\n"
                    "Check or replace these shards (python -m asr.shard writes them), or the storage that holds them")
        waited = self.clock() - self.progressed_at
        if not self.stall_seconds or waited <= self.stall_seconds:
            return None
        now = self.clock()
        reads = "".join(f"\n  worker {w} has been reading {address} for {now - since:.0f} s"
                        for w, (address, since) in sorted(self.reading.items()))
        return (f"no training batch for {waited:.0f} s (--data.shards.stall_seconds {self.stall_seconds:g}):{reads}"
                f"{self.listed(' failed since the last batch')}\nCheck the storage or server that holds the shards; "
                "--data.shards.stall_seconds sets how long a rank waits")

    def listed(self, heading: str = "") -> str:
        """The failures since the last progress, one a line (the first SHOWN_PROBLEMS)."""
        if not self.failures:
            return ""
        shown = "".join(f"\n  {failure}" for failure in self.failures[:SHOWN_PROBLEMS])
        more = f"\n  ... and {len(self.failures) - SHOWN_PROBLEMS} more" if len(self.failures) > SHOWN_PROBLEMS else ""
        return (f"\n {heading}:" if heading else "") + shown + more


class StreamLoader(DataLoader):
    """The DataLoader of a ``ShardStream`` (see the module's doc). Set before iterating: ``faults`` (this split's
    DataFaults; None: nothing counted, and a stall raises at once), ``stall_seconds``, ``preemption`` (the run's
    Preemption callback, a SignalStop, whose signal a wait heeds; None: none) and ``trainer``."""

    faults: DataFaults | None = None
    stall_seconds: float = 0.0
    preemption: SignalStop | None = None
    trainer = None
    stopping: str | None = None  # why this rank stopped waiting: a stall's reasons, or a signal's name

    def __iter__(self):
        watch = Watch(max(1, self.num_workers), self.stall_seconds, corpora=len(self.dataset.corpora))
        self.stopping = None
        if self.faults:
            self.faults.start_pass()
        fetcher, last = Fetcher(super().__iter__()), None
        try:
            while True:
                batch = None if self.stopping else self.next_batch(fetcher, watch)
                if batch is None:
                    self.stop_waiting(first=last is None)  # returns only where several ranks repeat the last batch
                if self.faults:
                    self.faults.record(batch.dropped if batch is not None else (), agree=last is None)
                last = batch if batch is not None else last
                yield last
        finally:
            self.dataset.notes.iteration += 1  # readers in this process (no data workers) stop at their next cut

    def next_batch(self, fetcher: Fetcher, watch: Watch) -> Batch | None:
        """The next batch, hearing the readers' notes while it waits; None once ``stopping`` is set instead."""
        watch.waiting()
        while True:
            answer = fetcher.answer(POLL_SECONDS)
            self.count(watch.hear(self.dataset.notes.heard()))
            if answer is not None:
                ok, item = answer
                if not ok:
                    raise RuntimeError("the shard stream ended") if isinstance(item, StopIteration) else item
                watch.progress()
                return item
            self.stopping = watch.stalled() or self.signal()
            if self.stopping:
                return None

    def signal(self) -> str | None:
        """The signal the run's Preemption callback heard on this rank, if any."""
        return getattr(self.preemption, "received", None)

    def count(self, failures: list[tuple[str, int]]) -> None:
        """Count the readers' failures as they come; with one rank, stop at once above the allowed share."""
        if self.faults and failures:
            self.faults.count(tuple(f for f, _ in failures), tuple(n for _, n in failures))
            if not self.faults.distributed():
                self.faults.check()

    def stop_waiting(self, first: bool) -> None:
        """Act on ``stopping``: raise, or (several ranks, after their first batch) return, so that the last batch is
        repeated up to their next agreement."""
        signalled = self.stopping == self.signal()
        distributed = self.faults is not None and self.faults.distributed()
        if signalled and not distributed:
            self.preemption.stop(self.trainer)  # raises Preempted, after last.ckpt where the run trained
        if signalled and not first:
            return  # the Preemption callback's agreement at the next logging step stops every rank
        reason = f"{self.stopping} before the first batch" if signalled else self.stopping
        said = f"data.train_shards{f' on rank {self.trainer.global_rank}' if distributed else ''}: {reason}"
        if self.faults is None:
            raise DataStalled(said)
        self.faults.stalled = self.faults.stalled or said
        if not distributed or first:
            self.faults.record((), agree=True)  # raises DataStalled, on every rank
            raise DataStalled(said)  # (the ranks agreed on no stall: cannot be, as this one is)
