import pytest
import torch

from asr.audio import FeatureConfig, num_frames
from asr.decoding import greedy
from asr.model import CTCModel, EncoderConfig, subsampled_lengths
from asr.module import ctc_loss


@pytest.mark.parametrize("subsampling", [4, 8])
@pytest.mark.parametrize("sample_rate", [8000, 16000])
def test_output_shape_and_lengths_follow_subsampled_lengths(tiny_model, waveforms, sample_rate, subsampling):
    model = tiny_model(sample_rate=sample_rate, subsampling=subsampling).eval()
    audio, lengths = waveforms(1.3, 0.7, rate=sample_rate)
    log_probs, out_lengths = model(audio, lengths)
    expected = [subsampled_lengths(num_frames(int(n), sample_rate), subsampling) for n in lengths]
    assert out_lengths.tolist() == expected
    assert log_probs.shape == (2, max(expected), 12)
    assert model.encoder_frames(int(lengths[1])) == expected[1]


def test_subsampled_lengths_match_the_convolutions():
    assert subsampled_lengths(100, 4) == 24  # 100 -> 49 -> 24
    assert subsampled_lengths(100, 8) == 11  # ... -> 11
    assert subsampled_lengths(torch.tensor([100, 7]), 4).tolist() == [24, 1]


def test_subsampled_lengths_are_zero_not_negative_below_one_encoder_frame():
    assert subsampled_lengths(torch.arange(8), 4).tolist() == [0] * 7 + [1]  # x4 needs 7 feature frames
    assert subsampled_lengths(torch.arange(16), 8).tolist() == [0] * 15 + [1]  # x8 needs 15
    assert subsampled_lengths(2, 4) == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_log_probs_are_fp32_distributions_per_frame(tiny_model, waveforms, autocast):
    model = tiny_model().eval()
    audio, lengths = waveforms(1.0, 0.6)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        log_probs, _ = model(audio, lengths)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]))


@pytest.mark.parametrize("subsampling, window", [(4, 0), (8, 0), (4, 3)])
def test_an_utterance_gives_the_same_output_batched_and_alone(tiny_model, waveforms, subsampling, window):
    model = tiny_model(subsampling=subsampling, attention_window=window).eval()
    audio, lengths = waveforms(1.5, 0.8, 1.1)
    with torch.no_grad():
        batch, out_lengths = model(audio, lengths)
        for i in range(3):
            alone, alone_lengths = model(audio[i : i + 1, : lengths[i]], lengths[i : i + 1])
            assert alone_lengths[0] == out_lengths[i] == alone.shape[1]
            torch.testing.assert_close(batch[i, : out_lengths[i]], alone[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("subsampling", [4, 8])
def test_a_too_short_utterance_in_a_batch_decodes_to_nothing(tiny_model, waveforms, subsampling):
    audio, lengths = waveforms(1.0, 0.02)  # 2 feature frames: less than one encoder frame
    log_probs, out_lengths = tiny_model(subsampling=subsampling).eval()(audio, lengths)
    assert out_lengths[1] == 0 and greedy(log_probs, out_lengths)[1] == []


@pytest.mark.parametrize("subsampling", [4, 8])
def test_a_lone_utterance_too_short_for_an_encoder_frame_decodes_to_nothing(tiny_model, waveforms, subsampling):
    audio, lengths = waveforms(0.05)  # a short click transcribed on its own
    log_probs, out_lengths = tiny_model(subsampling=subsampling).eval()(audio, lengths)
    assert out_lengths.tolist() == [0] and greedy(log_probs, out_lengths) == [[]]


def loss_and_gradients(model: CTCModel, audio: torch.Tensor, lengths: torch.Tensor):
    log_probs, out_lengths = model(audio, lengths)
    tokens = torch.tensor([[3, 4, 5, 4], [6, 7, 0, 0]])
    loss = ctc_loss(log_probs, out_lengths, tokens, torch.tensor([4, 2]))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def count_block_calls(model: CTCModel) -> list[int]:
    calls = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("every, expected_calls", [(1, [2, 2]), (2, [2, 1])])
def test_activation_checkpointing_leaves_loss_and_gradients_unchanged(tiny_model, waveforms, every, expected_calls):
    audio, lengths = waveforms(1.0, 0.7)
    reference_loss, reference_grads = loss_and_gradients(tiny_model().train(), audio, lengths)
    model = tiny_model(checkpoint_every=every).train()
    calls = count_block_calls(model)
    loss, grads = loss_and_gradients(model, audio, lengths)
    assert calls == expected_calls  # checkpointed blocks run again in the backward pass
    torch.testing.assert_close(loss, reference_loss)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)


def encoder(**overrides) -> EncoderConfig:
    return EncoderConfig(**{"vocab_size": 12, "n_feats": 80, "d_model": 32, "n_heads": 4, "n_layers": 2, **overrides})


def test_d_model_not_divisible_by_n_heads_is_refused():
    with pytest.raises(ValueError, match=r"model\.d_model.*model\.n_heads"):
        CTCModel(FeatureConfig.preset(16000), encoder(d_model=30))


def test_subsampling_other_than_4_or_8_is_refused():
    with pytest.raises(ValueError, match=r"model\.subsampling.*3"):
        CTCModel(FeatureConfig.preset(16000), encoder(subsampling=3))


def test_encoder_feature_count_must_match_the_front_end():
    with pytest.raises(ValueError, match="n_feats"):
        CTCModel(FeatureConfig.preset(8000), encoder(n_feats=80))  # the 8 kHz preset gives 81


def test_negative_checkpoint_every_is_refused():
    with pytest.raises(ValueError, match="model.checkpoint_every"):
        CTCModel(FeatureConfig.preset(16000), encoder(), checkpoint_every=-1)


def test_attention_window_limits_what_a_frame_sees():
    from asr.model import attention_mask

    mask = attention_mask(torch.tensor([5, 3]), 5, window=1)[:, 0]  # (B, T', T')
    assert mask[0, 2].tolist() == [False, True, True, True, False]
    assert mask[1, 2].tolist() == [False, True, True, False, False]  # frames 3, 4 are padding
    assert mask[1, 4].tolist() == [False, False, False, False, True]  # padding sees only itself: no NaN


def test_conv_channels_narrow_the_subsampling_maps_but_not_the_model_width(waveforms):
    from asr.audio import FeatureConfig
    from asr.model import CTCModel, EncoderConfig

    features = FeatureConfig.preset(16000)
    cfg = EncoderConfig(vocab_size=12, n_feats=80, d_model=32, n_heads=4, n_layers=1, conv_channels=8)
    model = CTCModel(features, cfg).eval()
    assert [m.out_channels for m in model.subsampling.conv if hasattr(m, "out_channels")] == [8, 8]
    audio, lengths = waveforms(1.0, 0.6)
    log_probs, out_lengths = model(audio, lengths)
    assert log_probs.shape == (2, int(out_lengths.max()), 12)
    alone, _ = model(audio[1:, : lengths[1]], lengths[1:])
    torch.testing.assert_close(log_probs[1, : out_lengths[1]], alone[0], atol=1e-4, rtol=1e-4)
