"""SpecAugment (asr/models/specaugment.py): masks and vocal tract length perturbation, in training only."""

import pytest
import torch

from asr.models.features import FeatureConfig
from asr.models.specaugment import SpecAugment, SpecAugmentConfig


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
