"""Audio in: reading, mixing to mono, resampling (whole files and streams). The feature front end that turns it
into frames is part of the model (asr.models.features).

``AudioFile`` is a file open for reading in pieces, mixed to mono float32 (n,); ``load_audio`` reads one span of it;
``resample`` uses torchaudio's sinc filter (any two rates: where the filter would take gigabytes, 16001 -> 16000 Hz,
``sinc_resample`` computes it per output sample), ``StreamResampler`` the same piece by piece (``check_resampling``
refuses such a pair for streams); ``frame_samples`` is samples per encoder frame.
An utterance's audio is read through asr.data.sources, which names its manifest line too.
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import numpy as np
import soundfile
import torch
import torchaudio.transforms as AT


class AudioError(ValueError):
    """An audio file that cannot be used; the message names the file."""


def frame_samples(frame_seconds: float, sample_rate: int) -> int:
    """Samples per encoder frame; asr.inference.result's loudness hops and asr.inference.longform's
    chunk starts are laid on it."""
    samples = frame_seconds * sample_rate
    if abs(samples - round(samples)) > 1e-6 or round(samples) < 1:
        raise ValueError(f"frame_seconds {frame_seconds} is not a whole number of samples at {sample_rate} Hz")
    return round(samples)


class AudioFile:
    """An audio file open for reading in pieces (a context manager): ``read`` gives mono float32 at the file's own
    ``rate``, so a long file is never read whole. A file that cannot be opened, or corrupt or truncated data met by
    a read, raises AudioError ``PATH: cannot read audio (REASON)``. ``data``: the file's bytes already in memory
    (a shard's recording, asr.data.shards), ``path`` then only names it."""

    ERRORS = (soundfile.LibsndfileError, RuntimeError, OSError)  # what soundfile raises for a bad file

    def __init__(self, path: str | Path, data: bytes | None = None):
        self.path = str(path)
        try:
            self.file = soundfile.SoundFile(self.path if data is None else io.BytesIO(data))
        except self.ERRORS as err:
            raise AudioError(f"{self.path}: cannot read audio ({err})") from err
        self.rate = self.file.samplerate

    def read(self, start: int, frames: int = -1) -> np.ndarray:
        """``frames`` samples (-1: to the end; fewer where the file ends) from sample ``start``: (n,) float32."""
        try:
            return read_mono(self.file, start, frames)
        except self.ERRORS as err:
            raise AudioError(f"{self.path}: cannot read audio ({err})") from err

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "AudioFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_audio(path: str | Path, offset: float = 0.0, duration: float | None = None) -> tuple[np.ndarray, int]:
    """Read ``path`` with soundfile, mixed to mono.

    Returns (samples float32 of shape (n,), sample rate in Hz). ``offset`` and
    ``duration`` are in seconds; ``duration=None`` reads to the end. AudioError naming the file if it cannot be read.
    """
    with AudioFile(path) as f:
        rate = f.rate
        samples = f.read(round(offset * rate), -1 if duration is None else round(duration * rate))
    if samples.shape[0] == 0:
        raise AudioError(f"{path}: no audio samples (empty file or offset past the end)")
    return samples, rate


def check_finite(samples: np.ndarray | torch.Tensor, name: str) -> None:
    """Raise AudioError naming ``name`` if any sample is NaN or infinite (a corrupt float file):
    the model would turn them into a transcript of nothing, silently."""
    bad = int((~np.isfinite(samples)).sum()) if isinstance(samples, np.ndarray) else int((~samples.isfinite()).sum())
    if bad:
        raise AudioError(f"{name}: NaN or infinite values in {bad} samples")


def read_mono(f: soundfile.SoundFile, start: int, frames: int) -> np.ndarray:
    """``frames`` samples (-1: to the end) of the open file ``f`` from sample ``start``, mixed to mono: (n,) float32."""
    f.seek(start)
    return f.read(frames, dtype="float32", always_2d=True).mean(axis=1)  # (n, channels) -> (n,)


def resample(samples: torch.Tensor, from_rate: int, to_rate: int) -> torch.Tensor:
    """Resample (..., n) float audio from ``from_rate`` to ``to_rate`` Hz (torchaudio's sinc filter). Any two rates:
    a pair whose filter would be too large to build (filter_values > MAX_FILTER: 16001 or 11127 -> 16000 Hz) is
    resampled by ``sinc_resample``, the same filter computed for each output sample, in bounded memory."""
    if from_rate == to_rate:
        return samples
    if filter_values(from_rate, to_rate) > MAX_FILTER:
        return sinc_resample(samples, from_rate, to_rate)
    return resampler(from_rate, to_rate, samples.dtype)(samples)


def filter_values(from_rate: int, to_rate: int) -> int:
    """How many values torchaudio's sinc filter from ``from_rate`` to ``to_rate`` Hz holds: one row of taps per
    output phase, (to_rate / gcd) x (from_rate / gcd + 2 x reach), built at once (and cached by ``resampler``)."""
    g = math.gcd(from_rate, to_rate)
    return (to_rate // g) * (from_rate // g + 2 * math.ceil(ZERO_CROSSINGS * from_rate / cutoff(from_rate, to_rate)))


def cutoff(from_rate: int, to_rate: int) -> float:
    """The filter's low-pass edge, Hz: torchaudio's rolloff (0.99) of the lower rate's Nyquist band, x 2."""
    return min(from_rate, to_rate) * ROLLOFF


ZERO_CROSSINGS, ROLLOFF = 6, 0.99  # the filter's shape (torchaudio's defaults): resampler builds it, sinc_resample too


def sinc_resample(samples: torch.Tensor, from_rate: int, to_rate: int, block: int = 1 << 15) -> torch.Tensor:
    """``resample`` for any two rates without building the filter: output sample m (at m / to_rate s) is the sum of
    the input samples n within ZERO_CROSSINGS of it, each times torchaudio's Hann-windowed sinc of their distance,
    (n / from_rate - m / to_rate) x cutoff; computed ``block`` outputs at a time. Within 3e-4 of torchaudio's (whose
    filter is built in the samples' float32), with a (..., ceil(n x to_rate / from_rate)) result as its."""
    shape, n = samples.shape[:-1], samples.shape[-1]
    flat = samples.reshape(-1, n)
    edge = cutoff(from_rate, to_rate)
    reach = math.ceil(ZERO_CROSSINGS * from_rate / edge)  # input samples either side of an output's centre
    padded = torch.nn.functional.pad(flat, (reach + 1, reach + 1))
    taps = torch.arange(-reach, reach + 2, dtype=torch.float32)  # offsets from the output's input sample
    columns = taps.long() + reach + 1  # the same offsets in padded
    total = -(-n * to_rate // from_rate)
    out = torch.empty(flat.shape[0], total, dtype=samples.dtype)
    for first in range(0, total, block):
        at = torch.arange(first, min(first + block, total), dtype=torch.float64) * from_rate / to_rate  # input samples
        centre = torch.floor(at)  # exact in float64 for any file (up to 2^53 / from_rate samples)
        t = ((taps[None] - (at - centre)[:, None].float()) * (edge / from_rate)).clamp_(-ZERO_CROSSINGS, ZERO_CROSSINGS)
        weights = torch.cos(t * (math.pi / ZERO_CROSSINGS / 2)) ** 2 * torch.sinc(t) * (edge / from_rate)
        gathered = padded[:, centre.long()[:, None] + columns]  # (channels, block, taps)
        out[:, first: first + len(at)] = (gathered * weights.to(samples.dtype)).sum(-1)
    return out.reshape(*shape, total)


def check_resampling(from_rate: int, to_rate: int, name: str) -> None:
    """Raise AudioError naming ``name`` if a stream from ``from_rate`` to ``to_rate`` Hz needs a sinc filter of more
    than MAX_STREAM_FILTER values (filter_values): a StreamResampler's pieces start on whole periods of the two
    rates, and such a pair's period is long (16001 Hz: a second). Whole files take any rate (``resample``)."""
    values = filter_values(from_rate, to_rate)
    if values > MAX_STREAM_FILTER:
        g = math.gcd(from_rate, to_rate)
        raise AudioError(f"{name}: {from_rate} Hz cannot be resampled to {to_rate} Hz here: the ratio {to_rate // g}/"
                         f"{from_rate // g} needs a filter of {values:,} values (at most {MAX_STREAM_FILTER:,}); "
                         f"give a common rate (8000, 16000, 44100, 48000 Hz, ...)")


MAX_FILTER = 8_000_000  # filter values resample builds (32 MB in float32; more while built) and caches: 5 s of audio
# at 39690 Hz (44.1 kHz at speed 0.9; 6.4 million values) to 16 kHz took 19 ms with it, 71 ms by sinc_resample; at 24255
# Hz (22.05 kHz at 1.1; 15.5 million) 83 ms against 48 ms (one thread, the EPYC, alone); 16001 Hz would need 256 million
MAX_STREAM_FILTER = 1_000_000  # for a stream: the common rates (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000,
# 96000 Hz) to 8 or 16 kHz need at most 640 x 455 (11025 -> 16000 Hz); the server's clients choose their rate, so a
# client can make it build and cache (resampler, 256 pairs) at most 4 MB a rate


def stream_resampler(from_rate: int, to_rate: int, name: str) -> "StreamResampler | None":
    """A StreamResampler from ``from_rate`` to ``to_rate`` Hz, None where they are equal; AudioError naming ``name``
    where the filter would be too large (check_resampling)."""
    check_resampling(from_rate, to_rate, name)
    return StreamResampler(from_rate, to_rate) if from_rate != to_rate else None


class StreamResampler:
    """``resample`` of a stream, piece by piece: what it gives for the pieces joined is ``resample`` of the whole
    (to float rounding). Each piece is resampled with ``margin`` input samples of the audio on both sides (more
    than the sinc kernel reaches: 6 zero crossings), so the output waits for ``margin`` samples of look-ahead
    (4 ms at 16 kHz); pieces start on whole periods of the two rates (gcd), where input and output samples meet."""

    def __init__(self, from_rate: int, to_rate: int):
        g = math.gcd(from_rate, to_rate)
        self.from_rate, self.to_rate, self.period = from_rate, to_rate, from_rate // g  # input samples per period
        self.margin = -(-max(64, 16 * from_rate // to_rate) // self.period) * self.period
        self.buffer = torch.zeros(self.margin)  # the zeros before the start that resample pads with, then audio
        self.received, self.given = 0, 0  # input samples, output samples

    def __call__(self, samples: torch.Tensor, final: bool = False) -> torch.Tensor:
        """(n,) float audio at from_rate -> (m,) at to_rate: the output its input is known for (``final``: the rest)."""
        self.received += len(samples)
        buffer = torch.cat([self.buffer, samples.float()])
        if final:
            out = resample(torch.cat([buffer, torch.zeros(self.margin)]), self.from_rate, self.to_rate)
            first = self.margin * self.to_rate // self.from_rate
            total = -(-self.received * self.to_rate // self.from_rate)  # what resample gives for the whole
            return out[first: first + total - self.given]
        usable = (len(buffer) - self.margin) // self.period * self.period  # input known with its look-ahead
        if usable <= self.margin:
            self.buffer = buffer
            return buffer[:0]
        out = resample(buffer[: usable + self.margin], self.from_rate, self.to_rate)
        out = out[self.margin * self.to_rate // self.from_rate: usable * self.to_rate // self.from_rate]
        self.buffer, self.given = buffer[usable - self.margin:], self.given + len(out)
        return out


@functools.lru_cache(maxsize=256)
def resampler(from_rate: int, to_rate: int, dtype: torch.dtype) -> AT.Resample:
    """torchaudio's Resample with its sinc kernel computed once per rate pair (speed and pitch
    perturbation use a few dozen pairs; computing the kernel on every call took ~5% of a data worker)."""
    return AT.Resample(from_rate, to_rate, lowpass_filter_width=ZERO_CROSSINGS, rolloff=ROLLOFF, dtype=dtype)


def fast_fft_length(n: int) -> int:
    """The smallest n' >= n whose only prime factors are 2, 3 and 5: an FFT of an utterance's own length
    (often a large prime factor) took 3.4x as long here as one zero-padded to such a length."""
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1
