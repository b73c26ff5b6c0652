"""The map-style dataset of manifest utterances (asr.data.datamodule's JSON-lines path): audio read, kept, played at
a speed, augmented and collated, batch by batch as asr.data.sampler's batches name them."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch.utils.data import Dataset

from asr.audio import AudioError, resample
from asr.data import manifest as mf
from asr.data.augment import Augmenter
from asr.data.batch import Batch, collate
from asr.data.sampler import split_item
from asr.data.sources import ManifestSource, Source


class AudioCache:
    """Waveforms as ``ASRDataset.read`` gives them (decoded, resampled, one per utterance and speed), kept
    in memory up to ``megabytes`` in all; past that, the rest are read every time. Each process fills its
    own (a DataLoader worker, a copy). Reading and resampling every epoch cost the data worker CPU that a
    small machine takes from training (docs/benchmarks.md, 2026-11-24 morning)."""

    def __init__(self, megabytes: float = 0.0):
        self.budget, self.used = round(megabytes * 1e6), 0
        self.waves: dict[tuple[int, float], torch.Tensor] = {}

    def get(self, key: tuple[int, float], read: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The kept waveform of ``key`` (utterance, speed), or ``read()``'s, kept if it fits.
        Callers never change it in place."""
        wave = self.waves.get(key)
        if wave is None:
            wave = read()
            if self.used + wave.nbytes <= self.budget:
                self.waves[key], self.used = wave, self.used + wave.nbytes
        return wave

    def clear(self) -> None:
        self.waves, self.used = {}, 0


class ASRDataset(Dataset):
    """Utterances and their token ids; ``dataset[[i, j, ...]]`` loads and collates one batch.

    ``speed_perturb``: the audio is played that much faster (1.1: 10% shorter, pitch up), a cheap
    augmentation (Ko et al., 2015). The sampler picks the speed: ``load(item)`` takes its items
    (asr.data.sampler.split_item), so ``dataset[[i, j, ...]]`` plays utterances at speed_perturb[0] if
    the indices are under ``len(dataset)``.
    ``augment`` (asr.data.augment, training only) then changes voice, room, noise, channel and level, and
    may replace the utterance by non-speech (``data.augmentation.nonspeech_prob``), whose tokens are then none, or
    put pauses of non-speech around it (``data.augmentation.pause_prob``).
    """

    def __init__(self, utterances: list[mf.Utterance], tokens: list[list[int]], sample_rate: int,
                 speed_perturb: tuple[float, ...] = (1.0,), cache: AudioCache | None = None,
                 source: Source | None = None):
        self.utterances, self.tokens, self.sample_rate = utterances, tokens, sample_rate
        self.source = source or ManifestSource("", "")  # reads the utterances' audio
        self.speed_perturb = speed_perturb
        self.cache = AudioCache() if cache is None else cache
        self.augment: Augmenter | None = None
        self.fastest: list[int] | None = None  # per utterance, its fastest playable speed's index (None: any)

    def __len__(self) -> int:
        return len(self.utterances)

    def load(self, item: int) -> torch.Tensor:
        """A sampler item's waveform (n,) float32: its utterance at its speed, augmented; AudioError
        naming its manifest line if it cannot be read."""
        return self.load_item(item)[0]

    def load_item(self, item: int) -> tuple[torch.Tensor, bool]:
        """``load``'s waveform, and whether it is still the utterance's speech (see ``augment``)."""
        speed_index, i = split_item(item, len(self))
        speed = self.speed_perturb[speed_index]
        wave = self.cache.get((i, speed), partial(self.read, i, speed))
        return self.augment.augment(wave) if self.augment else (wave, True)

    def read(self, i: int, speed: float = 1.0) -> torch.Tensor:
        """Utterance ``i``'s audio played at ``speed``: (n,) float32; AudioError naming its manifest line."""
        samples, rate = self.source.read(self.utterances[i])
        return resample(torch.from_numpy(samples), int(round(rate * speed)), self.sample_rate)

    def __getitem__(self, indices: list[int]) -> Batch:
        """The batch of ``indices``, without those whose audio fails to load (named in ``Batch.dropped``).

        A batch is never empty: if all fail, the next readable utterance stands in, so that
        every rank still steps and enters the same collectives (DDP, FSDP).
        """
        kept, audio, speech, dropped = [], [], [], []
        for item in indices:
            try:
                wave, is_speech = self.load_item(item)
                audio.append(wave)
                speech.append(is_speech)
                kept.append(split_item(item, len(self))[1])
            except AudioError as err:  # a file deleted or truncated since setup checked it
                dropped.append(str(err))
        if not kept:
            stand_in, waveform = self.first_readable(split_item(indices[-1], len(self))[1] + 1)
            kept, audio, speech = [stand_in], [waveform], [True]
        tokens = [torch.tensor(self.tokens[i] if said else [], dtype=torch.long) for i, said in zip(kept, speech)]
        texts = [self.utterances[i].text if said else "" for i, said in zip(kept, speech)]
        return collate(audio, tokens, texts)._replace(dropped=tuple(dropped))

    def first_readable(self, start: int) -> tuple[int, torch.Tensor]:
        """The first utterance from ``start`` on (wrapping round) whose audio loads, and its waveform."""
        for step in range(len(self)):
            i = (start + step) % len(self)
            try:
                return i, self.load(i)
            except AudioError:
                continue
        raise AudioError(f"none of the {len(self)} utterances' audio can be read any more")


def random_voice(dataset: ASRDataset, generator: torch.Generator) -> torch.Tensor:
    """One utterance of ``dataset`` drawn by ``generator``, as loaded: the babble source (pass an unaugmented set).

    A drawn file that no longer loads is passed over for the next readable one: it is the babble's
    loss, not the utterance being augmented's (asr.data.faults counts that file when its own batch comes)."""
    return dataset.first_readable(int(torch.randint(len(dataset), (), generator=generator)))[1]


def as_collated(batch: Batch) -> Batch:
    return batch  # the dataset already collates whole batches
