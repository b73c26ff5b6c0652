"""The feature front end inside the model (asr/models/features.py): presets, frames, padding, normalisation."""

import pytest
import torch

from asr.audio import resample
from asr.models.features import FeatureConfig, FeatureExtractor


def features(sample_rate: int, kind: str = "auto", norm: str = "bin") -> FeatureExtractor:
    """The front end without a variance floor, every frame in the statistics: features of unit variance, whatever
    their level."""
    return FeatureExtractor(FeatureConfig(sample_rate, kind, norm=norm, var_floor=0.0, quiet_db=0.0))


def test_8khz_preset_gives_81_bins_and_1600_frames_for_16_seconds():
    feats, lengths = features(8000)(torch.randn(1, 16 * 8000), torch.tensor([16 * 8000]))
    assert feats.shape == (1, 1600, 81)
    assert lengths.tolist() == [1600]


def test_16khz_preset_is_80_mel_bins():
    feats, lengths = features(16000)(torch.randn(1, 16000), torch.tensor([16000]))
    assert feats.shape == (1, 100, 80) and lengths.tolist() == [100]


def test_16khz_linear_gives_161_bins():
    feats, _ = features(16000, "linear")(torch.randn(1, 16000), torch.tensor([16000]))
    assert feats.shape[-1] == 161


def test_unknown_feature_kind_or_no_mel_filter_is_refused():
    with pytest.raises(ValueError, match="'mfcc'"):
        FeatureConfig(16000, "mfcc")
    with pytest.raises(ValueError, match="n_mels must be >= 1, got 0"):
        FeatureConfig(16000, "mel", n_mels=0)
    with pytest.raises(ValueError, match="'cmvn'"):
        FeatureConfig(16000, norm="cmvn")


@pytest.mark.parametrize("sample_rate", [8000, 16000])
def test_padding_in_a_batch_does_not_change_an_utterances_features(sample_rate, waveforms):
    audio, lengths = waveforms(1.0, 0.63, rate=sample_rate)
    extractor = features(sample_rate)
    batch, frames = extractor(audio, lengths)
    alone, alone_frames = extractor(audio[1:, : lengths[1]], lengths[1:])
    assert frames[1] == alone_frames[0] == alone.shape[1]
    torch.testing.assert_close(batch[1, : frames[1]], alone[0], atol=1e-4, rtol=1e-4)
    assert batch[1, frames[1] :].abs().max() == 0


@pytest.mark.parametrize("config", [FeatureConfig(), FeatureConfig(stats_db=30.0)])
def test_the_default_features_of_audio_shorter_than_a_frame_are_no_frame(config):
    """The default run's front end leaves its quiet frames (quiet_db) out of the statistics, or keeps the loud ones
    (stats_db): with no frame to choose among, a clip shorter than a hop gives no frame, alone or batched."""
    audio, lengths = torch.randn(2, 16000) * 0.1, torch.tensor([100, 16000])
    alone, frames = FeatureExtractor(config)(audio[:1, :100], lengths[:1])
    assert alone.shape[1] == int(frames[0]) == 0
    batch, frames = FeatureExtractor(config)(audio, lengths)
    assert int(frames[0]) == 0 and bool(batch.isfinite().all())


@pytest.mark.parametrize("sample_rate", [8000, 16000])
@pytest.mark.parametrize("samples", [1, 100, 248, 399])
def test_audio_shorter_than_a_window_gives_its_frames_alone_and_in_a_batch(sample_rate, samples, tiny_model):
    """Shorter than n_fft (160 / 400 samples) must not stop torch.stft: n // hop frames, and the model
    gives the same (zero or few) output frames batched with a long utterance as on its own."""
    audio = torch.randn(2, sample_rate) * 0.1
    lengths = torch.tensor([samples, sample_rate])
    extractor = features(sample_rate)
    batch, frames = extractor(audio, lengths)
    alone, alone_frames = extractor(audio[:1, :samples], lengths[:1])
    hop = extractor.config.hop_length
    assert int(frames[0]) == int(alone_frames[0]) == alone.shape[1] == samples // hop
    torch.testing.assert_close(batch[0, : frames[0]], alone[0], atol=1e-4, rtol=1e-4)
    model = tiny_model(sample_rate=sample_rate).eval()
    with torch.no_grad():
        batch_out, batch_lengths = model(audio, lengths)
        alone_out, alone_lengths = model(audio[:1, :samples], lengths[:1])
    n = int(alone_lengths[0])
    assert int(batch_lengths[0]) == n == model.encoder_frames(samples) and torch.isfinite(alone_out).all()
    torch.testing.assert_close(batch_out[0, :n], alone_out[0, :n], atol=1e-4, rtol=1e-4)


def test_a_training_batch_of_audio_shorter_than_a_window_runs_forward_and_backward(tiny_model):
    """SpecAugment and the masks see zero frames; gradients stay finite."""
    model = tiny_model(dropout=0.1).train()
    log_probs, lengths = model(torch.randn(2, 100) * 0.1, torch.tensor([100, 37]))
    log_probs.sum().backward()
    assert lengths.tolist() == [0, 0] and torch.isfinite(log_probs).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("pad", [1.0, float("nan")])
@pytest.mark.parametrize("sample_rate", [16000, 8000])
def test_features_ignore_whatever_lies_beyond_the_length(waveforms, sample_rate, pad):
    audio, lengths = waveforms(1.0, 0.6)
    noisy = audio.clone()
    noisy[1, lengths[1] :] = pad  # a collate that padded with something other than zeros, or a buffer never written
    extractor = features(sample_rate)
    torch.testing.assert_close(extractor(noisy, lengths)[0], extractor(audio, lengths)[0])


def test_features_are_normalised_per_bin_over_valid_frames(waveforms):
    audio, lengths = waveforms(1.0, 0.55)
    feats, frames = features(16000)(audio, lengths)
    valid = feats[1, : frames[1]]  # (T, F)
    torch.testing.assert_close(valid.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(valid.std(0, unbiased=False), torch.ones(80), atol=1e-2, rtol=0)


def test_statistics_of_some_samples_normalise_those_frames_and_scale_the_rest_alike(waveforms):
    """asr.inference.focus's second pass: the frames of samples [start, end) alone give the mean and variance."""
    audio, lengths = waveforms(1.0, 0.6)
    extractor = features(16000)
    whole, frames = extractor(audio, lengths)
    feats, _ = extractor(audio, lengths, statistics=torch.tensor([[3200, 9600], [0, 9600]]))  # 0.2-0.6 s, 0-0.6 s
    inside = feats[0, 20:60]  # frames of the samples 3200-9600 (10 ms hop)
    torch.testing.assert_close(inside.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(inside.std(0, unbiased=False), torch.ones(80), atol=1e-2, rtol=0)
    assert not torch.allclose(feats[0], whole[0], atol=1e-2)
    x, y = whole[0] - whole[0].mean(0), feats[0] - feats[0].mean(0)  # every frame, inside or not, on one line a bin
    slope = (x * y).sum(0) / x.pow(2).sum(0)
    torch.testing.assert_close(y, x * slope, atol=1e-3, rtol=0)
    torch.testing.assert_close(feats[1], whole[1])  # the second utterance's statistics are all its frames: as without
    assert frames.tolist() == [100, 60]


def test_shared_normalisation_scales_all_bins_by_one_variance(waveforms):
    audio, lengths = waveforms(1.0, 0.55)
    own, frames = features(16000)(audio, lengths)
    shared, _ = features(16000, norm="shared")(audio, lengths)
    valid = shared[1, : frames[1]]  # (T, F)
    torch.testing.assert_close(valid.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    torch.testing.assert_close(valid.var(0, unbiased=False).mean(), torch.tensor(1.0), atol=1e-3, rtol=0)
    # the same features, each bin scaled by one factor over all its frames
    ratio = shared[1, : frames[1]] / own[1, : frames[1]]
    assert ratio.std(0).max() < 1e-3


def test_shared_normalisation_keeps_an_empty_band_flat_where_per_bin_blows_it_up():
    """Telephone audio (8 kHz, speech below 3.4 kHz over a line's noise floor) transcribed by a 16 kHz model:
    above 6.5 kHz only the resamplers' faint residue is left."""
    generator, rate = torch.Generator().manual_seed(0), 6800
    bursts = (torch.arange(2 * rate) * 2.5 / rate).floor() % 2 == 0  # 0.2 s on, 0.2 s off
    line = 0.1 * torch.randn(2 * rate, generator=generator) * bursts + 1e-3 * torch.randn(2 * rate, generator=generator)
    wide = resample(resample(line[None], rate, 8000), 8000, 16000)
    hz = FeatureConfig(16000).bin_hz()
    band, top = hz < 3400, hz > 6500
    for norm, low, high in (("bin", 0.99, 1.01), ("shared", 0.0, 0.3)):
        feats, _ = features(16000, norm=norm)(wide, torch.tensor([wide.shape[1]]))
        spread = feats[0].std(0, unbiased=False)  # (F,)
        assert spread[band].min() > 0.99, (norm, spread)  # the band with speech: unit scale either way
        assert low <= spread[top].min() and spread[top].max() <= high, (norm, spread)


def test_features_stay_fp32_under_bf16_autocast(waveforms):
    audio, lengths = waveforms(1.0, 0.5)
    extractor = features(16000)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        feats, _ = extractor(audio, lengths)
    assert feats.dtype == torch.float32
    torch.testing.assert_close(feats, extractor(audio, lengths)[0])


def test_bin_hz_are_the_centres_of_the_mel_filters_and_the_linear_bins():
    mel = FeatureConfig(16000)
    fbanks = FeatureExtractor(mel).fbanks  # (bins, mels)
    bins = torch.linspace(0, 8000, fbanks.shape[0])
    centroids = bins @ fbanks / fbanks.sum(0)  # each filter's centre of mass
    torch.testing.assert_close(mel.bin_hz(), centroids, atol=25.0, rtol=0.0)  # 40 Hz bin spacing
    linear = FeatureConfig(8000)
    torch.testing.assert_close(linear.bin_hz(), torch.arange(81) * 4000.0 / 80)
