"""Shards in a run (asr.data.shards is how they are read): the DataModule's settings (ShardsConfig), the tokenizer
they carry, the ranks' check that they read the same shards, the by-steps rule of a stream, and its training loader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from asr.data.dataset import as_collated
from asr.data.faults import DataFaults
from asr.data.shards import CutBatcher, EndlessShards, ShardIndex, ShardsError, ShardStream
from asr.data.stream_loader import SignalStop, StreamLoader
from asr.data.workers import end_data_workers_at_exit, init_data_worker
from asr.tokenizer import Tokenizer


def shard_list(train_shards: str | list[str] | None) -> list[str]:
    """data.train_shards as a list of folders or addresses."""
    return [] if not train_shards else [train_shards] if isinstance(train_shards, str) else list(train_shards)


@dataclass(frozen=True)
class ShardsConfig:
    """How a run reads its data.train_shards (``--data.shards.*``).

    Args:
        weights: with several data.train_shards, how often each is drawn from (default: equally).
        buffer: cuts each data worker holds to bucket and shuffle shard audio (memory: this many utterances'
            FLAC audio per worker, ~14 kB per second of 16 kHz speech: 1.4 GB at 10 s each), at most the cuts of
            one pass over the worker's shards.
        stall_seconds: a rank that gets no training batch from its shards, and hears of no usable utterance read,
            for this long stops the run (last.ckpt written first) naming the shards it was reading and what
            failed; sooner when each of its data workers read a whole pass of shards without one utterance. 0 =
            wait for ever (asr.data.stream_loader).
    """

    weights: list[float] | None = None
    buffer: int = 10000
    stall_seconds: float = 600.0

    def __post_init__(self):
        if self.weights is not None and (not self.weights or min(self.weights) <= 0):
            raise ValueError(f"data.shards.weights must be positive, got {self.weights}")
        if self.buffer < 1:
            raise ValueError(f"data.shards.buffer must be at least 1, got {self.buffer}")
        if self.stall_seconds < 0:
            raise ValueError(f"data.shards.stall_seconds must be >= 0 (0: wait for ever), got {self.stall_seconds:g}")


def check_weights(train_shards: str | list[str] | None, weights: list[float] | None) -> None:
    """data.shards.weights, if given, has one weight per data.train_shards entry (ValueError naming both)."""
    if weights is not None and len(weights) != len(shard_list(train_shards)):
        raise ValueError(f"data.shards.weights must be one positive weight per data.train_shards entry, got "
                         f"{weights} for {shard_list(train_shards)}")


def shards_tokenizer(corpora: list[ShardIndex]) -> Tokenizer:
    """The tokenizer asr.shard stored with the shards (the same in every corpus mixed), made once, not at start-up."""
    tokenizers = [corpus.tokenizer() for corpus in corpora]
    if any(t.serialized != tokenizers[0].serialized for t in tokenizers):
        raise ShardsError("data.train_shards: the corpora were written with different tokenizers (" + ", ".join(
            f"{c.root}: {t.vocab_size} pieces" for c, t in zip(corpora, tokenizers)) + "); give the one to train "
            "with as --data.tokenizer.model, or write the shards with python -m asr.shard --tokenizer_model")
    return tokenizers[0]


def check_partition(read: Callable[[], list[ShardIndex]], trainer) -> None:
    """Read the indexes (``read()``), say what the run reads, and check that every rank reads the same shards: the
    ranks gather their index digests (one all_gather_object), never each other's files. A rank that cannot read
    its index still enters the gather, so that every rank stops with its message instead of waiting for it."""
    from pytorch_lightning.utilities import rank_zero_info

    try:
        corpora, mine = read(), None
        mine = [corpus.digest for corpus in corpora]
    except ShardsError as err:
        corpora, mine = [], str(err)
    if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
        gathered: list = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, mine)
        failed = [f"rank {rank}: {theirs}" for rank, theirs in enumerate(gathered) if isinstance(theirs, str)]
        if failed:
            raise ShardsError("; ".join(failed))
        if any(theirs != mine for theirs in gathered):
            raise ShardsError("data.train_shards: the ranks read different shard indexes (digests by rank: " +
                              "; ".join(f"{rank}: {', '.join(d)}" for rank, d in enumerate(gathered)) +
                              "); every rank must see the same folders or addresses")
    if isinstance(mine, str):
        raise ShardsError(mine)
    for corpus, digest in zip(corpora, mine):
        rank_zero_info(f"data.train_shards {corpus.root}: {len(corpus.shards)} shards, {corpus.utterances} utterances, "
                       f"{corpus.seconds / 3600:.2f} h at {corpus.data['sample_rate']} Hz (index {digest}); "
                       "only the index was read at start-up")


def check_by_steps(trainer, validates: bool) -> None:
    """A stream has no end and no epochs: the run must be bounded by steps or time, and validate by steps."""
    from pytorch_lightning.callbacks import Timer

    if trainer.max_steps < 0 and not any(isinstance(callback, Timer) for callback in trainer.callbacks):
        raise ShardsError("data.train_shards streams without end: set --trainer.max_steps (or --trainer.max_time)")
    if validates and not isinstance(trainer.val_check_interval, int):
        raise ShardsError("data.train_shards streams without epochs: set --trainer.val_check_interval to a number of "
                          "steps (validation on data.val_manifest every that many)")


def stream_loader(data) -> StreamLoader:
    """The training loader of an ``ASRDataModule`` (``data``) with data.train_shards: one ``ShardStream`` per rank,
    its data workers each reading their own shards; it stops the run when the stream stalls
    (data.shards.stall_seconds) and heeds the run's Preemption callback while it waits (asr.data.stream_loader)."""
    from pytorch_lightning.utilities import rank_zero_info

    hp, trainer = data.hparams, data.trainer
    world, rank, start = (trainer.world_size, trainer.global_rank, trainer.global_step) if trainer else (1, 0, 0)
    workers = data.workers
    for corpus in data.corpora:  # before any worker starts: one message, not one per worker
        EndlessShards(corpus.shards, 0, world, 0, max(1, workers), "", corpus.root)
    weights = data.shards.weights or [1.0] * len(data.corpora)
    batcher = CutBatcher(data.tokenizer, hp.sample_rate, tuple(hp.speed_perturb), data.augmentation, data.unusable)
    stream = ShardStream(data.corpora, weights, batcher, hp.max_batch_seconds, hp.seed, rank, world, data.shards.buffer,
                         start)
    if start:
        rank_zero_info(f"data.train_shards: resumed at step {start}; the shards' order and buckets are drawn anew "
                       f"from (seed {hp.seed}, step {start}): nothing is read again to get back to where it stopped")
    if workers:
        end_data_workers_at_exit()
    loader = StreamLoader(stream, batch_size=None, collate_fn=as_collated, num_workers=workers, persistent_workers=workers > 0,
                          pin_memory=data.on_gpu, worker_init_fn=partial(init_data_worker, rank=rank))
    size = sum(corpus.utterances for corpus in data.corpora)
    loader.faults = data.faults.setdefault(
        "train", DataFaults("train", size, data.filter.max_dropped_share, trainer, data.bad_lines_file,
                            "Check or write the shards again (python -m asr.shard)"))
    loader.stall_seconds, loader.trainer = data.shards.stall_seconds, trainer
    loader.preemption = next((c for c in trainer.callbacks if isinstance(c, SignalStop)), None) if trainer else None
    return loader
