"""model.features.quiet_db (asr.models.features.quiet_frames): silence around speech left out of the normalisation's statistics."""

import math
from unittest import mock

import pytest
import torch

from asr.data import nonspeech as ns
from asr.models.features import DB_PER_NEPER, FeatureConfig, FeatureExtractor, normalise, quiet_frames

RATE = 16000
QUIET_DB = 6.0  # the default run's


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def speech_like(seconds: float) -> torch.Tensor:
    """Loud and quiet stretches of a tone, the level changing every 0.1 s: frames of many energies (0 to -30 dB)."""
    t = torch.arange(int(RATE * seconds)) / RATE
    level = 10 ** (-torch.rand(int(seconds * 10) + 1, generator=seeded(3)) * 1.5)
    return (0.3 * torch.sin(2 * math.pi * 440 * t) * level[(t * 10).long()]).float()


def speech_frames(wave: torch.Tensor, pad: int, quiet_db: float) -> torch.Tensor:
    """The normalised features of the 150 frames after ``pad`` samples of ``wave``."""
    config = FeatureConfig(RATE, norm="shared", quiet_db=quiet_db)
    feats = FeatureExtractor(config)(wave[None], torch.tensor([len(wave)]))[0][0]
    first = pad // config.hop_length + 2  # the first frame wholly inside the speech
    return feats[first: first + 150]


@pytest.mark.parametrize("kind", ["silence", "dither"])
def test_how_much_silence_surrounds_speech_no_longer_changes_how_the_speech_is_scaled(kind):
    speech = speech_like(2.0)
    padded = {s: torch.cat([ns.clip(kind, s, RATE, seeded()), speech, ns.clip(kind, s, RATE, seeded())])
              for s in (0.5, 4.0)}
    frames = {s: speech_frames(wave, int(s * RATE), QUIET_DB) for s, wave in padded.items()}
    counted = {s: speech_frames(wave, int(s * RATE), 0.0) for s, wave in padded.items()}
    assert (frames[0.5] - frames[4.0]).abs().max() < 1e-3  # the silence is out of the statistics however long
    assert (counted[0.5] - counted[4.0]).abs().max() > 1.0  # counted, 3.5 s more of it moved the speech's features


@pytest.mark.xfail(strict=True, reason="known: asr.models.features.frame_energy averages a batch's padding into a shorter "
                   "utterance's last windows, which moves its quiet_db line; the fix changes how the default run trains "
                   "(4 seeds to measure) and undoes the Czech arms' gains (docs/benchmarks.md, 2026-11-27 noon)")
@pytest.mark.parametrize("kind", ["brown", "pink"])
def test_an_utterance_is_scaled_the_same_alone_and_batched_with_a_longer_one(kind):
    """A batch's padding should be no part of an utterance's level: steady noise, whose frames wander a few dB, is
    scaled otherwise when padded (its last frames' level pulled to the floor moves the line; 0.6-1.2 apart)."""
    short, long = ns.clip(kind, 2.0, RATE, seeded(1)), ns.clip(kind, 5.0, RATE, seeded(2))
    extract = FeatureExtractor(FeatureConfig(RATE, norm="shared", quiet_db=QUIET_DB))
    alone = extract(short[None], torch.tensor([len(short)]))[0][0]
    batch = torch.nn.utils.rnn.pad_sequence([long, short], batch_first=True)
    batched = extract(batch, torch.tensor([len(long), len(short)]))[0][1, : len(alone)]
    assert quiet_frames(*raw(extract, short), QUIET_DB).any()  # the rule is at work on this noise
    torch.testing.assert_close(batched, alone, atol=1e-4, rtol=1e-4)


def test_a_loud_tone_does_not_move_the_line():
    """The line is the quietest frames' level plus quiet_db: a tone 20 dB over the speech changes nothing below it."""
    speech = speech_like(2.0)
    tone = 3 * torch.sin(2 * math.pi * 1000 * torch.arange(RATE) / RATE)  # 20 dB over the speech's peak
    extract = FeatureExtractor(FeatureConfig(RATE))

    def quiet(wave):
        return quiet_frames(*raw(extract, wave), QUIET_DB)[0, :, 0]

    alone, with_tone = quiet(speech), quiet(torch.cat([speech, tone]))
    assert alone.any() and torch.equal(with_tone[: len(alone) - 2], alone[:-2])


def raw(extract: FeatureExtractor, wave: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log features before normalisation (the extractor with normalise made the identity)."""
    with mock.patch("asr.models.features.normalise", lambda feats, *args: feats):
        return extract(wave[None], torch.tensor([len(wave)]))


def test_an_utterance_of_one_level_counts_every_frame():
    feats, lengths = torch.full((1, 40, 8), -3.0), torch.tensor([30])
    assert not quiet_frames(feats, lengths, QUIET_DB).any()
    assert torch.allclose(normalise(feats, lengths, True, 0.0, 0.0, QUIET_DB), normalise(feats, lengths, True, 0.0))


def test_frames_within_the_range_of_the_quietest_are_left_out():
    energy = torch.tensor([-13.8] * 20 + [-5.0] * 20 + [-13.8 + 5.0 / DB_PER_NEPER] * 20)  # silence, speech, 5 dB above
    feats, lengths = energy[None, :, None].repeat(1, 1, 4), torch.tensor([60])
    out = quiet_frames(feats, lengths, QUIET_DB)[0, :, 0]
    assert out[:20].all() and not out[20:40].any() and out[40:].all()
    with pytest.raises(ValueError, match="model.features.quiet_db must be >= 0 dB"):
        FeatureConfig(quiet_db=-1.0)
