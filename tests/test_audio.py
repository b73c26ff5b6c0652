import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as AF

from asr.audio import AudioError, fast_fft_length, load_audio, resample
from asr.models.features import FeatureConfig, FeatureExtractor
from asr.models.specaugment import SpecAugment, SpecAugmentConfig


def features(sample_rate: int, kind: str = "auto", norm: str = "bin") -> FeatureExtractor:
    """The front end without a variance floor, every frame in the statistics: features of unit variance, whatever
    their level."""
    return FeatureExtractor(FeatureConfig(sample_rate, kind, norm=norm, var_floor=0.0, quiet_db=0.0))


def test_load_audio_mixes_stereo_to_mono_float32_at_the_files_rate(write_audio):
    path = write_audio("stereo.flac", 0.5, rate=8000, channels=2)
    both, _ = soundfile.read(path, dtype="float32")  # (n, 2)
    samples, rate = load_audio(path)
    assert rate == 8000
    assert samples.dtype == np.float32 and samples.shape == (both.shape[0],)
    np.testing.assert_allclose(samples, both.mean(axis=1), atol=1e-6)


def test_load_audio_offset_and_duration_read_that_slice(write_audio):
    path = write_audio("a.flac", 1.0)
    full, _ = load_audio(path)
    part, rate = load_audio(path, offset=0.25, duration=0.5)
    np.testing.assert_array_equal(part, full[int(0.25 * rate) : int(0.75 * rate)])


def test_load_audio_without_duration_reads_from_offset_to_the_end(write_audio):
    path = write_audio("a.flac", 1.0)
    full, rate = load_audio(path)
    np.testing.assert_array_equal(load_audio(path, offset=0.5)[0], full[int(0.5 * rate) :])


@pytest.mark.parametrize("content", [b"this is not a flac file" * 40, b""], ids=["garbage", "empty"])
def test_unusable_audio_raises_audio_error_naming_the_file(tmp_path, content):
    path = tmp_path / "broken.flac"
    path.write_bytes(content)
    with pytest.raises(AudioError, match="broken.flac"):
        load_audio(path)


def test_offset_past_the_end_raises_audio_error_naming_the_file(write_audio):
    path = write_audio("a.flac", 0.5)
    with pytest.raises(AudioError, match="a.flac"):
        load_audio(path, offset=2.0)


@pytest.mark.parametrize("from_rate, to_rate", [(16000, 8000), (8000, 16000)])
def test_resample_changes_length_by_the_rate_ratio(from_rate, to_rate):
    out = resample(torch.randn(2, from_rate), from_rate, to_rate)
    assert out.shape == (2, to_rate)


@pytest.mark.parametrize("from_rate, to_rate", [(14400, 16000), (17600, 16000), (44100, 16000), (16000, 8000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_resample_with_its_cached_kernel_equals_torchaudios(from_rate, to_rate, dtype):
    for seed in (0, 1):  # the second call reuses the kernel the first computed
        wave = torch.randn(3, 12347, generator=torch.Generator().manual_seed(seed), dtype=dtype)
        out = resample(wave, from_rate, to_rate)
        assert out.dtype == dtype
        torch.testing.assert_close(out, AF.resample(wave, from_rate, to_rate), rtol=0, atol=0)


@pytest.mark.parametrize("n", [1, 2, 7, 11, 97, 16001, 23417, 48000])
def test_fast_fft_length_is_the_next_length_with_factors_2_3_5_only(n):
    def smooth(m: int) -> bool:
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    length = fast_fft_length(n)
    assert length >= n and smooth(length)
    assert not any(smooth(m) for m in range(n, length))


def test_resample_keeps_a_tone_at_its_frequency():
    t = torch.arange(16000) / 16000
    out = resample(torch.sin(2 * torch.pi * 440 * t), 16000, 8000)
    assert torch.fft.rfft(out).abs().argmax() == 440  # 1 s of audio: bin k is k Hz


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


MASKS = SpecAugmentConfig(freq_warp=0.0, freq_warp_jitter=0.0)  # frequency and time masks alone


def test_spec_augment_is_identity_in_eval_mode():
    feats = torch.randn(3, 200, 80)
    assert torch.equal(SpecAugment(MASKS).eval()(feats), feats)


def test_spec_augment_masks_with_zeros_in_training():
    torch.manual_seed(0)
    feats = torch.randn(3, 200, 80)
    masked = SpecAugment(MASKS).train()(feats)
    assert masked.shape == feats.shape
    zeroed = masked == 0
    assert zeroed.any()
    assert torch.equal(masked[~zeroed], feats[~zeroed])  # what is not masked is untouched


def test_spec_augment_draws_different_masks_for_each_utterance():
    torch.manual_seed(0)
    masked = SpecAugment(MASKS).train()(torch.randn(4, 200, 80))
    zeroed = masked == 0
    assert any(not torch.equal(zeroed[0], zeroed[i]) for i in range(1, 4))


def test_bin_hz_are_the_centres_of_the_mel_filters_and_the_linear_bins():
    mel = FeatureConfig(16000)
    fbanks = FeatureExtractor(mel).fbanks  # (bins, mels)
    bins = torch.linspace(0, 8000, fbanks.shape[0])
    centroids = bins @ fbanks / fbanks.sum(0)  # each filter's centre of mass
    torch.testing.assert_close(mel.bin_hz(), centroids, atol=25.0, rtol=0.0)  # 40 Hz bin spacing
    linear = FeatureConfig(8000)
    torch.testing.assert_close(linear.bin_hz(), torch.arange(81) * 4000.0 / 80)


@pytest.mark.parametrize("sample_rate", [16000, 8000])
def test_freq_warp_moves_a_formant_by_the_drawn_factor_and_keeps_the_top_bin(sample_rate):
    cfg = FeatureConfig(sample_rate)
    hz = cfg.bin_hz()
    formant = torch.exp(-(((hz - 1000.0) / 150.0) ** 2))  # (F,) a peak at 1 kHz
    feats = formant.expand(3, 20, -1) + torch.linspace(0, 1, 20)[None, :, None]  # rising level over time
    augment = SpecAugment(SpecAugmentConfig(0, 15, 0, 0.05, freq_warp=0.2), bin_hz=hz)
    warped = augment.warp(feats, torch.tensor([0.8, 1.0, 1.2]))
    peaks = [hz[warped[i, 0].argmax()].item() for i in range(3)]
    assert peaks[0] == pytest.approx(800.0, rel=0.08) and peaks[2] == pytest.approx(1200.0, rel=0.08)
    torch.testing.assert_close(warped[1], feats[1])  # a = 1 changes nothing
    torch.testing.assert_close(warped[:, :, -1], feats[:, :, -1])  # the top bin stays
    torch.testing.assert_close(warped[:, 1:] - warped[:, :-1], feats[:, 1:] - feats[:, :-1])  # time untouched


@pytest.mark.parametrize("sample_rate", [16000, 8000])
@pytest.mark.parametrize("factor", [0.7, 0.9, 1.1, 1.4])
def test_freq_warp_reads_f_over_a_below_the_knee_then_a_line_to_the_top_bin(sample_rate, factor):
    hz = FeatureConfig(sample_rate).bin_hz()
    augment = SpecAugment(SpecAugmentConfig(freq_warp=0.45), bin_hz=hz)
    ramp = hz.expand(1, 1, -1)  # features equal to their own bin's Hz: the warp returns each bin's source Hz
    source = augment.warp(ramp, torch.tensor([factor]))[0, 0]
    knee = SpecAugment.WARP_KNEE * hz[-1].item() * min(1.0, factor)
    below, above = hz <= knee, hz > knee
    torch.testing.assert_close(source[below], (hz[below] / factor).clamp(min=hz[0]), rtol=1e-4, atol=1e-2)
    slopes = source[above].diff() / hz[above].diff()  # one line from (knee, knee / a) to (top, top)
    torch.testing.assert_close(slopes, slopes[:1].expand_as(slopes), rtol=1e-3, atol=1e-3)
    line_at_knee = source[above][0] - slopes[0] * (hz[above][0] - knee)
    assert line_at_knee.item() == pytest.approx(knee / factor, rel=1e-3)  # continuous at the knee
    assert source[-1].item() == pytest.approx(hz[-1].item()) and bool((source.diff() > 0).all())


@pytest.mark.parametrize("sample_rate", [16000, 8000])
def test_freq_warp_jitter_puts_each_formant_knot_where_its_own_factor_says(sample_rate):
    hz = FeatureConfig(sample_rate).bin_hz()
    augment = SpecAugment(SpecAugmentConfig(freq_warp=0.1, freq_warp_jitter=0.2), bin_hz=hz)
    knots = augment.jitter_knots
    assert knots.tolist() == [400.0, 1000.0, 2000.0, 3500.0][:len(knots)] and len(knots) >= 3
    factors = torch.tensor([0.9, 1.0, 1.1])
    jitters = torch.tensor([[0.8, 1.2, 0.9, 1.1], [1.2, 0.8, 1.1, 0.9], [1.0, 1.0, 1.0, 1.0]])[:, :len(knots)]
    landed = knots * factors[:, None] * jitters  # (3, K) output Hz of each knot
    grid = torch.cat([hz, landed.flatten()]).sort().values  # the bins, and where each knot lands
    source = augment.source_hz(grid, factors, jitters)
    for b in range(3):
        at = torch.searchsorted(grid, landed[b])
        torch.testing.assert_close(source[b, at], knots, rtol=1e-4, atol=1e-2)  # each knot reads its own Hz
    assert bool((source.diff(dim=1) >= 0).all()) and torch.equal(source[:, -1], grid[-1].expand(3))
    plain = SpecAugment(SpecAugmentConfig(freq_warp=0.1), bin_hz=hz).source_hz(grid, factors)
    torch.testing.assert_close(source[2], plain[2], rtol=1e-4, atol=1e-2)  # factors of 1: the plain warp


def test_freq_warp_jitter_moves_two_formants_apart():
    hz = FeatureConfig(16000).bin_hz()
    formants = torch.exp(-(((hz - 500.0) / 60.0) ** 2)) + torch.exp(-(((hz - 2500.0) / 200.0) ** 2))
    low, high = hz < 1500, hz >= 1500
    augment = SpecAugment(SpecAugmentConfig(freq_warp_jitter=0.2), bin_hz=hz)
    # F1's knots (400, 1000 Hz) up by 1.2, F2's (2000, 3500 Hz) down by 0.8: F1 rises, F2 falls
    warped = augment.warp(formants.expand(1, 1, -1), torch.ones(1), torch.tensor([[1.2, 1.2, 0.8, 0.8]]))[0, 0]
    assert hz[low][warped[low].argmax()].item() == pytest.approx(600.0, rel=0.06)
    assert hz[high][warped[high].argmax()].item() == pytest.approx(2000.0, rel=0.06)


def test_freq_warp_draws_a_factor_per_utterance_in_training_and_is_off_in_eval():
    cfg = FeatureConfig(16000)
    feats = torch.randn(1, 50, cfg.n_feats).expand(4, -1, -1)  # one utterance four times
    augment = SpecAugment(SpecAugmentConfig(0, 15, 0, 0.05, freq_warp=0.1), bin_hz=cfg.bin_hz())
    out = augment.train()(feats.clone())
    assert not torch.equal(out[0], feats[0]) and not torch.equal(out[0], out[1]) and not torch.equal(out[1], out[2])
    assert torch.equal(augment.eval()(feats), feats)
    with pytest.raises(ValueError, match="model.spec_augment.freq_warp"):
        SpecAugment(SpecAugmentConfig(freq_warp=0.5), bin_hz=cfg.bin_hz())
    # the knots alone warp too
    jitter = SpecAugment(SpecAugmentConfig(0, 15, 0, 0.05, freq_warp=0.0, freq_warp_jitter=0.1), bin_hz=cfg.bin_hz())
    out = jitter.train()(feats.clone())
    assert not torch.equal(out[0], feats[0]) and not torch.equal(out[0], out[1])
    assert torch.equal(jitter.eval()(feats), feats)
    with pytest.raises(ValueError, match="model.spec_augment.freq_warp_jitter must be in"):
        SpecAugment(SpecAugmentConfig(freq_warp_jitter=0.5), bin_hz=cfg.bin_hz())


@pytest.mark.parametrize("rates", [(8000, 16000), (44100, 16000), (16000, 8000)])
def test_a_stream_resampled_in_pieces_is_the_whole_resampled(rates):
    from asr.audio import StreamResampler, resample

    audio = torch.randn(2 * rates[0] + 37, generator=torch.Generator().manual_seed(0))
    convert, pieces, at, generator = StreamResampler(*rates), [], 0, torch.Generator().manual_seed(1)
    while at < len(audio):
        size = int(torch.randint(1, 3000, (), generator=generator))
        pieces.append(convert(audio[at: at + size]))
        at += size
    pieces.append(convert(audio[:0], final=True))
    torch.testing.assert_close(torch.cat(pieces), resample(audio, *rates), atol=1e-5, rtol=0)
