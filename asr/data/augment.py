"""Waveform augmentation in the data workers: voices, rooms and channels the training set lacks.

Each effect is a plain function of a (n,) float32 waveform at ``sample_rate`` Hz. ``Augmenter``
applies the ones switched on in an ``Augmentation`` (each with its probability and a range to draw
from), in the order a recording happens: speaker (tempo, pitch), room (reverb), noise, channel
(telephone band), level (gain). Before them, ``nonspeech_prob`` may put non-speech (asr.data.nonspeech) in
the utterance's place, with an empty transcript, and ``pause_prob`` around it, as pauses before and after it.
``ASRDataset.load`` calls it on training audio only; validation and test are never augmented. Every
draw comes from one ``torch.Generator``, so a seed fixes the result.

    python -m asr.fit --data.augmentation.noise_prob 0.5 --data.augmentation.reverb_prob 0.3
    python -m asr.bench.augment        # the added CPU cost per second of audio, per effect
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable, Literal, get_args

import torch
import torchaudio.functional as AF

from asr.audio import fast_fft_length, resample
from asr.data.nonspeech import KINDS, clip, pink_noise, uniform, white_noise

NoiseKind = Literal["white", "pink", "babble"]
STRETCH_WINDOW_SECONDS = 0.032  # phase-vocoder STFT window (n_fft rounds up to a power of two)
PITCH_RATE_STEPS = 160  # pitch factors snap to multiples of 1/160 of the rate (100 Hz at 16 kHz): a cheap resampler
TELEPHONE_RATE = 8000  # Hz of the telephone network (G.711)
TELEPHONE_BAND = (300.0, 3400.0)  # Hz passed by a telephone channel
MU_LAW_CHANNELS = 256  # 8-bit mu-law
DECAY_DB = 60.0  # RT60: the time the reverberant energy takes to fall by 60 dB
PAUSE_SHARE = 0.5  # non-speech framing the speech, before and after it: each side up to this share of its length,
PAUSE_MAX_SECONDS = 2.0  # and at most this long: a framed utterance grows by at most 4 s, and its batch, which the
                         # sampler filled by unframed seconds, is padded to it (default run: padding 2.3% -> 10.7%)


@dataclass(frozen=True)
class Augmentation:
    """Which effects apply to training audio (``--data.augmentation.*``), how often (``*_prob``, 0 = off) and over
    what range ([low, high], drawn uniformly). The defaults are the default run's: voices, rooms and telephone lines
never heard are recognised (``Augmentation.off()`` switches every effect off, ``off(noise_prob=1.0)`` all but one).

    Args:
        pitch_prob: probability that a training utterance's pitch is shifted.
        pitch_semitones: [low, high] semitones of the pitch shift.
        tempo_prob: probability that a training utterance is played faster or slower at the same pitch.
        tempo_factors: [low, high] tempo factor (1.1: 10% shorter); CTC feasibility is checked at the highest.
        noise_prob: probability that noise is added to a training utterance.
        noise_snr_db: [low, high] signal-to-noise ratio of the added noise in dB.
        noise_kinds: noise drawn from: white, pink (1/f), babble (a sum of other training utterances).
        babble_voices: [low, high] number of training utterances summed into babble noise.
        reverb_prob: probability of reverberation by a synthetic room impulse response.
        reverb_rt60: [low, high] RT60 of the room in seconds (time for the echo to fall 60 dB).
        gain_prob: probability of a random level change.
        gain_db: [low, high] gain in dB.
        telephone_prob: probability of a telephone channel: 300-3400 Hz band and 8-bit mu-law.
        telephone_8khz: the telephone channel also resamples to 8 kHz and back.
        nonspeech_prob: probability that a training utterance is replaced by non-speech of its length
            (silence, dither, white, pink or brown noise, mains hum, DTMF, dial and ringing tones, clicks:
            asr.data.nonspeech) with an empty transcript, so that the model learns to write nothing there; room,
            noise, line and level apply as to speech.
        pause_prob: probability that a training utterance (not replaced) keeps its words and gains pauses of
            one kind of non-speech before and after it (``pause``), so that the model writes nothing between
            words either.
    """

    pitch_prob: float = 0.0
    pitch_semitones: tuple[float, float] = (-2.0, 2.0)
    tempo_prob: float = 0.0
    tempo_factors: tuple[float, float] = (0.9, 1.1)
    noise_prob: float = 0.3  # white, pink and babble noise; with the ranges below, chosen as a whole by dev WER (with
    # pitch then)
    noise_snr_db: tuple[float, float] = (10.0, 30.0)  # not tuned apart from the rest
    noise_kinds: tuple[NoiseKind, ...] = ("white", "pink", "babble")
    babble_voices: tuple[int, int] = (3, 6)
    reverb_prob: float = 0.2  # rooms the bundled corpus' synthetic voices never had
    reverb_rt60: tuple[float, float] = (0.2, 0.6)  # small rooms
    gain_prob: float = 0.3  # recording levels vary
    gain_db: tuple[float, float] = (-6.0, 6.0)
    telephone_prob: float = 0.35  # 300-3400 Hz, mu-law, via 8 kHz: what 8 kHz telephone audio looks like at 16 kHz.
    # 0.35 against 0.2: WER on telephone audio lower, on wideband a little higher (docs/benchmarks.md, 2026-11-25 night)
    telephone_8khz: bool = True
    nonspeech_prob: float = 0.05  # 1 utterance in 20 becomes silence, noise, hum, tones or clicks with no words: without,
    # the model wrote 176 words a minute on non-speech (docs/benchmarks.md, 2026-11-26)
    pause_prob: float = 0.025  # 1 in 40 keeps its words and gets pauses of non-speech before and after: WER on pairs of
    # utterances with 1-4 s of non-speech around them 0.44 -> 0.22, on long files with such gaps 0.28 -> 0.16 (seed 0;
    # docs/benchmarks.md, 2026-11-26 night)

    def __post_init__(self):
        for f in fields(self):  # lists from YAML become tuples, so that equal settings compare equal
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        self.check()

    @classmethod
    def off(cls, **settings) -> "Augmentation":
        """Every effect off (validation and test audio), but those ``settings`` turn on."""
        return cls(**{f.name: 0.0 for f in fields(cls) if f.name.endswith("_prob")} | settings)

    @property
    def fastest(self) -> float:
        """The largest factor by which tempo can shorten an utterance (for the CTC feasibility check)."""
        return max(self.tempo_factors) if self.tempo_prob else 1.0

    @property
    def on(self) -> bool:
        return any(getattr(self, f.name) > 0 for f in fields(self) if f.name.endswith("_prob"))

    def check(self) -> None:
        """ValueError naming the setting (``data.<name>``) that is out of range."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_prob") and not 0.0 <= value <= 1.0:
                raise ValueError(f"data.augmentation.{f.name} must be a probability in [0, 1], got {value}")
            if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], str) and value[0] > value[1]:
                raise ValueError(f"data.augmentation.{f.name} must be [low, high] with low <= high, got {list(value)}")
        if not self.noise_kinds or not set(self.noise_kinds) <= set(get_args(NoiseKind)):
            kinds = ", ".join(get_args(NoiseKind))
            raise ValueError(f"data.augmentation.noise_kinds must be a non-empty list of {kinds}, got {list(self.noise_kinds)}")
        if min(self.tempo_factors) <= 0 or min(self.reverb_rt60) <= 0 or min(self.babble_voices) < 1:
            raise ValueError("data.augmentation.tempo_factors and reverb_rt60 must be positive, babble_voices at least 1")


def pause(wave: torch.Tensor, kind: str, sample_rate: int, generator: torch.Generator) -> torch.Tensor:
    """(n,) speech framed by non-speech of ``kind`` (one level, continuous): before and after it, each side
    up to PAUSE_SHARE of n and PAUSE_MAX_SECONDS long."""
    most = min(PAUSE_SHARE * wave.shape[0], PAUSE_MAX_SECONDS * sample_rate)
    before, after = (int(uniform(generator, 0.0, most)) for _ in range(2))
    around = clip(kind, 0, sample_rate, generator, length=max(1, before + after))
    return torch.cat([around[:before], wave, around[before: before + after]])


def any_kind(generator: torch.Generator) -> str:
    """One of asr.data.nonspeech.KINDS, drawn uniformly."""
    return KINDS[int(torch.randint(len(KINDS), (), generator=generator))]


def happens(prob: float, generator: torch.Generator) -> bool:
    """True with probability ``prob``; draws nothing when ``prob`` is 0, so an effect switched off changes no draw."""
    return prob > 0 and float(torch.rand((), generator=generator)) < prob


def rms(wave: torch.Tensor) -> torch.Tensor:
    return wave.pow(2).mean().sqrt()


def stretch(wave: torch.Tensor, sample_rate: int, factor: float) -> torch.Tensor:
    """Play (n,) audio ``factor`` times faster at the same pitch (phase vocoder): (round(n / factor),)."""
    n_fft = 2 ** math.ceil(math.log2(STRETCH_WINDOW_SECONDS * sample_rate))
    hop = n_fft // 4
    window = torch.hann_window(n_fft)
    spec = torch.stft(wave, n_fft, hop, window=window, return_complex=True)  # (bins, frames)
    phase_advance = torch.linspace(0, math.pi * hop, spec.shape[0])[:, None]  # expected phase turn per hop, per bin
    stretched = AF.phase_vocoder(spec, factor, phase_advance)
    return torch.istft(stretched, n_fft, hop, window=window, length=round(wave.shape[0] / factor))


def shift_pitch(wave: torch.Tensor, sample_rate: int, semitones: float) -> torch.Tensor:
    """Raise (n,) audio by ``semitones`` (snapped to 1/PITCH_RATE_STEPS of the rate), same length and tempo."""
    step = sample_rate // PITCH_RATE_STEPS
    played_at = round(sample_rate * 2 ** (semitones / 12) / step) * step  # Hz; kept a multiple of step: small kernel
    longer = stretch(wave, sample_rate, sample_rate / played_at)  # n * played_at / sample_rate samples
    return resample(longer, played_at, sample_rate)[: wave.shape[0]]  # every frequency times played_at / rate


def babble(length: int, voices: list[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
    """(length,) sum of ``voices`` at equal level, each looped and started at a random point."""
    total = torch.zeros(length)
    for voice in voices:
        start = int(torch.randint(voice.shape[0], (), generator=generator))
        looped = voice.roll(-start).repeat(math.ceil(length / voice.shape[0]))[:length]
        total += looped / rms(looped).clamp(min=1e-8)
    return total


def add_noise(wave: torch.Tensor, noise: torch.Tensor, snr_db: float) -> torch.Tensor:
    """``wave`` plus ``noise`` (same shape) scaled so that 10 log10(P_wave / P_noise) = ``snr_db``."""
    scale = rms(wave) / rms(noise).clamp(min=1e-8) * 10 ** (-snr_db / 20)
    return wave + scale * noise


def room_impulse_response(sample_rate: int, rt60: float, generator: torch.Generator) -> torch.Tensor:
    """A synthetic RIR of ``rt60`` seconds: a direct path, then noise whose energy falls 60 dB by ``rt60``."""
    t = torch.arange(int(rt60 * sample_rate)) / sample_rate
    tail = torch.randn(t.shape[0], generator=generator) * 10 ** (-DECAY_DB / 20 * t / rt60)  # amplitude decay
    tail[0] = 0.0
    rir = tail * 0.5 / rms(tail).clamp(min=1e-8) / math.sqrt(t.shape[0])  # the tail carries ~1/4 of the direct energy
    rir[0] = 1.0
    return rir


def reverberate(wave: torch.Tensor, rir: torch.Tensor) -> torch.Tensor:
    """(n,) audio convolved with ``rir``, cut to n samples and brought back to the input's RMS level."""
    n = fast_fft_length(wave.shape[0] + rir.shape[0] - 1)  # the full linear convolution fits: no wrap-around
    wet = torch.fft.irfft(torch.fft.rfft(wave, n=n) * torch.fft.rfft(rir, n=n), n=n)[: wave.shape[0]]
    return wet * rms(wave) / rms(wet).clamp(min=1e-8)


def band_limit(wave: torch.Tensor, sample_rate: int, low: float, high: float) -> torch.Tensor:
    """(n,) audio with every frequency outside [low, high] Hz removed (a brick-wall FFT mask)."""
    n = fast_fft_length(wave.shape[0])  # zero-padded: the mask filters the same frequencies
    spectrum = torch.fft.rfft(wave, n=n)
    freqs = torch.fft.rfftfreq(n, 1 / sample_rate)
    return torch.fft.irfft(spectrum * ((freqs >= low) & (freqs <= high)), n=n)[: wave.shape[0]]


def telephone(wave: torch.Tensor, sample_rate: int, via_8khz: bool = True) -> torch.Tensor:
    """A telephone channel: (optionally) down to 8 kHz, 300-3400 Hz band, 8-bit mu-law round trip, back up."""
    rate = TELEPHONE_RATE if via_8khz and sample_rate > TELEPHONE_RATE else sample_rate
    narrow = band_limit(resample(wave, sample_rate, rate), rate, *TELEPHONE_BAND)
    peak = narrow.abs().max().clamp(min=1e-8)  # mu-law codes [-1, 1]; the line level is set to fit
    coded = AF.mu_law_decoding(AF.mu_law_encoding(narrow / peak, MU_LAW_CHANNELS), MU_LAW_CHANNELS) * peak
    return resample(coded, rate, sample_rate)[: wave.shape[0]]


def gain(wave: torch.Tensor, db: float) -> torch.Tensor:
    return wave * 10 ** (db / 20)


class Augmenter:
    """Applies an ``Augmentation`` to (n,) float32 training waveforms at ``sample_rate`` Hz.

    ``voices(generator)`` returns one other, unaugmented training utterance (for babble noise);
    without it babble is never drawn. Output length equals input length except under tempo and pauses.
    """

    def __init__(self, settings: Augmentation, sample_rate: int,
                 voices: Callable[[torch.Generator], torch.Tensor] | None = None):
        settings.check()
        self.settings, self.sample_rate, self.voices = settings, sample_rate, voices

    def __call__(self, wave: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``generator`` fixes every draw; by default one is seeded from torch's (per-worker) global RNG."""
        return self.augment(wave, generator)[0]

    def augment(self, wave: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, bool]:
        """The augmented waveform, and whether it is still speech. With ``nonspeech_prob`` it became non-speech
        of its own length (a kind of asr.data.nonspeech.KINDS), whose transcript is empty; else, with ``pause_prob``,
        it gains pauses of a kind before and after it (``pause``): the model hears non-speech alone, as whole
        files of it, and between words, as in the pauses of calls and meetings."""
        s, rate = self.settings, self.sample_rate
        g = generator or torch.Generator().manual_seed(int(torch.randint(2**62, ())))
        speech = not happens(s.nonspeech_prob, g)
        if not speech:  # then the room, the line and the level as for speech
            wave = clip(any_kind(g), 0, rate, g, length=wave.shape[0])
        elif happens(s.pause_prob, g):
            wave = pause(wave, any_kind(g), rate, g)
        if happens(s.tempo_prob, g):
            wave = stretch(wave, rate, uniform(g, *s.tempo_factors))
        if happens(s.pitch_prob, g):
            wave = shift_pitch(wave, rate, uniform(g, *s.pitch_semitones))
        if happens(s.reverb_prob, g):
            wave = reverberate(wave, room_impulse_response(rate, uniform(g, *s.reverb_rt60), g))
        if happens(s.noise_prob, g):
            wave = add_noise(wave, self.noise(wave.shape[0], g), uniform(g, *s.noise_snr_db))
        if happens(s.telephone_prob, g):
            wave = telephone(wave, rate, s.telephone_8khz)
        if happens(s.gain_prob, g):
            wave = gain(wave, uniform(g, *s.gain_db))
        return wave.float(), speech

    def noise(self, length: int, g: torch.Generator) -> torch.Tensor:
        """(length,) noise of a kind drawn from ``noise_kinds`` (babble only with ``voices``)."""
        kinds = [k for k in self.settings.noise_kinds if k != "babble" or self.voices is not None]
        kind = kinds[int(torch.randint(len(kinds), (), generator=g))] if kinds else "white"
        if kind == "babble":
            low, high = self.settings.babble_voices
            count = int(torch.randint(low, high + 1, (), generator=g))
            return babble(length, [self.voices(g) for _ in range(count)], g)
        return (white_noise if kind == "white" else pink_noise)(length, g)
