"""Data: Dataset, length-bucketed batch sampler, collate, and the DataModule.

One DataModule serves 8 kHz and 16 kHz audio (``configs/data/8khz.yaml``, ``16khz.yaml``):
files at another rate are resampled on loading. Batches are filled up to
``max_batch_seconds`` of padded audio, not a fixed count. Every manifest line is
checked in ``setup`` before the first step (see asr.manifest), so nothing fails mid-epoch.
"""

from __future__ import annotations

import math
import random
from functools import cached_property
from typing import Literal, NamedTuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Sampler

from asr import manifest as mf
from asr.audio import load_audio, resample
from asr.model import encoder_frames
from asr.tokenizer import UNK_ID, Tokenizer


class Batch(NamedTuple):
    audio: torch.Tensor  # (B, n) float32 waveforms, zero-padded
    audio_lengths: torch.Tensor  # (B,) samples
    tokens: torch.Tensor  # (B, L) int64 token ids, padded with 0 (the blank, never a target)
    token_lengths: torch.Tensor  # (B,)
    texts: list[str]


class ASRDataset(Dataset):
    """Utterances and their token ids; ``dataset[[i, j, ...]]`` loads and collates one batch.

    ``speed_perturb``: each load picks one of these factors at random and plays the audio
    that much faster (1.1: 10% shorter, pitch up), a cheap augmentation (Ko et al., 2015).
    """

    def __init__(self, utterances: list[mf.Utterance], tokens: list[list[int]], sample_rate: int,
                 speed_perturb: tuple[float, ...] = (1.0,)):
        self.utterances, self.tokens, self.sample_rate = utterances, tokens, sample_rate
        self.speed_perturb = speed_perturb

    def __len__(self) -> int:
        return len(self.utterances)

    def load(self, i: int) -> torch.Tensor:
        utt = self.utterances[i]
        try:
            samples, rate = load_audio(utt.audio_filepath, utt.offset, utt.duration if utt.has_offset else None)
        except ValueError as err:
            raise ValueError(f"{utt.source}: {err}") from err
        speed = self.speed_perturb[int(torch.randint(len(self.speed_perturb), ()))]
        return resample(torch.from_numpy(samples), int(round(rate * speed)), self.sample_rate)

    def __getitem__(self, indices: list[int]) -> Batch:
        audio = [self.load(i) for i in indices]
        tokens = [torch.tensor(self.tokens[i], dtype=torch.long) for i in indices]
        return collate(audio, tokens, [self.utterances[i].text for i in indices])


def collate(audio: list[torch.Tensor], tokens: list[torch.Tensor], texts: list[str]) -> Batch:
    pad = torch.nn.utils.rnn.pad_sequence
    return Batch(
        pad(audio, batch_first=True), torch.tensor([len(a) for a in audio]),
        pad(tokens, batch_first=True), torch.tensor([len(t) for t in tokens]), texts,
    )


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length utterances, each up to ``max_batch_seconds`` of padded audio.

    Each epoch, utterances are sorted by duration times a random factor in
    [1 - jitter, 1 + jitter] from (seed, epoch), so neighbours and hence batches change
    between epochs while padding stays small, cut greedily into batches, and the batches
    shuffled. Every rank computes the same list and takes every ``num_replicas``-th batch
    (see ``rank_batches``). ``shuffle=False`` keeps the sorted order (evaluation, or sorted training).
    """

    def __init__(self, durations: list[float], max_batch_seconds: float, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, jitter: float = 0.02):
        self.durations, self.max_batch_seconds = durations, max_batch_seconds
        self.shuffle, self.seed, self.jitter = shuffle, seed, jitter
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.skip = epoch, 0

    def resume(self, epoch: int, batches_done: int) -> None:
        """Start the next pass at batch ``batches_done`` of ``epoch`` (mid-epoch resume)."""
        self.epoch, self.skip = epoch, batches_done

    def global_batches(self) -> list[list[int]]:
        """This epoch's batches for all ranks together, before the per-rank split."""
        rng = random.Random(self.seed * 100003 + self.epoch)
        keys = [d * (1 + rng.uniform(-self.jitter, self.jitter)) if self.shuffle else d for d in self.durations]
        batches, batch, longest = [], [], 0.0
        for i in sorted(range(len(keys)), key=keys.__getitem__):
            longest_if_added = max(longest, self.durations[i])
            if batch and longest_if_added * (len(batch) + 1) > self.max_batch_seconds:
                batches.append(batch)
                batch, longest_if_added = [], self.durations[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self):
        mine = self.rank_batches()
        skip, self.skip = self.skip, 0
        yield from mine[skip:]

    def rank_batches(self) -> list[list[int]]:
        """This rank's share of the epoch; every rank gets the same number of batches.

        To reach a multiple of ``num_replicas`` the largest batches are split in two, so no
        utterance is seen twice; batches repeat only when there are fewer utterances than ranks.
        """
        batches = self.global_batches()
        while len(batches) % self.num_replicas and max(map(len, batches)) > 1:
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            batch = batches.pop(largest)
            batches[largest:largest] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
        padded = math.ceil(len(batches) / self.num_replicas) * self.num_replicas
        batches = [batches[i % len(batches)] for i in range(padded)]
        return batches[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self.rank_batches())


class ResumableLoader(DataLoader):
    """A DataLoader that Lightning can checkpoint mid-epoch: it remembers how many batches were consumed."""

    def __iter__(self):
        sampler: BucketBatchSampler = self.sampler
        self.epoch, self.consumed = sampler.epoch, sampler.skip
        for batch in super().__iter__():
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": getattr(self, "epoch", 0), "consumed": getattr(self, "consumed", 0)}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.resume(state["epoch"], state["consumed"])


def _as_is(batch: Batch) -> Batch:
    return batch  # the dataset already collates whole batches


class ASRDataModule(pl.LightningDataModule):
    """Manifests in, length-bucketed batches out, for 8 kHz or 16 kHz models.

    The tokenizer (``self.tokenizer``) is loaded from ``tokenizer_model`` or trained on the
    training manifest's text; fit.py links it, and ``sample_rate``, to the model.
    """

    def __init__(
        self,
        train_manifest: str = "data/mini/train.jsonl",
        val_manifest: str = "data/mini/dev.jsonl",
        test_manifest: str | None = "data/mini/test.jsonl",
        sample_rate: int = 16000,
        resample: Literal["resample", "error"] = "resample",
        tokenizer_model: str | None = None,
        tokenizer_type: Literal["char", "unigram", "bpe"] = "char",
        tokenizer_vocab_size: int = 64,
        max_batch_seconds: float = 60.0,
        speed_perturb: list[float] = [1.0],
        shuffle: bool = True,
        min_duration: float = 0.1,
        max_duration: float = 20.0,
        on_bad_line: Literal["error", "skip"] = "error",
        num_workers: int = 1,
        seed: int = 0,
        subsampling: int = 4,
    ):
        """
        Args:
            train_manifest: JSON-lines manifest of the training set (paths relative to its folder).
            val_manifest: manifest for validation loss and WER/CER after each epoch.
            test_manifest: manifest for ``trainer.test`` after fitting; null for none.
            sample_rate: Hz the model works at; files at other rates are resampled on loading.
            resample: "resample" files at another rate (said once, with the count) or make them an "error".
            tokenizer_model: a sentencepiece .model to use; null trains one on the training text.
            tokenizer_type: sentencepiece model type when training one: char, unigram or bpe.
            tokenizer_vocab_size: largest vocabulary when training a unigram or bpe tokenizer.
            max_batch_seconds: a batch holds at most this many seconds of padded audio (before speed_perturb).
            speed_perturb: training audio is played at a random one of these speeds, e.g. [0.9, 1.0, 1.1].
            shuffle: new training batches in random order each epoch; false keeps them sorted by length.
            min_duration: utterances shorter than this (seconds) are bad lines.
            max_duration: utterances longer than this (seconds), or than max_batch_seconds, are bad lines.
            on_bad_line: "error" stops before training and lists bad lines; "skip" drops and counts them.
            num_workers: DataLoader worker processes that read and resample audio.
            seed: seed of the batch order (with the epoch number).
            subsampling: the model's frame subsampling, linked from model.subsampling (CTC feasibility).
        """
        super().__init__()
        if not speed_perturb or min(speed_perturb) <= 0:
            raise ValueError(f"data.speed_perturb must be a non-empty list of positive factors, got {speed_perturb}")
        self.save_hyperparameters()
        self.datasets: dict[str, ASRDataset] = {}

    @cached_property
    def tokenizer(self) -> Tokenizer:
        hp = self.hparams
        if hp.tokenizer_model:
            return Tokenizer.load(hp.tokenizer_model)
        utterances, _ = mf.parse_manifest(hp.train_manifest)
        if not utterances:
            raise mf.ManifestError(f"{hp.train_manifest}: no usable line to train the tokenizer on")
        tokenizer = Tokenizer.train((u.text for u in utterances), hp.tokenizer_type, hp.tokenizer_vocab_size)
        rank_zero_info(
            f"trained a {hp.tokenizer_type} tokenizer of {tokenizer.vocab_size} pieces on "
            f"{len(utterances)} lines of {hp.train_manifest}"
        )
        return tokenizer

    def setup(self, stage: str) -> None:
        hp = self.hparams
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
        for split in splits:
            path = hp[f"{split}_manifest"]
            if split not in self.datasets and path:
                speeds = tuple(hp.speed_perturb) if split == "train" else (1.0,)
                self.datasets[split] = self.load_split(path, speeds)

    def load_split(self, path: str, speed_perturb: tuple[float, ...] = (1.0,)) -> ASRDataset:
        """Parse and check every line of ``path``; bad lines stop the run or are skipped (on_bad_line)."""
        hp = self.hparams
        utterances, problems = mf.parse_manifest(path)
        total = len(utterances) + len(problems)
        good, tokens, notes = [], [], []
        for utt in utterances:
            checked, note = mf.check_audio(utt, hp.sample_rate, hp.resample)
            ids = self.tokenizer.encode(checked.text) if isinstance(checked, mf.Utterance) else []
            problem = checked if isinstance(checked, mf.Problem) else self.check_utterance(checked, ids, max(speed_perturb))
            if problem:
                problems.append(problem)
            else:
                good.append(checked)
                tokens.append(ids)
                notes.append(note)
        mf.report(sorted(problems, key=_line_order), path, total, hp.on_bad_line)
        mf.say_notes(notes, path, hp.sample_rate)
        if not good:
            raise mf.ManifestError(f"{path}: no usable utterance")
        return ASRDataset(good, tokens, hp.sample_rate, speed_perturb)

    def check_utterance(self, utt: mf.Utterance, ids: list[int], fastest: float = 1.0) -> mf.Problem | None:
        """Duration bounds, text the tokenizer knows, and enough encoder frames for CTC at speed ``fastest``."""
        hp = self.hparams
        longest = min(hp.max_duration, hp.max_batch_seconds)  # a longer one would not fit in a batch
        if not hp.min_duration <= utt.duration <= longest:
            bounds = f"[data.min_duration, min(data.max_duration, data.max_batch_seconds)] = [{hp.min_duration}, {longest}]"
            return mf.Problem(utt.source, "duration out of bounds", f"{utt.duration:.2f} s is outside {bounds}")
        if UNK_ID in ids:
            return mf.Problem(utt.source, "untokenisable text", f"{utt.text!r} has characters the tokenizer lacks")
        samples = int(utt.duration / fastest * hp.sample_rate)
        frames = encoder_frames(samples, hp.sample_rate, hp.subsampling)
        needed = len(ids) + sum(a == b for a, b in zip(ids, ids[1:]))  # CTC needs a blank between repeats
        if needed > frames:
            detail = f"{needed} CTC steps for {len(ids)} tokens but {utt.duration:.2f} s gives {frames} encoder frames"
            return mf.Problem(utt.source, "too short for its transcript", detail)
        return None

    def loader(self, split: str, shuffle: bool) -> ResumableLoader:
        dataset = self.datasets[split]
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        sampler = BucketBatchSampler(
            [u.duration for u in dataset.utterances], self.hparams.max_batch_seconds, shuffle=shuffle,
            seed=self.hparams.seed, num_replicas=world, rank=rank,
        )
        workers = self.hparams.num_workers
        return ResumableLoader(dataset, sampler=sampler, batch_size=None, collate_fn=_as_is,
                               num_workers=workers, persistent_workers=workers > 0)

    def train_dataloader(self) -> ResumableLoader:
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
