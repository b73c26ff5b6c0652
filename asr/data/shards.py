"""Training audio streamed from Lhotse Shar shards (written by ``python -m asr.shard``), for corpora of any size.

A shard folder (local, ``https://`` or ``s3://``) holds ``cuts.NNNNNN.jsonl.gz`` and ``recording.NNNNNN.tar`` pairs,
``tokenizer.model`` and ``index.json`` (``ShardIndex``): the shards' names, utterance counts and seconds, and the
corpus' durations. Start-up reads the index and nothing else, so it takes as long for 10,000 hours as for 10
minutes; every file was checked when the shards were written.

Each training process (rank) and each of its data workers reads its own shards: the shards are shuffled from
(seed, pass), rank r of R takes every R-th from r on, and its worker w of W every W-th of those, pass after pass,
endlessly (``EndlessShards``); ranks check that they read the same index by its digest, not by opening files.
Lhotse's ``DynamicBucketingSampler`` in each worker buffers ``data.shards.buffer`` cuts, groups them into duration
buckets (from the index, so nothing is read to estimate them) and yields batches of up to ``max_batch_seconds``;
``CutBatcher`` turns them into asr's ``Batch`` with the same speed perturbation, augmentation and tokens as the
manifest path. Memory per worker is bounded by the buffer, not the corpus.

What the readers meet on the way (a shard begun, a pass without a cut, a cut or shard given up, usable cuts
flowing) they tell the main process at once through ``Notes``, not with a batch: a stream that cannot make
progress makes no batch, and asr.data.stream_loader (the main process' side) must still see why, and stop.

Training is by steps (``trainer.max_steps`` or ``max_time``, validation every ``val_check_interval`` steps): the
stream has no end, so ranks with unequal shares never wait for each other. A resumed run does not replay what it
read: it re-seeds the shard order and the buckets from (seed, the step it resumes at), as NeMo does for Lhotse
streams. Resume is therefore statistical, not exact: each pass still reads every shard once, and the order is new.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import multiprocessing
import os
import queue
import random
import time
import zlib

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import IterableDataset

from asr.audio import AudioError, AudioFile, check_finite, resample
from asr.data import manifest as mf
from asr.data import remote
from asr.data.augment import Augmentation, Augmenter
from asr.data.batch import Batch, collate
from asr.tokenizer import Tokenizer

INDEX = "index.json"  # written last by asr.shard: a folder without it is unfinished
TOKENIZER = "tokenizer.model"
BUCKETS = 30  # duration buckets of lhotse's DynamicBucketingSampler (its default is 10; more: less padding)
SHARD_TRIES = 3  # reads of a shard before the rest of it is given up (named and counted)
RETRY_SECONDS = 1.0  # the pause after a shard's first failed read; then twice as long, ...
PROGRESS_EVERY_SECONDS = 1.0  # at most this often a reader tells the main process that usable cuts flow
VOICES_KEPT = 32  # recent utterances a worker keeps as babble voices and as a stand-in for a batch that failed whole


class ShardsError(ValueError):
    """Shards that cannot be read or do not fit the run: the message names the flag and the address."""


def join(root: str, name: str) -> str:
    """``name`` in the folder or URL prefix ``root``."""
    return f"{root.rstrip('/')}/{name}"


def read_bytes(address: str, flag: str) -> bytes:
    """The whole file at a path or URL (lhotse's open_best: smart_open for https:// and s3://); ShardsError naming
    the flag, the address and what went wrong (asr.data.remote.failure)."""
    from lhotse.serialization import open_best

    remote.connect(address)
    try:
        with open_best(address, "rb") as f:
            return f.read()
    except Exception as err:  # noqa: BLE001 - OSError, botocore's and requests' errors alike: say which file
        raise ShardsError(f"{flag}: cannot read {address}: {remote.failure(err)}") from err


def equal_duration_bins(durations: list[float], buckets: int = BUCKETS, weights: list[float] | None = None
                        ) -> list[float]:
    """Bucket edges (at most ``buckets - 1`` increasing seconds) that give each bucket about the same total audio
    (each duration counted ``weights`` times): lhotse's DynamicBucketingSampler then fills batches of similar
    lengths."""
    pairs = sorted(zip(durations, weights or [1.0] * len(durations)))
    total, edges, running = sum(d * w for d, w in pairs), [], 0.0
    for duration, weight in pairs:
        running += duration * weight
        if len(edges) < buckets - 1 and running >= total * (len(edges) + 1) / buckets and \
                (not edges or duration > edges[-1]):
            edges.append(duration)
    return edges


@dataclass(frozen=True)
class ShardIndex:
    """A shard folder's ``index.json``: see asr.tools.sharding for what it holds."""

    root: str
    data: dict
    FORMAT = 1

    @classmethod
    def read(cls, root: str, flag: str) -> "ShardIndex":
        try:
            data = json.loads(read_bytes(join(root, INDEX), flag))
        except json.JSONDecodeError as err:
            raise ShardsError(f"{flag}: {join(root, INDEX)} is not JSON ({err})") from err
        except ShardsError as err:
            if Path(root).is_dir():  # a local folder without an index: asr.shard did not finish
                raise ShardsError(f"{flag}: {root} has no {INDEX}: not a shard folder, or python -m asr.shard "
                                  "did not finish writing it") from err
            raise
        if not isinstance(data, dict) or data.get("format") != cls.FORMAT or not data.get("shards"):
            raise ShardsError(f"{flag}: {join(root, INDEX)} is not an index of asr.shard (format {cls.FORMAT})")
        check_counts(data, join(root, INDEX), flag)
        return cls(root, data)

    @property
    def shards(self) -> list[dict[str, str]]:
        """Each shard's ``cuts`` and ``recording`` addresses, in the index' order."""
        return [{"cuts": join(self.root, s["cuts"]), "recording": join(self.root, s["recording"]),
                 "utterances": s["utterances"]} for s in self.data["shards"]]

    @property
    def utterances(self) -> int:
        return self.data["utterances"]

    @property
    def seconds(self) -> float:
        return self.data["seconds"]

    @property
    def digest(self) -> str:
        """What the ranks compare: the shards' names and sizes, whatever folder or URL holds them."""
        listed = [(s["cuts"], s["recording"], s["utterances"]) for s in self.data["shards"]]
        return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]

    def tokenizer(self, flag: str = "data.train_shards") -> Tokenizer:
        """The tokenizer stored with the shards; ShardsError naming its address if it is not one of asr."""
        address = join(self.root, self.data["tokenizer"])
        try:
            return Tokenizer(read_bytes(address, flag))
        except (RuntimeError, ValueError) as err:  # sentencepiece cannot parse it, or it breaks the blank contract
            if isinstance(err, ShardsError):
                raise
            raise ShardsError(f"{flag}: {address} is not a tokenizer of asr ({' '.join(str(err).split())[:160]}): "
                              "write the shards again with python -m asr.shard, or train with another one "
                              "(--data.tokenizer.model)") from err


def check_counts(data: dict, address: str, flag: str) -> None:
    """An index' totals are its shards' sums, and each shard names its two files and counts its utterances:
    ShardsError naming the index if not (an index edited by hand, or put together from two writes)."""
    try:
        counts = [int(s["utterances"]) for s in data["shards"]]
        total, seconds = int(data["utterances"]), float(data["seconds"])
        stored = sum(float(s["seconds"]) for s in data["shards"])
        if not all(isinstance(s["cuts"], str) and isinstance(s["recording"], str) for s in data["shards"]):
            raise TypeError("a shard's file names are not text")
    except (KeyError, TypeError, ValueError) as err:
        raise ShardsError(f"{flag}: {address} is not an index of asr.shard ({type(err).__name__}: {err})") from err
    if min(counts) < 0 or sum(counts) != total or abs(stored - seconds) > 0.001 * len(counts) + 0.01:
        raise ShardsError(f"{flag}: {address} says {total} utterances ({seconds:g} s), but its {len(counts)} shards "
                          f"hold {sum(counts)} ({stored:.3f} s): it was changed since python -m asr.shard wrote it; "
                          "write the shards again")


def mixed_bins(corpora: list[ShardIndex], weights: list[float]) -> list[float]:
    """Bucket edges for a mixture: each corpus' stored durations, in proportion to its weight."""
    if len(corpora) == 1:
        return corpora[0].data["duration_bins"]
    durations = [d for c in corpora for d in c.data["durations"]]
    shares = [w / len(c.data["durations"]) for c, w in zip(corpora, weights) for _ in c.data["durations"]]
    return equal_duration_bins(durations, BUCKETS, shares)


class Notes:
    """What a stream's readers tell its main process as it happens (``say``), and what it has heard since it last
    asked (``heard``, in the process that made them): ("reading", worker, address) as a shard is begun, ("pass",
    worker, corpus, cuts) after a pass over the worker's shards of a corpus with how many cuts they gave, ("fault",
    "SOURCE: reason", utterances) for a cut or shard given up, ("progress",) while usable cuts flow to the sampler.
    A reader in the same process (no data workers, or a test) appends to a list; one in a data worker puts on a
    multiprocessing queue made before the workers start, whose feeder never holds a worker's exit
    (``cancel_join_thread``).
    ``iteration`` counts the main process' iterations of the stream that ended (asr.data.stream_loader): a reader
    in that process (no data workers) stops once the one it reads for has ended, though its thread was given up
    waiting for a read."""

    def __init__(self):
        self.owner, self.local, self.iteration = os.getpid(), deque(), 0
        self.queue = multiprocessing.get_context().Queue()
        self.queue.cancel_join_thread()
        self.joined_by: int | None = None  # the data worker that cancelled its own feeder's join

    def say(self, *note) -> None:
        if os.getpid() == self.owner:
            self.local.append(note)
            return
        if self.joined_by != os.getpid():  # spawned workers do not inherit the cancellation
            self.queue.cancel_join_thread()
            self.joined_by = os.getpid()
        self.queue.put(note)

    def heard(self) -> list[tuple]:
        """The notes said since the last call (those of data workers as far as they have arrived)."""
        notes = []
        while self.local:
            notes.append(self.local.popleft())
        while True:
            try:
                notes.append(self.queue.get_nowait())
            except (queue.Empty, OSError, EOFError):
                return notes


class EndlessShards:
    """The cuts of one reader's shards, pass after pass: each pass shuffles all shards from (seed, pass); rank
    ``rank`` of ``world`` takes every ``world``-th from ``rank`` on, and its worker ``worker`` of ``workers`` every
    ``workers``-th of those (two levels, so ranks with different worker counts still split the corpus). lhotse's
    LazySharIterator reads each shard's tar as a stream (``read_shard``); ``notes`` hears of each shard begun and
    each pass with how many cuts it gave."""

    def __init__(self, shards: list[dict], rank: int, world: int, worker: int, workers: int, seed: str,
                 name: str = "data.train_shards", notes: Notes | None = None):
        if len(shards) < world * workers:
            raise ShardsError(f"{name}: {len(shards)} shards for {world * workers} readers ({world} ranks x {workers} "
                              "data workers): write smaller shards (python -m asr.shard --shard_size) or use fewer "
                              "data.num_workers")
        self.shards, self.seed, self.notes, self.name = shards, seed, notes, name
        self.rank, self.world, self.worker, self.workers = rank, world, worker, workers

    def passes(self):
        for number in itertools.count():
            order = list(self.shards)
            random.Random(f"{self.seed}-pass{number}").shuffle(order)
            yield order[self.rank::self.world][self.worker::self.workers]

    def __iter__(self):
        iteration = self.notes.iteration if self.notes else 0
        for mine in self.passes():
            read = 0
            for shard in mine:
                if self.notes:
                    self.notes.say("reading", self.worker, shard["recording"])
                for cut in read_shard(shard):
                    if self.notes and self.notes.iteration != iteration:  # the loader it read for has ended
                        return
                    read += "problem" not in (cut.custom or {})
                    yield cut
            if self.notes:
                self.notes.say("pass", self.worker, self.name, read)


def read_shard(shard: dict, tries: int = SHARD_TRIES):
    """One shard's cuts (lhotse's LazySharIterator streams its tar). A read that fails (the network, a corrupt or cut
    tar) is tried again from where it stopped, after RETRY_SECONDS, twice that, ...; after ``tries`` the rest of the
    shard is given up and one cut without audio names it and the utterances lost, so that they are counted
    (asr.data.faults) instead of the run dying in a data worker, and a mixture of corpora moves on to the next draw.
    A tar that ends early at a file boundary reads without an error: the count the index holds tells."""
    from lhotse import MonoCut
    from lhotse.shar import LazySharIterator

    done, expected = 0, shard.get("utterances", 0)
    remote.connect(shard["recording"])
    for attempt in range(1, tries + 1):
        try:
            fields = {"cuts": [shard["cuts"]], "recording": [shard["recording"]]}
            for number, cut in enumerate(LazySharIterator(fields=fields)):
                if number >= done:
                    done += 1
                    yield cut
            if done >= expected:
                return
            failure = f"it ended after {done} of the index' {expected} utterances"
        except Exception as err:  # noqa: BLE001 - tarfile's, gzip's, smart_open's and botocore's errors alike
            failure = remote.failure(err)
        if attempt < tries:
            time.sleep(RETRY_SECONDS * 2 ** (attempt - 1))
    lost = max(1, expected - done)
    yield MonoCut(id=f"unreadable-{zlib.crc32(shard['recording'].encode())}", start=0.0, duration=0.0, channel=0,
                  custom={"source": shard["recording"], "lost": lost,
                          "problem": f"shard unreadable after {tries} tries, its last {lost} utterances skipped: "
                                     f"{failure}"})


def decode(cut, name: str) -> tuple[torch.Tensor, int]:
    """A Shar cut's audio (FLAC bytes in memory), read as every file is (asr.audio.AudioFile): (n,) float32 mono,
    and its rate. AudioError naming it by ``name`` (its manifest line) if it cannot be decoded or is not finite."""
    with AudioFile(name, cut.recording.sources[0].source) as f:
        wave, rate = torch.from_numpy(f.read(0)), f.rate
    check_finite(wave, name)
    return wave, rate


class CutBatcher:
    """Cuts -> asr's ``Batch``, in two steps. ``prepare`` (before lhotse's sampler) tokenises a cut and draws its
    speed from ``speeds`` (the fastest its transcript fits at, at most the drawn one; ``unusable(utt, ids, speed)``
    is asr.data.datamodule's check), and gives the cut its duration at that speed, so that buckets hold utterances of
    similar played length (as asr.data.sampler draws speeds before sorting). ``__call__`` (on the sampler's
    batches) decodes, plays at that speed and augments. A cut that cannot be used is dropped from its batch and
    named, never lost silently: in ``notes`` (``usable``) before the sampler, in ``Batch.dropped`` after it
    (asr.data.faults counts both). ``notes`` also hears, now and then, that usable cuts flow."""

    def __init__(self, tokenizer: Tokenizer, sample_rate: int, speeds: tuple[float, ...],
                 augmentation: Augmentation, unusable: Callable[[mf.Utterance, list[int], float], mf.Problem | None]):
        self.tokenizer, self.sample_rate, self.speeds = tokenizer, sample_rate, sorted(speeds)
        self.unusable, self.fastest = unusable, augmentation.fastest  # tempo may play it faster still
        self.notes: Notes | None = None  # set by the ShardStream that batches with it
        self.said_progress = 0.0  # time.monotonic() of the last progress note
        self.recent: deque[tuple[torch.Tensor, list[int], str]] = deque(maxlen=VOICES_KEPT)
        self.augmenter = Augmenter(augmentation, sample_rate, self.voice) if augmentation.on else None

    def voice(self, generator: torch.Generator) -> torch.Tensor:
        return self.recent[int(torch.randint(len(self.recent), (), generator=generator))][0]

    def prepare(self, cut):
        from lhotse.utils import fastcopy

        if "problem" in (cut.custom or {}):  # read_shard's mark of a shard it gave up
            return cut
        source = (cut.custom or {}).get("source", cut.id)
        text = cut.supervisions[0].text if cut.supervisions else ""
        utt = mf.Utterance(Path(source), cut.duration, text, source=source)
        ids = self.tokenizer.encode(text)
        drawn = self.speeds[int(torch.randint(len(self.speeds), ()))]
        problem = None
        for speed in sorted((s for s in self.speeds if s <= drawn), reverse=True):
            problem = self.unusable(utt, ids, speed * self.fastest)
            if problem is None:
                custom = {"source": source, "text": text, "ids": ids, "speed": speed}
                return fastcopy(cut, duration=cut.duration / speed, custom=custom)
        return fastcopy(cut, custom={"source": source, "problem": f"{problem.kind}: {problem.detail}"})

    def usable(self, cut) -> bool:
        """Whether a prepared cut goes on to the sampler; one that does not is named in ``notes`` (with how many
        utterances it stands for), so it never fills a bucket nor a batch of its own."""
        told = cut.custom
        if "problem" in told:
            if self.notes:
                self.notes.say("fault", f"{told['source']}: {told['problem']}", told.get("lost", 1))
            return False
        if self.notes and time.monotonic() - self.said_progress >= PROGRESS_EVERY_SECONDS:
            self.notes.say("progress")
            self.said_progress = time.monotonic()
        return True

    def __call__(self, cuts) -> Batch:
        audio, tokens, texts, dropped = [], [], [], []
        for cut in cuts:
            told = cut.custom
            try:
                wave, rate = decode(cut, told["source"])
            except AudioError as err:
                dropped.append(str(err))
                continue
            wave = resample(wave, rate, self.sample_rate)
            self.recent.append((wave, told["ids"], told["text"]))
            wave = resample(wave, round(self.sample_rate * told["speed"]), self.sample_rate)
            speech = True
            if self.augmenter:
                wave, speech = self.augmenter.augment(wave)
            audio.append(wave)
            tokens.append(torch.tensor(told["ids"] if speech else [], dtype=torch.long))
            texts.append(told["text"] if speech else "")
        if not audio and self.recent:  # every rank must step: the last good utterance stands in
            wave, ids, text = self.recent[-1]
            audio, tokens, texts = [wave], [torch.tensor(ids, dtype=torch.long)], [text]
        if not audio:
            raise AudioError("no utterance of the first batch from the shards could be used:\n  " + "\n  ".join(dropped))
        return collate(audio, tokens, texts)._replace(dropped=tuple(dropped))


class ShardStream(IterableDataset):
    """Endless training batches from the shards of ``corpora`` (mixed by ``weights``) for rank ``rank`` of
    ``world``: see the module's doc. ``start`` (the step the run starts at) re-seeds a resumed run. Its readers
    tell ``notes`` what they meet (made here, before any data worker starts)."""

    def __init__(self, corpora: list[ShardIndex], weights: list[float], batcher: CutBatcher, max_batch_seconds: float,
                 seed: int, rank: int, world: int, buffer: int, start: int = 0):
        self.corpora, self.weights, self.batcher = corpora, weights, batcher
        self.max_batch_seconds, self.buffer = max_batch_seconds, buffer
        self.seed, self.rank, self.world, self.start = seed, rank, world, start
        self.notes = batcher.notes = Notes()

    def cuts(self, worker: int, workers: int):
        from lhotse import CutSet

        seed = f"{self.seed}-{self.start}"
        streams = [CutSet(EndlessShards(c.shards, self.rank, self.world, worker, workers, f"{seed}-{i}", c.root,
                                        self.notes)) for i, c in enumerate(self.corpora)]
        cuts = streams[0] if len(streams) == 1 else CutSet.mux(
            *streams, weights=self.weights, seed=zlib.crc32(f"{seed}-{self.rank}-{worker}-mux".encode()))
        return cuts.map(self.batcher.prepare).filter(self.batcher.usable)

    def buffer_size(self, worker: int, workers: int) -> int:
        """The sampler's buffer: ``buffer`` cuts, but never more than one pass of this reader's shards holds. The
        sampler fills its buffer before the first batch, so a larger one would read a small corpus pass after pass
        (data/mini's 40 utterances 250 times over for 10,000 cuts) and hold copies of the same cuts."""
        share = 0
        for corpus in self.corpora:  # a pass gives each reader the same number of shards, of a mean size
            mine = len(range(len(corpus.shards))[self.rank::self.world][worker::workers])
            share += math.ceil(corpus.utterances * mine / len(corpus.shards))
        return max(1, min(self.buffer, share))

    def __iter__(self):
        from lhotse.dataset import DynamicBucketingSampler

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        sampler = DynamicBucketingSampler(
            self.cuts(worker, workers), max_duration=self.max_batch_seconds, shuffle=True,
            duration_bins=mixed_bins(self.corpora, self.weights), buffer_size=self.buffer_size(worker, workers),
            seed=zlib.crc32(f"{self.seed}-{self.start}-{self.rank}-{worker}".encode()),
            world_size=1, rank=0)
        for cuts in sampler:
            yield self.batcher(cuts)
