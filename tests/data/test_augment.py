"""asr.data.augment: each effect does what it says, a seed fixes it, off changes nothing, evaluation is never
augmented."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asr.data import augment as A
from asr.data.augment import Augmentation, Augmenter
from asr.data.datamodule import ASRDataModule
from tests.conftest import PLAIN_DATA

RATE = 16000


def tone(freq: float = 440.0, seconds: float = 1.0, rate: int = RATE) -> torch.Tensor:
    return 0.5 * torch.sin(2 * math.pi * freq * torch.arange(int(seconds * rate)) / rate)


def peak_hz(wave: torch.Tensor, rate: int = RATE) -> float:
    spectrum = torch.fft.rfft(wave * torch.hann_window(wave.shape[0])).abs()
    return float(spectrum.argmax()) * rate / wave.shape[0]


def snr_db(clean: torch.Tensor, noisy: torch.Tensor) -> float:
    return float(10 * torch.log10(clean.pow(2).mean() / (noisy - clean).pow(2).mean()))


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def datamodule(corpus, **augmentation) -> ASRDataModule:
    """A DataModule of ``corpus`` (char tokenizer), set up to fit and test; ``augmentation``: Augmentation's fields."""
    dm = ASRDataModule(str(corpus.train), str(corpus.dev), str(corpus.dev),
                       **PLAIN_DATA | {"augmentation": Augmentation.off(**augmentation)})
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.mark.parametrize("kind", ["white", "pink"])
@pytest.mark.parametrize("target", [0.0, 10.0, 25.0])
def test_noise_is_added_at_the_drawn_snr(kind, target):
    clean = tone(seconds=2.0)
    augmenter = Augmenter(Augmentation.off(noise_prob=1.0, noise_snr_db=(target, target), noise_kinds=(kind,)), RATE)
    assert snr_db(clean, augmenter(clean, seeded())) == pytest.approx(target, abs=0.01)


def test_pink_noise_has_equal_energy_per_octave():
    spectrum = torch.fft.rfft(A.pink_noise(2**16, seeded())).abs().pow(2)
    octaves = [float(spectrum[2**k : 2 ** (k + 1)].sum()) for k in range(6, 14)]  # bins 64..16384
    assert max(octaves) / min(octaves) < 1.5  # white noise would double per octave: a ratio of 128


def test_babble_is_a_sum_of_other_training_utterances_at_the_snr(corpus):
    dm = datamodule(corpus, noise_prob=1.0, noise_snr_db=(5.0, 5.0), noise_kinds=["babble"], babble_voices=(2, 2))
    train, plain = dm.datasets["train"], dm.load_split(dm.source("train"))
    voice = train.augment.voices(seeded())  # the babble source: an unaugmented training utterance
    assert any(torch.equal(voice, plain.load(i)) for i in range(len(plain)))
    torch.manual_seed(0)
    assert snr_db(plain.load(0), train.load(0)) == pytest.approx(5.0, abs=0.01)


def test_room_impulse_response_decays_60_db_in_rt60():
    for rt60 in (0.3, 0.6):
        rir = A.room_impulse_response(RATE, rt60, seeded())
        tail = rir[1:].pow(2)
        decay = 10 * torch.log10(tail.flip(0).cumsum(0).flip(0) / tail.sum())  # Schroeder backward integral, dB
        t5, t25 = [int((decay > -db).sum()) / RATE for db in (5, 25)]  # T20 range, as room acoustics measures it
        assert 3 * (t25 - t5) == pytest.approx(rt60, rel=0.1)


def test_reverberation_smears_an_impulse_over_the_rt60_and_keeps_the_level():
    click = torch.zeros(RATE)
    click[100] = 1.0
    wet = Augmenter(Augmentation.off(reverb_prob=1.0, reverb_rt60=(0.5, 0.5)), RATE)(click, seeded())
    assert wet.shape == click.shape and float(A.rms(wet)) == pytest.approx(float(A.rms(click)), rel=1e-4)
    energy = wet.pow(2)
    assert energy[100 + RATE // 10 :].sum() > 0.01 * energy.sum()  # still ringing 100 ms later
    late = energy[100 + int(0.4 * RATE) : 100 + int(0.5 * RATE)].sum() / energy[100 + 1 : 100 + int(0.1 * RATE)].sum()
    assert late < 10 ** (-30 / 10)  # 0.4-0.5 s after the click it is > 30 dB below the first 100 ms


@pytest.mark.parametrize("length", [997, 23417])  # 23417 = 11 x 2129: zero-padded to a fast FFT length
def test_reverberation_is_the_linear_convolution_with_the_rir_cut_to_length(length):
    wave = torch.randn(length, generator=seeded(1), dtype=torch.float64)
    rir = A.room_impulse_response(RATE, 0.05, seeded(2)).double()
    direct = torch.from_numpy(np.convolve(wave.numpy(), rir.numpy()))[:length]  # no wrap-around from the tail
    torch.testing.assert_close(A.reverberate(wave, rir), direct * A.rms(wave) / A.rms(direct))


@pytest.mark.parametrize("via_8khz", [True, False])
def test_telephone_removes_energy_outside_300_to_3400_hz(via_8khz):
    noise = torch.randn(2 * RATE, generator=seeded()) * 0.3
    phone = Augmenter(Augmentation.off(telephone_prob=1.0, telephone_8khz=via_8khz), RATE)(noise, seeded())
    assert phone.shape == noise.shape
    power = torch.fft.rfft(phone).abs().pow(2)
    freqs = torch.fft.rfftfreq(phone.shape[0], 1 / RATE)
    outside = float(power[(freqs < 300) | (freqs > 3400)].sum() / power.sum())
    assert outside < 1e-3  # only mu-law quantisation noise is left out of band (white noise: 79% before)
    in_band = A.band_limit(noise, RATE, 300.0, 3400.0)
    assert snr_db(in_band, phone) > 20  # the band itself passes, with 8-bit mu-law and resampling noise (~25 dB)


def test_gain_stays_in_its_range_and_covers_it():
    wave = tone()
    augmenter = Augmenter(Augmentation.off(gain_prob=1.0, gain_db=(-6.0, 6.0)), RATE)
    gains = [float(20 * torch.log10(A.rms(augmenter(wave, seeded(s))) / A.rms(wave))) for s in range(40)]
    assert -6.0 <= min(gains) < -4.0 and 4.0 < max(gains) <= 6.0


@pytest.mark.parametrize("semitones", [-2.0, 3.0])
def test_pitch_moves_a_tone_and_keeps_its_length(semitones):
    wave = tone(440.0)
    shifted = Augmenter(Augmentation.off(pitch_prob=1.0, pitch_semitones=(semitones, semitones)), RATE)(wave, seeded())
    assert shifted.shape == wave.shape
    assert peak_hz(shifted) == pytest.approx(440.0 * 2 ** (semitones / 12), rel=0.01)


@pytest.mark.parametrize("factor", [0.8, 1.25])
def test_tempo_changes_length_not_pitch(factor):
    wave = tone(440.0)
    faster = Augmenter(Augmentation.off(tempo_prob=1.0, tempo_factors=(factor, factor)), RATE)(wave, seeded())
    assert faster.shape[0] == round(wave.shape[0] / factor)
    assert peak_hz(faster) == pytest.approx(440.0, abs=2.0)


def test_a_seed_fixes_every_draw_and_another_seed_changes_them():
    everything = Augmentation.off(pitch_prob=1, tempo_prob=1, noise_prob=1, reverb_prob=1, gain_prob=1, telephone_prob=1)
    augmenter, wave = Augmenter(everything, RATE), tone()
    assert torch.equal(augmenter(wave, seeded(3)), augmenter(wave, seeded(3)))
    assert not torch.equal(augmenter(wave, seeded(3)), augmenter(wave, seeded(4)))


def test_off_leaves_loading_exactly_as_before(corpus):
    dm = datamodule(corpus, noise_snr_db=(0.0, 1.0), reverb_rt60=(1.0, 2.0))  # ranges alone switch nothing on
    assert not dm.augmentation.on and all(ds.augment is None for ds in dm.datasets.values())
    wave = tone()
    assert torch.equal(Augmenter(Augmentation.off(), RATE)(wave, seeded()), wave)
    torch.manual_seed(0)
    plain = [dm.datasets["train"].load(i) for i in range(3)]
    torch.manual_seed(0)
    again = [datamodule(corpus).datasets["train"].load(i) for i in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(plain, again))


def test_validation_and_test_are_never_augmented(corpus):
    on = dict(noise_prob=1.0, reverb_prob=1.0, gain_prob=1.0, telephone_prob=1.0, pitch_prob=1.0, tempo_prob=1.0)
    dm, off = datamodule(corpus, **on), datamodule(corpus)
    assert dm.datasets["train"].augment is not None
    for split in ("val", "test"):
        assert dm.datasets[split].augment is None
        assert torch.equal(dm.datasets[split].load(0), off.datasets[split].load(0))
    assert not torch.equal(dm.datasets["train"].load(0), off.datasets["train"].load(0))


@pytest.mark.parametrize("setting, value, message", [
    ("noise_prob", 1.5, "data.augmentation.noise_prob must be a probability"),
    ("gain_db", (6.0, -6.0), r"data.augmentation.gain_db must be \[low, high\]"),
    ("noise_kinds", ("white", "brown"), "data.augmentation.noise_kinds must be"),
    ("tempo_factors", (0.0, 1.1), "data.augmentation.tempo_factors"),
])
def test_a_bad_setting_is_one_error_naming_it(corpus, setting, value, message):
    with pytest.raises(ValueError, match=message):
        ASRDataModule(str(corpus.train), str(corpus.dev), augmentation=Augmentation(**{setting: value}))


def test_ctc_feasibility_is_checked_at_the_fastest_tempo(corpus):
    line = corpus.row("audio/short.flac", "nine", 0.3)  # 0.3 s: 6 encoder frames for 5 CTC steps; at 1.5x 4
    corpus.write(train_extra=[line])
    assert len(datamodule(corpus).datasets["train"]) == 6
    with pytest.raises(ValueError, match=r"train.jsonl:6: too short for its transcript"):
        datamodule(corpus, tempo_prob=0.5, tempo_factors=(0.9, 1.5))
