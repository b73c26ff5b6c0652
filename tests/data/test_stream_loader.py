"""A shard stream that cannot make progress stops (asr.data.stream_loader, issue 61): unreadable tars, a server that
stops answering, a signal while it waits, and several ranks that stop together; tests/e2e/test_shards_fit.py runs the
same through python -m asr.fit."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from pathlib import Path

import pytest

from asr.data import faults as faults_module
from asr.data import shards as shards_module
from asr.data.faults import DataFaultError, DataFaults, DataStalled
from asr.data.shards import ShardIndex, ShardStream
from asr.data.stream_loader import SignalStop, StreamLoader, Watch
from asr.tools.sharding import shard
from tests.data.test_shards import batcher, mini
from tests.servers import web_server


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """12 bundled utterances in 3 shards of 4."""
    tmp = tmp_path_factory.mktemp("stall")
    shard(tmp / "train", [str(mini(tmp, 12))], shard_size=4, tokenizer_type="char")
    return tmp / "train"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(shards_module, "RETRY_SECONDS", 0.0)


def loader(root: str, max_share: float = 1.0, stall_seconds: float = 0.0, preemption=None) -> StreamLoader:
    """The training loader of the shards at ``root`` as asr.data.shard_run makes it, without data workers."""
    index = ShardIndex.read(root, "data.train_shards")
    made = StreamLoader(ShardStream([index], [1.0], batcher(index), 8.0, 0, 0, 1, 100), batch_size=None)
    made.faults = DataFaults("train", index.utterances, max_share)
    made.stall_seconds, made.preemption = stall_seconds, preemption
    return made


def unreadable(small: Path, tmp_path: Path) -> Path:
    """A copy of ``small`` whose tars are random bytes."""
    broken = tmp_path / "broken"
    shutil.copytree(small, broken)
    for tar in broken.glob("recording.*.tar"):
        tar.write_bytes(bytes(range(256)) * (tar.stat().st_size // 256))
    return broken


def test_a_stream_whose_every_shard_is_unreadable_stops_naming_each_and_why(small, tmp_path):
    broken = unreadable(small, tmp_path)
    with pytest.raises(DataStalled) as stalled:
        next(iter(loader(str(broken))))
    message = str(stalled.value)
    assert message.startswith("data.train_shards: every shard that its reader read in a whole pass failed, since "
                              "the last batch:\n  ")
    for tar in sorted(broken.glob("recording.*.tar")):
        assert f"\n  {tar}: shard unreadable after 3 tries, its last 4 utterances skipped: ReadError" in message
    assert message.endswith("Check or replace these shards (python -m asr.shard writes them), or the storage that "
                            "holds them")
    with pytest.raises(DataFaultError, match=r"^(4|8|12) of 12 train utterances failed to load in this pass, more than "
                                             r"data.filter.max_dropped_share=0.01 allows:\n  .*recording.00000\d.tar: shard "
                                             "unreadable after 3 tries"):
        next(iter(loader(str(broken), max_share=0.01)))  # with the default share, the first shard lost stops it


def test_a_server_that_stops_answering_stops_the_stream_after_stall_seconds_naming_the_shard(small):
    with web_server(small.parent, answers=1) as (address, _):  # each file once: the second pass gets no answer
        stream = loader(f"{address}/{small.name}", stall_seconds=2.0)
        batches = iter(stream)
        started = time.monotonic()
        with pytest.raises(DataStalled) as stalled:
            for _ in itertools.islice(batches, 100):
                started = time.monotonic()
        waited = time.monotonic() - started
    message = str(stalled.value)
    assert message.startswith("data.train_shards: no training batch for 2 s (--data.shards.stall_seconds 2):\n  worker "
                              f"0 has been reading {address}/{small.name}/recording.00000"), message
    assert message.endswith("--data.shards.stall_seconds sets how long a rank waits")
    assert 2.0 < waited < 10.0


class Preemption:
    """What the loader needs of asr.train.resilience.Preemption (a SignalStop): the signal heard, and ``stop``."""

    class Stopped(Exception):
        pass

    received: str | None = None

    def stop(self, trainer) -> None:
        raise self.Stopped(self.received)


def test_the_runs_preemption_callback_is_the_one_a_wait_heeds():
    """asr.data.shard_run finds the callback among the trainer's by SignalStop's members; no other of asr.fit's."""
    from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint, TQDMProgressBar

    from asr.train.resilience import Preemption as RunPreemption

    assert isinstance(RunPreemption(), SignalStop)
    assert not any(isinstance(c, SignalStop) for c in (ModelCheckpoint(), LearningRateMonitor(), TQDMProgressBar()))


def test_a_signal_ends_a_wait_that_would_last_for_ever(small, monkeypatch):
    released = threading.Event()

    def blocked(shard, *args, **kwargs):  # a read that never returns (until the test ends)
        released.wait(60)
        yield from ()

    monkeypatch.setattr(shards_module, "read_shard", blocked)
    preemption = Preemption()
    threading.Timer(1.0, lambda: setattr(preemption, "received", "SIGTERM")).start()
    started = time.monotonic()
    try:
        with pytest.raises(Preemption.Stopped, match="SIGTERM"):
            next(iter(loader(str(small), preemption=preemption)))  # stall_seconds 0: no deadline
    finally:
        released.set()
    assert time.monotonic() - started < 5.0


class Ranks:
    """Two ranks as DataFaults sees them, this one rank 0: the other's counts, stall and failures are given, and the
    logging steps (host_step) come where ``logging`` says."""

    def __init__(self, monkeypatch, other_stalled: str | None = None, other_failures: dict | None = None,
                 logging=itertools.repeat(False)):
        self.other_stalled, self.other_failures, self.agreements = other_stalled, other_failures or {}, 0
        self.trainer = type("Trainer", (), {"global_rank": 0, "world_size": 2})()
        monkeypatch.setattr(DataFaults, "distributed", lambda faults: True)
        monkeypatch.setattr(DataFaults, "summed_over_ranks", self.summed)
        monkeypatch.setattr(DataFaults, "gathered_from_ranks", self.gathered)
        monkeypatch.setattr(faults_module, "host_step", lambda trainer: next(logging))

    def summed(self, counts):
        self.agreements += 1
        theirs = sum(n for _, n in self.other_failures.values())
        return [counts[0] + theirs, counts[1] + (self.other_stalled is not None)]

    def gathered(self, items):
        if items and isinstance(items[0], dict):
            return items + [self.other_failures]
        return items + ([self.other_stalled] if self.other_stalled else [])


class Scripted(StreamLoader):
    """A StreamLoader whose waits end as ``script`` says: a batch, or a reason to stop waiting."""

    script: list = []

    def next_batch(self, fetcher, watch):
        item = self.script.pop(0)
        if isinstance(item, str):
            self.stopping = item
            return None
        return item


def scripted(small, ranks: Ranks, script: list) -> Scripted:
    made = loader(str(small))
    made.__class__ = Scripted
    made.script, made.trainer = script, ranks.trainer
    made.faults.trainer = ranks.trainer
    return made


def test_several_ranks_a_stalled_rank_repeats_its_last_batch_until_the_next_logging_step_then_every_rank_stops(
        small, monkeypatch):
    first = next(iter(loader(str(small))))
    ranks = Ranks(monkeypatch, logging=iter([False, False, True]))
    batches = iter(scripted(small, ranks, [first, "no training batch for 9 s"]))
    assert next(batches) is first and ranks.agreements == 1  # the first batch: the ranks agree
    assert next(batches) is first and next(batches) is first and ranks.agreements == 1  # repeated, no collective
    with pytest.raises(DataStalled, match="^data.train_shards on rank 0: no training batch for 9 s$"):
        next(batches)  # the logging step: every rank raises here


def test_several_ranks_a_rank_stalled_before_its_first_batch_stops_every_rank_at_once(small, monkeypatch):
    ranks = Ranks(monkeypatch)
    with pytest.raises(DataStalled, match="^data.train_shards on rank 0: every shard failed$"):
        next(iter(scripted(small, ranks, ["every shard failed"])))
    ranks = Ranks(monkeypatch)
    stopped = scripted(small, ranks, ["SIGTERM"])
    stopped.preemption = Preemption()
    stopped.preemption.received = "SIGTERM"
    with pytest.raises(DataStalled, match="^data.train_shards on rank 0: SIGTERM before the first batch$"):
        next(iter(stopped))  # no batch to repeat: the ranks stop as for a stall


def test_several_ranks_a_healthy_rank_stops_with_the_stalled_ones_naming_them(small, monkeypatch):
    first = next(iter(loader(str(small))))
    ranks = Ranks(monkeypatch, other_stalled="data.train_shards on rank 1: no training batch for 9 s",
                  logging=iter([True]))
    with pytest.raises(DataStalled, match="^data.train_shards on rank 1: no training batch for 9 s$"):
        next(iter(scripted(small, ranks, [first])))


def test_a_stall_is_every_reader_of_every_corpus_empty_or_a_wait_without_progress():
    """Two corpora mixed, two data workers: one corpus whose shards all fail is no stall while the other gives cuts;
    time spent training or validating between batches is not waiting."""
    now = [0.0]
    watch = Watch(2, 10.0, clock=lambda: now[0], corpora=2)
    watch.hear([("pass", 0, "a", 0), ("pass", 1, "a", 0), ("pass", 0, "b", 3)])
    assert watch.stalled() is None  # corpus b gave cuts
    watch.hear([("pass", 0, "b", 0), ("fault", "b/recording.000000.tar: shard unreadable", 4)])
    assert watch.stalled() is None  # worker 1 has not emptied a pass of b yet
    watch.hear([("pass", 1, "b", 0)])
    assert watch.stalled().startswith("every shard that each of its 2 readers (data workers) read in a whole pass "
                                      "failed, since the last batch:\n  b/recording.000000.tar: shard unreadable")
    watch.progress()
    now[0] = 60.0  # a validation of a minute, then the next wait
    watch.waiting()
    assert watch.stalled() is None
    now[0] = 71.0
    assert watch.stalled().startswith("no training batch for 11 s (--data.shards.stall_seconds 10)")
