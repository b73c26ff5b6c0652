"""Noise, and audio with no speech in it, drawn from a ``torch.Generator``.

Real recordings are full of non-speech: hold time and line noise in calls, pauses in meetings, chunks
of a long file that hold nobody talking. ``clip(kind, seconds, rate, generator)`` makes one (n,) float32
waveform of a kind in ``KINDS``. ``asr.data.augment`` trains on them (data.augmentation.nonspeech_prob: an utterance becomes
non-speech with an empty transcript, or gains pauses of it around its words, so the model learns to put blanks
there); ``python -m
asr.bench.nonspeech`` counts the words a model puts on each kind. Trained on the noises and hum alone, a
model still wrote words on every DTMF clip and half the clicks (docs/benchmarks.md, 2026-11-26): what it
never heard, it does not know is not speech, so every kind here is trained on.
"""

from __future__ import annotations

import math

import torch

from asr.audio import fast_fft_length

LEVEL_DBFS = (-70.0, -30.0)  # the noises' RMS level, drawn uniformly
SIGNAL_DBFS = (-30.0, -10.0)  # the tones' and clicks' RMS level: as loud as speech
LSB = 1 / 32768  # one step of 16-bit audio
NOISES = ("silence", "dither", "white", "pink", "brown", "hum")  # at LEVEL_DBFS
SIGNALS = ("dtmf", "dial_tone", "clicks")  # at SIGNAL_DBFS
KINDS = NOISES + SIGNALS
DTMF_ROWS, DTMF_COLUMNS = (697.0, 770.0, 852.0, 941.0), (1209.0, 1336.0, 1477.0)
DIAL_TONES = ((350.0, 440.0), (425.0,), (400.0, 450.0))  # North America, most of Europe, UK (Hz)


def uniform(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def white_noise(length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(length, generator=generator)


def pink_noise(length: int, generator: torch.Generator) -> torch.Tensor:
    """(length,) noise whose power falls as 1/f (equal energy per octave)."""
    n = fast_fft_length(length)
    spectrum = torch.fft.rfft(torch.randn(n, generator=generator))
    freqs = torch.arange(spectrum.shape[0], dtype=torch.float32).clamp(min=1.0)
    return torch.fft.irfft(spectrum / freqs.sqrt(), n=n)[:length]


def at_level(wave: torch.Tensor, dbfs: float) -> torch.Tensor:
    return wave * (10 ** (dbfs / 20) / wave.pow(2).mean().sqrt().clamp(min=1e-12))


def brown_noise(length: int, generator: torch.Generator) -> torch.Tensor:
    """Integrated white noise (1/f^2), its slow drift taken out so it stays a noise, not a DC offset."""
    walk = torch.cumsum(white_noise(length, generator), 0)
    return walk - torch.nn.functional.avg_pool1d(walk[None, None], 801, 1, 400, count_include_pad=False)[0, 0]


def tones(hz: tuple[float, ...], t: torch.Tensor) -> torch.Tensor:
    return sum(torch.sin(2 * math.pi * f * t) for f in hz)


def hum(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mains hum, 50 or 60 Hz, with odd and even harmonics falling off, over a little white noise."""
    mains = 50.0 if uniform(generator, 0, 1) < 0.5 else 60.0
    wave = sum(torch.sin(2 * math.pi * mains * k * t + uniform(generator, 0, 6.3)) / k for k in range(1, 8))
    return wave + 0.01 * white_noise(len(t), generator)


def dtmf(t: torch.Tensor, rate: int, generator: torch.Generator) -> torch.Tensor:
    """Key presses: 70-200 ms of a row and a column tone, 70-400 ms apart."""
    wave, start = torch.zeros_like(t), int(uniform(generator, 0.0, 0.3) * rate)
    while start < len(t):
        on = int(uniform(generator, 0.07, 0.2) * rate)
        key = (DTMF_ROWS[int(uniform(generator, 0, 4)) % 4], DTMF_COLUMNS[int(uniform(generator, 0, 3)) % 3])
        wave[start: start + on] = tones(key, t[start: start + on])
        start += on + int(uniform(generator, 0.07, 0.4) * rate)
    return wave


def dial_tone(t: torch.Tensor, rate: int, generator: torch.Generator) -> torch.Tensor:
    """A continuous dial tone, or (half the time) a ringing tone: 0.4-2 s on, as long or more off."""
    hz = DIAL_TONES[int(uniform(generator, 0, len(DIAL_TONES))) % len(DIAL_TONES)]
    wave = tones(hz, t)
    if uniform(generator, 0, 1) < 0.5:
        on, off = uniform(generator, 0.4, 2.0), uniform(generator, 0.4, 4.0)
        wave = wave * ((t % (on + off)) < on)
    return wave


def clicks(length: int, rate: int, generator: torch.Generator) -> torch.Tensor:
    """Switching clicks and pops: single-sample steps decaying in 1-5 ms, 0.5-5 a second, over faint noise."""
    wave = 0.003 * white_noise(length, generator)
    for _ in range(max(1, int(length / rate * uniform(generator, 0.5, 5.0)))):
        at, decay = int(uniform(generator, 0, length)), uniform(generator, 0.001, 0.005) * rate
        tail = torch.arange(min(length - at, int(decay * 6)), dtype=torch.float32)
        wave[at: at + len(tail)] += uniform(generator, -1, 1) * torch.exp(-tail / decay)
    return wave


def clip(kind: str, seconds: float, rate: int, generator: torch.Generator, length: int | None = None) -> torch.Tensor:
    """(n,) float32 non-speech of ``kind``, ``seconds`` (or ``length`` samples) long: the noises at
    LEVEL_DBFS, tones and clicks at SIGNAL_DBFS."""
    n = max(1, length or int(seconds * rate))
    t = torch.arange(n, dtype=torch.float32) / rate
    if kind == "silence":
        return torch.zeros(n)
    if kind == "dither":  # sox's default: triangular, +-1 step of 16-bit audio
        return (torch.rand(n, generator=generator) - torch.rand(n, generator=generator)) * LSB
    made = {
        "white": lambda: white_noise(n, generator),
        "pink": lambda: pink_noise(n, generator),
        "brown": lambda: brown_noise(n, generator),
        "hum": lambda: hum(t, generator),
        "dtmf": lambda: dtmf(t, rate, generator),
        "dial_tone": lambda: dial_tone(t, rate, generator),
        "clicks": lambda: clicks(n, rate, generator),
    }
    if kind not in made:
        raise ValueError(f"non-speech kind must be one of {KINDS}, got {kind!r}")
    wave = made[kind]()
    level = uniform(generator, *(LEVEL_DBFS if kind in NOISES else SIGNAL_DBFS))
    return at_level(wave, level).float()
