"""asr.models.blocks: local attention against a dense mask, dropout, rotary scores, the Conformer's masked batch norm
and the settings a block refuses."""

import pytest
import torch

from asr.models.blocks import BLOCKS, LOCAL_BLOCK, ConvModule, TransformerBlock, attention, attention_mask, dropout, rotate, self_attention
from asr.models.ctc import CTCModel
from asr.models.features import FeatureConfig
from tests.conftest import encoder

BLOCK_TYPES = list(BLOCKS)


def dense_window_mask(lengths: torch.Tensor, frames: int, window: int) -> torch.Tensor:
    """(B, T', T') the plain way: keys inside the utterance and at most ``window`` away, and each frame itself."""
    positions = torch.arange(frames)
    near = (positions[:, None] - positions[None, :]).abs() <= window
    return (near[None] & (positions < lengths[:, None])[:, None, :]) | torch.eye(frames, dtype=torch.bool)


def as_dense(mask: torch.Tensor, frames: int, window: int) -> torch.Tensor:
    """attention_mask's local mask, (B, 1, T', T') or per block (B, blocks, 1, LOCAL_BLOCK, span) -> (B, T', T')."""
    if mask.dim() == 4:
        return mask[:, 0]
    dense = torch.zeros(mask.shape[0], frames, frames, dtype=torch.bool)
    for q in range(frames):
        block, row = divmod(q, LOCAL_BLOCK)
        for column in range(mask.shape[-1]):
            key = block * LOCAL_BLOCK - window + column
            if 0 <= key < frames:
                dense[:, q, key] = mask[:, block, 0, row, column]
    return dense


@pytest.mark.parametrize("dense_up_to", [256, 0])  # the whole T' x T' mask, or per block of queries
def test_attention_window_limits_what_a_frame_sees(monkeypatch, dense_up_to):
    monkeypatch.setattr("asr.models.blocks.LOCAL_DENSE_FRAMES", dense_up_to)
    mask = as_dense(attention_mask(torch.tensor([5, 3]), 5, window=1), 5, window=1)  # (B, T', T')
    assert mask[0, 2].tolist() == [False, True, True, True, False]
    assert mask[1, 2].tolist() == [False, True, True, False, False]  # frames 3, 4 are padding
    assert mask[1, 4].tolist() == [False, False, False, False, True]  # padding sees only itself: no NaN
    lengths = torch.tensor([70, 33, 1])  # across blocks of LOCAL_BLOCK queries
    assert torch.equal(as_dense(attention_mask(lengths, 70, window=4), 70, 4), dense_window_mask(lengths, 70, 4))


@pytest.mark.parametrize("rotary", [False, True], ids=["transformer", "conformer-rotary"])
@pytest.mark.parametrize("frames, window, dense_up_to", [(5, 1, 0), (32, 4, 0), (33, 4, 0), (90, 16, 0), (90, 32, 0),
                                                         (100, 40, 0), (300, 4, 256), (100, 4, 256)])
def test_local_attention_in_blocks_equals_attention_under_the_dense_window_mask(monkeypatch, frames, window,
                                                                                dense_up_to, rotary):
    monkeypatch.setattr("asr.models.blocks.LOCAL_DENSE_FRAMES", dense_up_to)
    lengths = torch.tensor([frames, max(1, frames // 2), max(1, frames - 7)])
    qkv = torch.randn(3, 3, 4, frames, 8, requires_grad=True)  # (3, B, H, T', d/H)
    got = attention(qkv, attention_mask(lengths, frames, window), rotary=rotary)
    dense = dense_window_mask(lengths, frames, window)[:, None]
    q, k, v = qkv
    q, k = (rotate(q), rotate(k)) if rotary else (q, k)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want)
    (grad_got,) = torch.autograd.grad(got.square().sum(), qkv)
    (grad_want,) = torch.autograd.grad(want.square().sum(), qkv)
    torch.testing.assert_close(grad_got, grad_want)


def test_dropout_zeroes_a_share_p_of_elements_and_keeps_the_mean():
    torch.manual_seed(0)
    x = torch.ones(200_000, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.3) < 0.005  # 200k draws: the standard error is 0.001
    assert abs(y.mean().item() - 1.0) < 0.01
    y.sum().backward()
    assert torch.equal(x.grad == 0, y == 0)  # gradients flow through the kept elements only
    assert torch.equal(dropout(x, 0.3, training=False), x) and torch.equal(dropout(x, 0.0, training=True), x)
    assert dropout(x.bfloat16(), 0.3, training=True).dtype == torch.bfloat16  # bf16 stays bf16 under autocast


def test_dropout_masks_differ_between_calls_and_repeat_under_the_same_seed():
    x = torch.ones(4096)
    torch.manual_seed(0)
    first, second = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(0)
    assert not torch.equal(first, second) and torch.equal(dropout(x, 0.5, True), first)


@pytest.mark.parametrize("block_type", BLOCK_TYPES)
def test_attention_dropout_drops_attention_weights_in_training_only(block_type):
    x = torch.randn(2, 20, 32)  # (B, T', d), as normed by the block
    mask = attention_mask(torch.tensor([20, 12]), 20)
    torch.manual_seed(0)
    plain = BLOCKS[block_type](encoder()).train()
    torch.manual_seed(0)
    block = BLOCKS[block_type](encoder(attention_dropout=0.5)).train()  # the same weights
    first, second = self_attention(block, x, mask), self_attention(block, x, mask)
    assert not torch.allclose(first, second) and not torch.allclose(first, self_attention(plain, x, mask))
    torch.testing.assert_close(self_attention(block.eval(), x, mask), self_attention(plain, x, mask))


def test_transformer_block_keeps_its_parameter_names_so_older_checkpoints_load():
    names = {name for name, _ in TransformerBlock(encoder()).named_parameters()}
    assert names == {f"{layer}.{p}" for layer in ("attn_norm", "qkv", "proj", "ff_norm", "ff_in", "ff_out")
                     for p in ("weight", "bias")}


def test_rotary_scores_depend_only_on_the_distance_between_frames():
    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 40, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 40, 8)
    scores = rotate(q)[0, 0] @ rotate(k)[0, 0].T  # (T', T'): the same q and k at every frame
    torch.testing.assert_close(scores[3, 7], scores[30, 34])  # 4 frames apart, anywhere
    torch.testing.assert_close(scores[5, 2], scores[25, 22])
    assert not torch.allclose(scores[3, 7], scores[3, 8])


def test_conformer_batch_norm_statistics_ignore_padded_frames():
    conv = ConvModule(encoder(block="conformer", conv_kernel=5, conv_norm="batch", dropout=0.0)).train()
    x = torch.randn(2, 12, 32)
    keep = (torch.arange(12) < torch.tensor([12, 7])[:, None]).unsqueeze(-1).float()  # (B, T', 1)
    clean = conv(x * keep, keep)
    stats = conv.conv_norm.running_mean.clone(), conv.conv_norm.running_var.clone()
    conv.conv_norm.reset_running_stats()
    noisy = conv(x + 100 * (1 - keep), keep)  # padding full of large values
    torch.testing.assert_close(noisy * keep, clean * keep)
    torch.testing.assert_close((conv.conv_norm.running_mean, conv.conv_norm.running_var), stats)


@pytest.mark.parametrize("overrides, message", [
    ({"block": "lstm"}, r"model\.encoder\.block must be one of \['conformer', 'transformer'\], got 'lstm'"),
    ({"block": "conformer", "conv_kernel": 4}, r"model\.encoder\.conv_kernel must be odd"),
    ({"block": "conformer", "conv_norm": "group"}, r"model\.encoder\.conv_norm must be 'layer' or 'batch'"),
    ({"block": "conformer", "d_model": 36},
     r"model\.encoder\.d_model / model\.encoder\.n_heads \(36 / 4\) must be even"),
])
def test_bad_block_settings_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        CTCModel(FeatureConfig(16000), encoder(**overrides), 12)
