"""Non-speech: the clips are what they say, normalisation leaves them small, training can be taught them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import soundfile
import torch

from asr.bench.nonspeech import words_on, write_clips
from asr.data import nonspeech as ns
from asr.data.augment import PAUSE_MAX_SECONDS, PAUSE_SHARE, Augmentation, Augmenter, pause
from asr.data.datamodule import ASRDataModule
from asr.models.features import FeatureConfig, FeatureExtractor, loud_frames, normalise
from asr.train.legacy import BEFORE_THEIR_TIME
from asr.train.module import ASRModule
from tests.conftest import PLAIN_DATA, flat_hyper_parameters

RATE = 16000
FEATURE_VAR_FLOOR = FeatureConfig().var_floor  # model.features.var_floor's default
STATS_DB = 15.0  # model.features.stats_db as measured


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dbfs(wave: torch.Tensor) -> float:
    return float(20 * torch.log10(wave.pow(2).mean().sqrt()))


def peak_hz(wave: torch.Tensor, rate: int) -> float:
    spectrum = torch.fft.rfft(wave * torch.hann_window(wave.shape[0])).abs()
    return float(spectrum.argmax()) * rate / wave.shape[0]


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("kind", ns.KINDS)
def test_every_kind_is_finite_of_its_length_and_level(kind, rate):
    wave = ns.clip(kind, 2.5, rate, seeded())
    assert wave.shape == (int(2.5 * rate),) and wave.dtype == torch.float32 and wave.isfinite().all()
    if kind == "silence":
        assert not wave.any()
    elif kind == "dither":
        assert wave.abs().max() <= ns.LSB and wave.any()
    elif kind in ns.NOISES:
        assert ns.LEVEL_DBFS[0] - 0.01 <= dbfs(wave) <= ns.LEVEL_DBFS[1] + 0.01
    else:
        assert ns.SIGNAL_DBFS[0] - 0.01 <= dbfs(wave) <= ns.SIGNAL_DBFS[1] + 0.01


def test_tones_are_at_their_frequencies():
    hum = ns.clip("hum", 2.0, RATE, seeded())
    assert peak_hz(hum, RATE) in (pytest.approx(50.0, abs=1), pytest.approx(60.0, abs=1))
    dial = ns.clip("dial_tone", 2.0, RATE, seeded(3))
    tones = [hz for pair in ns.DIAL_TONES for hz in pair]
    assert min(abs(peak_hz(dial, RATE) - hz) for hz in tones) < 2
    keys = ns.clip("dtmf", 2.0, RATE, seeded())
    assert min(abs(peak_hz(keys, RATE) - hz) for hz in ns.DTMF_ROWS + ns.DTMF_COLUMNS) < 5


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="non-speech kind must be one of .*'whistle'"):
        ns.clip("whistle", 1.0, RATE, seeded())


def features(wave: torch.Tensor, floor: float) -> torch.Tensor:
    config = FeatureConfig(RATE, norm="shared", var_floor=floor, quiet_db=0.0)
    return FeatureExtractor(config)(wave[None], torch.tensor([wave.shape[0]]))[0][0]


@pytest.mark.parametrize("kind", ["white", "pink", "brown", "hum", "dither"])
def test_the_floor_keeps_steady_noise_small_where_unit_variance_made_it_loud(kind):
    wave = ns.clip(kind, 3.0, RATE, seeded())
    wave = (wave * 32768).round() / 32768  # as read from a 16-bit file
    assert features(wave, 0.0).std() > 0.9  # before: scaled up to the variance of speech
    assert features(wave, FEATURE_VAR_FLOOR).std() < 0.5


def test_the_floor_leaves_a_varied_signal_as_it_was():
    varied = torch.randn(1, 200, 80) * 3.0  # variance 9: over the floor of 4
    lengths = torch.tensor([200])
    assert torch.allclose(normalise(varied, lengths, True, FEATURE_VAR_FLOOR), normalise(varied, lengths, True))


def test_a_checkpoint_from_before_the_floor_loads_without_it(checkpoint):
    """A checkpoint written before --model.feature_var_floor (flat settings, before issue 40 grouped them) has no
    floor; one that names a floor, flat or grouped, keeps it."""
    saved = torch.load(checkpoint, weights_only=True)
    old = flat_hyper_parameters(saved["hyper_parameters"])
    old.pop("feature_var_floor")
    floor = BEFORE_THEIR_TIME["model"]["features"]["var_floor"]
    assert ASRModule.settings(old)["features"].var_floor == floor == 0.0
    assert ASRModule.settings({})["features"].var_floor == 0.0
    assert ASRModule.settings({"feature_var_floor": 4.0})["features"].var_floor == 4.0
    assert ASRModule.settings(saved["hyper_parameters"])["features"].var_floor == FEATURE_VAR_FLOOR == 4.0


def test_the_module_passes_its_statistics_range_to_the_front_end(char_tokenizer):
    """--model.features.stats_db reaches the features the model computes; off (0) unless asked for."""
    assert ASRModule(char_tokenizer).model.features.config.stats_db == 0.0
    stats = FeatureConfig(stats_db=STATS_DB)
    assert ASRModule(char_tokenizer, features=stats).model.features.config.stats_db == STATS_DB
    with pytest.raises(ValueError, match="model.features.stats_db must be >= 0 dB"):
        ASRModule(char_tokenizer, features=FeatureConfig(stats_db=-1.0))


def speech_like(seconds: float) -> torch.Tensor:
    """Loud and quiet stretches of tones, the level changing every 0.1 s: frames of many energies."""
    t = torch.arange(int(RATE * seconds)) / RATE
    level = 10 ** (-torch.rand(int(seconds * 10) + 1, generator=seeded(3)) * 1.5)  # 0 to -30 dB
    return (0.3 * torch.sin(2 * math.pi * 440 * t) * level[(t * 10).long()]).float()


@pytest.mark.parametrize("pad_seconds", [0.5, 4.0])
@pytest.mark.parametrize("kind", ["silence", "dither"])
def test_silence_around_speech_does_not_change_how_the_speech_is_scaled(kind, pad_seconds):
    """With the range, the speech's frames come out as they do alone; counting every frame, they did not."""
    speech = speech_like(2.0)
    pad = ns.clip(kind, pad_seconds, RATE, seeded())
    padded = torch.cat([pad, speech, pad])
    hop = FeatureConfig(RATE).hop_length
    first = len(pad) // hop + 2  # the first frame wholly inside the speech

    def speech_frames(wave, range_db, offset):
        config = FeatureConfig(RATE, norm="shared", var_floor=FEATURE_VAR_FLOOR, stats_db=range_db, quiet_db=0.0)
        feats = FeatureExtractor(config)(wave[None], torch.tensor([len(wave)]))[0][0]
        return feats[offset: offset + 150]

    alone = speech_frames(speech, STATS_DB, 2)
    assert (speech_frames(padded, STATS_DB, first) - alone).abs().max() < 0.2  # 0.12: the edge frames, any pad
    assert (speech_frames(padded, 0.0, first) - speech_frames(speech, 0.0, 2)).abs().max() > 1.5  # 1.8 and 7.0


def test_an_utterance_of_one_level_counts_every_frame():
    feats, lengths = torch.full((1, 40, 8), -3.0), torch.tensor([30])
    feats[0, 5] = 10.0  # a click
    assert loud_frames(feats, lengths, STATS_DB)[0, :30].all()  # the click did not set the level
    assert torch.allclose(normalise(feats, lengths, True, 0.0, STATS_DB), normalise(feats, lengths, True, 0.0))


def test_nonspeech_augmentation_replaces_the_utterance_and_keeps_its_length():
    speech = torch.sin(torch.arange(RATE * 2) / 5.0) * 0.3
    augmenter = Augmenter(Augmentation.off(nonspeech_prob=1.0, pause_prob=1.0), RATE)  # replacing comes first
    for seed in range(8):
        wave, is_speech = augmenter.augment(speech, seeded(seed))
        assert not is_speech and wave.shape == speech.shape
        assert not wave.any() or dbfs(wave) < ns.SIGNAL_DBFS[1] + 0.01
    kept, still_speech = Augmenter(Augmentation.off(nonspeech_prob=0.0), RATE).augment(speech, seeded())
    assert still_speech and torch.equal(kept, speech)


def test_pause_augmentation_keeps_the_speech_between_non_speech():
    speech = torch.sin(torch.arange(RATE * 2) / 5.0) * 0.3
    augmenter = Augmenter(Augmentation.off(pause_prob=1.0), RATE)
    for seed in range(8):
        wave, is_speech = augmenter.augment(speech, seeded(seed))
        assert is_speech and len(speech) < len(wave) <= (1 + 2 * PAUSE_SHARE) * len(speech)


@pytest.mark.parametrize("seconds", [2.0, 20.0])
def test_a_pause_frames_the_whole_utterance_within_its_bounds(seconds):
    speech = torch.full((int(RATE * seconds),), 0.1)
    most = min(PAUSE_SHARE * len(speech), PAUSE_MAX_SECONDS * RATE)
    for seed in range(4):
        wave = pause(speech, "silence", RATE, seeded(seed))
        start = int(wave.nonzero()[0])
        assert torch.equal(wave[start: start + len(speech)], speech)
        assert not wave[:start].any() and not wave[start + len(speech):].any()
        assert start <= most and len(wave) - len(speech) - start <= most


@pytest.mark.parametrize("prob", [0.0, 1.0])
def test_a_replaced_utterance_trains_on_an_empty_transcript(corpus, prob):
    dm = ASRDataModule(str(corpus.train), str(corpus.dev), None,
                       **PLAIN_DATA | {"augmentation": Augmentation.off(nonspeech_prob=prob)})
    dm.setup("fit")
    train = dm.datasets["train"]
    batch = train[list(range(len(train)))]
    if prob:
        assert batch.texts == [""] * len(train) and not batch.token_lengths.any()
    else:
        assert batch.texts == [u.text for u in train.utterances]
        assert batch.token_lengths.tolist() == [len(t) for t in train.tokens]
    assert batch.audio_lengths.tolist() == [len(train.read(i)) for i in range(len(train))]


def test_a_paused_utterance_trains_on_its_own_transcript(corpus):
    dm = ASRDataModule(str(corpus.train), str(corpus.dev), None,
                       **PLAIN_DATA | {"augmentation": Augmentation.off(pause_prob=1.0)})
    dm.setup("fit")
    train = dm.datasets["train"]
    batch = train[list(range(len(train)))]
    assert batch.texts == [u.text for u in train.utterances]
    assert batch.token_lengths.tolist() == [len(t) for t in train.tokens]
    assert all(int(n) > len(train.read(i)) for i, n in enumerate(batch.audio_lengths))


def test_the_bench_counts_words_per_kind_and_minute(tmp_path):
    clips = write_clips(tmp_path, per_kind=1, rates=(8000,), seed=0, seconds=(1.0, 2.0))
    assert [kind for _, kind, _, _ in clips] == list(ns.KINDS)
    assert all(soundfile.info(path).subtype == "PCM_16" and soundfile.info(path).samplerate == 8000
               for path, *_ in clips)
    texts = ["" for _ in clips]
    texts[0], texts[2] = "yes yes", "help"
    tally = words_on(texts, clips)
    minutes = sum(seconds for *_, seconds in clips) / 60
    assert tally["all"]["with_words"] == 2 and tally["all"]["words"] == 3
    assert tally["all"]["words_per_minute"] == pytest.approx(3 / minutes)
    assert tally[ns.KINDS[0]]["with_words"] == 1 and tally[ns.KINDS[1]]["with_words"] == 0
    assert tally["8000 Hz"]["clips"] == len(ns.KINDS)
