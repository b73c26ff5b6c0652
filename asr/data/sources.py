"""Data sources: where a split's utterances and their audio come from. ``Source`` is the contract the DataModule's
map-style path batches from; ``ManifestSource`` (NeMo's JSON lines, asr.data.manifest) is its one implementation.
Streamed training data (Lhotse Shar shards) is asr.data.shards: a stream has no ``parse`` of every entry.

    source.parse() -> (utterances, problems)        every entry, and the entries malformed as written
    source.check(utt, sample_rate, resample) -> (utterance or problem, note)    whether its audio is usable
    source.read(utt) -> (samples (n,) float32, rate)   its audio, AudioError naming it if it cannot be read

An utterance is an ``asr.data.manifest.Utterance`` (source: "FILE:LINE", audio_filepath, duration, text,
offset). ``source_for(path, flag)`` picks the source for a path: the one place a new kind plugs in.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from asr.audio import AudioError, check_finite, load_audio
from asr.data import manifest as mf


class Source(Protocol):
    name: str  # what messages call it: the path a flag gave

    def parse(self) -> tuple[list[mf.Utterance], list[mf.Problem]]: ...

    def check(self, utt: mf.Utterance, sample_rate: int, resample: str) -> tuple[mf.Utterance | mf.Problem, dict]: ...

    def read(self, utt: mf.Utterance) -> tuple[np.ndarray, int]: ...


class ManifestSource:
    """A JSON-lines manifest; each line's audio file is opened at start-up (``check``: header, rate, length)."""

    def __init__(self, path: str, flag: str):
        self.name, self.flag = path, flag

    def parse(self) -> tuple[list[mf.Utterance], list[mf.Problem]]:
        """``mf.parse_manifest``; a manifest that cannot be opened is a ManifestError naming its flag."""
        try:
            return mf.parse_manifest(self.name)
        except OSError as err:
            raise mf.ManifestError(f"{self.flag}: {err}") from err

    def check(self, utt: mf.Utterance, sample_rate: int, resample: str) -> tuple[mf.Utterance | mf.Problem, dict]:
        return mf.check_audio(utt, sample_rate, resample)

    def read(self, utt: mf.Utterance) -> tuple[np.ndarray, int]:
        """The utterance's samples and rate; AudioError naming its line if they cannot be read, are not finite,
        or are shorter than start-up found (the file was cut short since)."""
        try:
            samples, rate = load_audio(utt.audio_filepath, utt.offset, utt.duration if utt.has_offset else None)
            check_finite(samples, "audio")
            if mf.shorter_than_said(len(samples) / rate, utt.duration):
                raise AudioError(f"{utt.audio_filepath}: {len(samples) / rate:.3f} s of audio where start-up "
                                 f"found {utt.duration:.3f} s: cut short since")
        except AudioError as err:
            raise AudioError(f"{utt.source}: {err}") from err
        return samples, rate


def source_for(path: str, flag: str) -> Source:
    """The source of ``path`` (given by ``flag``, e.g. data.train_manifest): a JSON-lines manifest today."""
    return ManifestSource(path, flag)
