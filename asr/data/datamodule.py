"""The DataModule: manifests or shards in, batches of similar length out, for 8 kHz or 16 kHz models.

One DataModule serves 8 kHz and 16 kHz audio (``configs/data/8khz.yaml``, ``16khz.yaml``):
files at another rate are resampled on loading. Batches are filled up to
``max_batch_seconds`` of padded audio, not a fixed count. From manifests (asr.data.dataset, asr.data.sampler),
every line is checked in ``setup`` before the first step (see asr.data.manifest); audio that breaks later
(deleted, truncated) is dropped from its batch and counted (see asr.data.faults), unless it was
kept in memory (``AudioCache``, ``cache_audio_mb``): then it is not read again. From shards
(``train_shards``, asr.data.shards), start-up reads their index only: the files were checked when written.
"""

from __future__ import annotations

from functools import cached_property, partial
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info

from asr.data import manifest as mf
from asr.data.augment import Augmentation, Augmenter
from asr.data.dataset import ASRDataset, AudioCache, as_collated, random_voice
from asr.data.faults import DataFaults
from asr.data.sampler import BucketBatchSampler, ResumableLoader
from asr.data.manifest import FilterConfig
from asr.data.shard_run import (ShardsConfig, check_partition, check_weights, shard_list, shards_tokenizer,
                                  stream_loader)
from asr.data.shards import ShardIndex
from asr.data.sources import Source, source_for
from asr.data.stream_loader import StreamLoader
from asr.data.workers import end_data_workers_at_exit, init_data_worker
from asr.hardware import AUTO, Auto, data_workers, usable_cores
from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.objectives import objective_class
from asr.models.subsampling import encoder_frames
from asr.settings import plain_settings
from asr.tokenizer import UNK_ID, NotATokenizer, Tokenizer, TokenizerConfig


BAD_LINES_FILE = "bad_lines.txt"  # in the run folder: every line skipped and file dropped, FILE:LINE: reason


class ASRDataModule(pl.LightningDataModule):
    """Manifests in, length-bucketed batches out, for 8 kHz or 16 kHz models.

    The tokenizer (``self.tokenizer``) is loaded from ``tokenizer.model`` or trained on the
    training manifest's text; asr.train.fitting links it, and ``sample_rate``, to the model.
    """

    def __init__(
        self,
        train_manifest: str = "data/mini/train.jsonl",
        val_manifest: str = "data/mini/dev.jsonl",
        test_manifest: str | None = "data/mini/test.jsonl",
        sample_rate: int = FeatureConfig.sample_rate,
        resample: Literal["resample", "error"] = "resample",
        tokenizer: TokenizerConfig = TokenizerConfig(),
        max_batch_seconds: float = 20.0,  # 18 minutes of audio: small batches give enough steps per epoch; with epochs
        # sized to the budget, 40 s was worse on dev for seeds 0 and 1, 10 s worse for seed 0 and better for seed 1
        # (docs/benchmarks.md, 2026-11-25 later)
        speed_perturb: list[float] = [0.9, 1.0, 1.1],  # three speeds of each of the corpus' voices
        shuffle: bool = True,
        filter: FilterConfig = FilterConfig(),  # noqa: A002  (--data.filter.*: the flag's name)
        num_workers: int | Auto = AUTO,
        cache_audio_mb: float = 1024.0,  # each split's audio kept in each data worker (data/mini's train split at 3
        # speeds: 0.2 GB)
        seed: int = 0,
        subsampling: int = EncoderConfig.subsampling,
        objective: str = "ctc",
        augmentation: Augmentation = Augmentation(),
        train_shards: str | list[str] | None = None,
        shards: ShardsConfig = ShardsConfig(),
    ):
        """
        Args:
            train_manifest: JSON-lines manifest of the training set (paths relative to its folder).
            val_manifest: manifest for validation loss and WER/CER after each epoch.
            test_manifest: manifest for ``trainer.test`` after fitting; null for none.
            sample_rate: Hz the model works at; files at other rates are resampled on loading.
            resample: "resample" files at another rate (said once, with the count) or make them an "error".
            tokenizer: the tokenizer given, or how to train one on the training text (asr.tokenizer.TokenizerConfig).
            max_batch_seconds: a batch holds at most this many seconds of padded audio (at its speed_perturb speed, before tempo).
            speed_perturb: training audio is played at a random one of these speeds, e.g. [0.9, 1.0, 1.1].
            shuffle: new training batches in random order each epoch; false keeps them sorted by length.
            filter: which lines are trained and evaluated on, and what becomes of the others
                (asr.data.manifest.FilterConfig).
            num_workers: DataLoader worker processes that read, resample and augment audio; "auto": one per CPU
                training process with 2+ cores to itself, its share of the cores less one (at most 8) per GPU.
            cache_audio_mb: megabytes of read audio (each utterance at each speed it was played at) that each
                data worker keeps in memory for each split, so that later epochs need not read and resample
                it again; 0 = read every time.
            seed: seed of the batch order (with the epoch number).
            subsampling: the model's frame subsampling, linked from model.encoder.subsampling (``too_fast``).
            objective: the model's objective, linked from model.objective: its rule of the encoder frames an
                utterance needs for its tokens (``too_fast``; asr.models.objectives).
            augmentation: waveform augmentation of training audio (asr.data.augment.Augmentation).
            train_shards: train from Lhotse Shar shards written by python -m asr.shard instead of train_manifest: a
                folder, an https:// or s3:// address of one, or a list of them to mix (asr.data.shards). Start-up
                reads only their index; training is by steps (trainer.max_steps or max_time).
            shards: how train_shards are read (asr.data.shard_run.ShardsConfig).
        """
        super().__init__()
        if not speed_perturb or min(speed_perturb) <= 0:
            raise ValueError(f"data.speed_perturb must be a non-empty list of positive factors, got {speed_perturb}")
        if num_workers != AUTO and num_workers < 0:
            raise ValueError(f"data.num_workers must be 'auto' or >= 0, got {num_workers}")
        if max_batch_seconds <= 0:
            raise ValueError(f"data.max_batch_seconds must be > 0, got {max_batch_seconds:g}")
        if cache_audio_mb < 0:
            raise ValueError(f"data.cache_audio_mb must be >= 0 (0 = off), got {cache_audio_mb}")
        check_weights(train_shards, shards.weights)
        self.save_hyperparameters()
        plain_settings(self)
        self.augmentation, self.filter, self.shards, self.tokenizer_settings = augmentation, filter, shards, tokenizer
        self.datasets: dict[str, ASRDataset] = {}
        self.faults: dict[str, DataFaults] = {}  # per split, kept across its loaders

    @cached_property
    def tokenizer(self) -> Tokenizer:
        hp, settings = self.hparams, self.tokenizer_settings
        if settings.model:
            try:
                return Tokenizer.load(settings.model)
            except (OSError, RuntimeError, ValueError) as err:  # missing, a folder, not a sentencepiece model
                reason = "no such file" if isinstance(err, FileNotFoundError) else \
                    str(err) if isinstance(err, NotATokenizer) else \
                    f"not a sentencepiece model or checkpoint of asr ({' '.join(str(err).split())[:160]})"
                raise ValueError(f"data.tokenizer.model {settings.model}: {reason}") from err
        if hp.train_shards:
            return shards_tokenizer(self.corpora)
        utterances, _ = self.source("train").parse()
        if not utterances:
            raise mf.ManifestError(f"{hp.train_manifest}: no usable line to train the tokenizer on")
        try:
            tokenizer = Tokenizer.train((u.text for u in utterances), settings.type, settings.vocab_size)
        except RuntimeError as err:  # sentencepiece's trainer: e.g. a vocabulary smaller than the text's characters
            raise ValueError(f"data.tokenizer.vocab_size {settings.vocab_size}: sentencepiece cannot train a "
                             f"{settings.type} tokenizer of that size on {hp.train_manifest} "
                             f"({' '.join(str(err).split())[:160]})") from err
        rank_zero_info(
            f"trained a {settings.type} tokenizer of {tokenizer.vocab_size} pieces on "
            f"{len(utterances)} lines of {hp.train_manifest}"
        )
        return tokenizer

    def setup(self, stage: str) -> None:
        hp = self.hparams
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
        if "train" in splits and hp.train_shards:
            check_partition(lambda: self.corpora, self.trainer)
            splits = ("val",)
        for split in splits:
            path = hp[f"{split}_manifest"]
            if split not in self.datasets and path:
                train = split == "train"
                speeds, augmentation = (tuple(hp.speed_perturb), self.augmentation) if train else ((1.0,), Augmentation.off())
                self.datasets[split] = self.load_split(self.source(split), speeds, augmentation)

    def source(self, split: str) -> Source:
        """``split``'s source: ``data.<split>_manifest`` (asr.data.sources.source_for)."""
        return source_for(self.hparams[f"{split}_manifest"], f"data.{split}_manifest")

    def load_split(self, source: Source, speed_perturb: tuple[float, ...] = (1.0,),
                   augmentation: Augmentation = Augmentation.off()) -> ASRDataset:
        """Parse and check every entry of ``source``; bad ones stop the run or are skipped (on_bad_line).

        ``augmentation`` (training only) is applied on loading; babble noise draws from the same utterances.
        """
        hp = self.hparams
        utterances, problems = source.parse()
        path = source.name
        total = len(utterances) + len(problems)
        good, tokens, notes, fastest = [], [], [], []
        by_speed = sorted(range(len(speed_perturb)), key=speed_perturb.__getitem__)  # slowest first
        for utt in utterances:
            checked, note = source.check(utt, hp.sample_rate, hp.resample)
            ids = self.tokenizer.encode(checked.text) if isinstance(checked, mf.Utterance) else []
            problem = checked if isinstance(checked, mf.Problem) else self.check_utterance(checked, ids)
            fits = [] if problem else [k for k in by_speed if not self.too_fast(checked, ids, speed_perturb[k] *
                                                                                  augmentation.fastest)]
            if not problem and not fits:
                problem = self.too_fast(checked, ids, speed_perturb[by_speed[0]] * augmentation.fastest)
            if problem:
                problems.append(problem)
            else:
                good.append(checked)
                tokens.append(ids)
                notes.append(note)
                fastest.append(fits[-1])
        rule = self.filter
        mf.report(sorted(problems, key=_line_order), path, total, rule.on_bad_line, rule.max_dropped_share,
                  self.bad_lines_file)
        mf.say_notes(notes, path, hp.sample_rate)
        if not good:
            raise mf.ManifestError(f"{path}: no usable utterance")
        dataset = ASRDataset(good, tokens, hp.sample_rate, speed_perturb, AudioCache(hp.cache_audio_mb), source)
        dataset.fastest = fastest if any(k != by_speed[-1] for k in fastest) else None
        if augmentation.on:  # babble voices: unaugmented, at speed 1, from the same cache
            voices = partial(random_voice, ASRDataset(good, tokens, hp.sample_rate, cache=dataset.cache, source=source))
            dataset.augment = Augmenter(augmentation, hp.sample_rate, voices)
        return dataset

    @cached_property
    def corpora(self) -> list[ShardIndex]:
        """data.train_shards' indexes (asr.data.shards): all that start-up reads of them."""
        return [ShardIndex.read(root, "data.train_shards") for root in shard_list(self.hparams.train_shards)]

    def unusable(self, utt: mf.Utterance, ids: list[int], speed: float) -> mf.Problem | None:
        """Why ``utt`` cannot be trained on at ``speed`` (``check_utterance``, ``too_fast``); None if it can."""
        return self.check_utterance(utt, ids) or self.too_fast(utt, ids, speed)

    def check_utterance(self, utt: mf.Utterance, ids: list[int]) -> mf.Problem | None:
        """Duration bounds and text the tokenizer knows (the objective's length rule: ``too_fast``)."""
        hp, rule = self.hparams, self.filter
        longest = min(rule.max_duration, hp.max_batch_seconds)  # a longer one would not fit in a batch
        if not rule.min_duration <= utt.duration <= longest:
            bounds = (f"[data.filter.min_duration, min(data.filter.max_duration, data.max_batch_seconds)] = "
                      f"[{rule.min_duration}, {longest}]")
            return mf.Problem(utt.source, "duration out of bounds", f"{utt.duration:.2f} s is outside {bounds}")
        if UNK_ID in ids:
            model = self.tokenizer_settings.model
            given = f" (data.tokenizer.model {model}'s)" if model else ""
            return mf.Problem(utt.source, "untokenisable text", f"{utt.text!r} has characters the tokenizer{given} lacks")
        return None

    def too_fast(self, utt: mf.Utterance, ids: list[int], speed: float = 1.0) -> mf.Problem | None:
        """A Problem if, played at ``speed``, the utterance gives fewer encoder frames than the objective needs for
        ``ids`` (its ``frames_needed``: CTC's is one per token and a blank between repeats; at least one)."""
        hp = self.hparams
        samples = int(utt.duration / speed * hp.sample_rate)
        frames = encoder_frames(samples, hp.sample_rate, hp.subsampling)
        needed = max(1, self.frames_needed(ids))
        if needed > frames:
            at = f" at speed {speed:g}" if speed != 1.0 else ""
            steps = "CTC steps" if hp.objective == "ctc" else f"encoder frames (model.objective {hp.objective})"
            detail = f"{needed} {steps} for {len(ids)} tokens but {utt.duration:.2f} s{at} gives {frames} encoder frames (model.encoder.subsampling {hp.subsampling})"
            return mf.Problem(utt.source, "too short for its transcript", detail)
        return None

    @cached_property
    def frames_needed(self):
        """The objective's length rule: token ids -> encoder frames needed (asr.models.objectives)."""
        return objective_class(self.hparams.objective, "data.objective").frames_needed

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        dataset = self.datasets[split]
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        sampler = BucketBatchSampler(
            [u.duration for u in dataset.utterances], self.hparams.max_batch_seconds, shuffle=shuffle,
            seed=self.hparams.seed, num_replicas=world, rank=rank, speeds=dataset.speed_perturb,
            fastest=dataset.fastest,
        )
        workers = self.workers
        if workers:
            end_data_workers_at_exit()
        loader = ResumableLoader(dataset, sampler=sampler, batch_size=None, collate_fn=as_collated,
                                 num_workers=workers, persistent_workers=workers > 0, pin_memory=self.on_gpu,
                                 worker_init_fn=partial(init_data_worker, rank=rank))
        loader.faults = self.faults.setdefault(
            split, DataFaults(split, len(dataset), self.filter.max_dropped_share, self.trainer, self.bad_lines_file))
        return loader

    @property
    def bad_lines_file(self) -> Path | None:
        """The run folder's list of every bad line and failed file (rank 0 writes it); None outside a run."""
        trainer = self.trainer
        folder = getattr(trainer, "log_dir", None)
        return None if folder is None or trainer.global_rank != 0 else Path(folder) / BAD_LINES_FILE

    @cached_property
    def workers(self) -> int:
        """data.num_workers, with "auto" resolved for this machine and trainer (asr.hardware), said once."""
        if self.hparams.num_workers != AUTO:
            return self.hparams.num_workers
        processes = self.trainer.num_devices if self.trainer else 1  # training processes on this machine
        cores = usable_cores()
        workers = data_workers(cores, self.on_gpu, processes)
        rank_zero_info(f"data.num_workers auto -> {workers}: {cores} cores, {processes} "
                       f"{'GPU' if self.on_gpu else 'CPU'} training process{'es' if processes > 1 else ''}")
        return workers

    @property
    def on_gpu(self) -> bool:
        """Whether the batches go to a CUDA device (then workers pin their memory for the copy)."""
        return bool(self.trainer) and self.trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> ResumableLoader | StreamLoader:
        if self.hparams.train_shards:
            return stream_loader(self)
        return self.loader("train", shuffle=self.hparams.shuffle)

    def val_dataloader(self) -> ResumableLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> ResumableLoader:
        if "test" not in self.datasets:
            raise ValueError("no test set: set --data.test_manifest")
        return self.loader("test", shuffle=False)


def _line_order(problem: mf.Problem) -> tuple[str, int]:
    name, _, line = problem.source.rpartition(":")
    return name, int(line)
