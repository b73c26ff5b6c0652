"""asr.models.blocks' varlen path: which attention path runs where, and varlen_attention's arguments checked through
a CPU reference of varlen_attn against the masked SDPA path (global and local, Transformer and Conformer, uneven
lengths); the ``gpu`` tests run the real Flash Attention kernels in bf16 against SDPA."""

import pytest
import torch
import torch.nn.functional as F

from asr.models import blocks
from asr.models.blocks import BLOCKS, attention, attention_mask, attention_path, self_attention, varlen_attention
from tests.conftest import encoder

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                          seqused_k=None, **unused):
    """torch.nn.attention.varlen.varlen_attn's semantics on any device, one SDPA call per sequence: sequence i is
    rows cu_seq[i]:cu_seq[i + 1] of (total, H, D); its queries see its keys (the first seqused_k[i] with it) that lie
    within window_size (left, right) of their position, -1 meaning unbounded. A row with no key gives NaN."""
    assert query.dim() == 3 and cu_seq_q.dtype == cu_seq_k.dtype == torch.int32 and not unused
    assert isinstance(max_q, int) and isinstance(max_k, int)  # a Python int, not a tensor's value
    assert int(cu_seq_q[-1]) == query.shape[0] and int(cu_seq_k[-1]) == key.shape[0]
    out = torch.zeros_like(query)
    for i in range(len(cu_seq_q) - 1):
        q0, q1, k0, k1 = int(cu_seq_q[i]), int(cu_seq_q[i + 1]), int(cu_seq_k[i]), int(cu_seq_k[i + 1])
        k1 = k0 + int(seqused_k[i]) if seqused_k is not None else k1
        assert 0 <= q1 - q0 <= max_q and 0 <= k1 - k0 <= max_k
        if q1 == q0:
            continue
        rows = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)  # aligned bottom-right, as Flash does
        columns = torch.arange(k1 - k0)[None, :]
        left, right = window_size
        allowed = ((columns >= rows - left) | (left < 0)) & ((columns <= rows + right) | (right < 0))
        q, k, v = (x.transpose(0, 1) for x in (query[q0:q1], key[k0:k1], value[k0:k1]))  # (H, n, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.to(query.device), scale=scale)
        out[q0:q1] = y.transpose(0, 1)
    return out


def keep_of(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, T', 1) float: 1 inside the utterance, as BlockEncoder makes it."""
    return (torch.arange(frames, device=lengths.device) < lengths[:, None]).unsqueeze(-1).float()


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    """attention takes the varlen path wherever it is given keep, through reference_varlen_attn."""
    monkeypatch.setattr(blocks, "attention_path", lambda *args: "varlen")
    monkeypatch.setattr(blocks, "varlen_attn", reference_varlen_attn)


@pytest.mark.parametrize("device, dtype, head_dim, dropout_p, available, path", [
    (CUDA, torch.bfloat16, 64, 0.0, True, "varlen"),
    (CUDA, torch.float16, 64, 0.0, True, "varlen"),
    (CUDA, torch.bfloat16, 8, 0.0, True, "varlen"),
    (CUDA, torch.bfloat16, 256, 0.0, True, "varlen"),
    (CUDA, torch.float32, 64, 0.0, True, "sdpa"),  # 32-true: Flash has no fp32
    (CUDA, torch.bfloat16, 64, 0.1, True, "sdpa"),  # attention dropout in training: varlen_attn has none
    (CUDA, torch.bfloat16, 36, 0.0, True, "sdpa"),  # the tiny preset's 144 / 4
    (CUDA, torch.bfloat16, 512, 0.0, True, "sdpa"),
    (CUDA, torch.bfloat16, 64, 0.0, False, "sdpa"),  # pre-Ampere, ROCm, a build without Flash
    (CPU, torch.bfloat16, 64, 0.0, True, "sdpa"),
    (CPU, torch.float32, 64, 0.0, True, "sdpa"),
])
def test_attention_path_picks_varlen_only_where_flash_attention_runs(monkeypatch, device, dtype, head_dim, dropout_p,
                                                                    available, path):
    monkeypatch.setattr(blocks, "varlen_available", lambda device: available)
    assert attention_path(device, dtype, head_dim, dropout_p) == path


def test_attention_path_keeps_sdpa_under_torch_export(monkeypatch):
    monkeypatch.setattr(blocks, "varlen_available", lambda device: True)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert attention_path(CUDA, torch.bfloat16, 64, 0.0) == "sdpa"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cpu_tensors_never_reach_varlen_attn(monkeypatch):
    monkeypatch.setattr(blocks, "varlen_attn", lambda *args, **kwargs: pytest.fail("varlen_attn on CPU"))
    lengths = torch.tensor([9, 4])
    attention(torch.randn(3, 2, 2, 9, 8), attention_mask(lengths, 9), keep=keep_of(lengths, 9))


@pytest.mark.parametrize("training, attention_dropout, dropout_p", [(True, 0.5, 0.5), (True, 0.0, 0.0),
                                                                    (False, 0.5, 0.0)])
def test_the_block_asks_attention_path_with_the_dropout_it_would_apply(monkeypatch, training, attention_dropout,
                                                                       dropout_p):
    asked = []
    monkeypatch.setattr(blocks, "attention_path", lambda *args: asked.append(args) or "sdpa")
    block = BLOCKS["transformer"](encoder(attention_dropout=attention_dropout)).train(training)
    lengths = torch.tensor([6, 3])
    self_attention(block, torch.randn(2, 6, 32), attention_mask(lengths, 6), keep=keep_of(lengths, 6))
    assert asked == [(CPU, torch.float32, 8, dropout_p)]


@pytest.mark.parametrize("window, window_size", [(0, (-1, -1)), (3, (3, 3))])
def test_varlen_attention_splits_each_utterance_into_frames_and_padding(monkeypatch, window, window_size):
    calls = []
    monkeypatch.setattr(blocks, "varlen_attn", lambda *args, **kwargs: calls.append((args, kwargs)) or args[0])
    q = torch.randn(3, 2, 8, 4)  # (B, H, T', dh)
    varlen_attention(q, q, q, torch.tensor([8, 5, 1]), window)
    (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k), kwargs = calls[0]
    assert query.shape == (3 * 8, 2, 4) and query.is_contiguous()
    assert cu_seq_q.tolist() == cu_seq_k.tolist() == [0, 8, 8, 13, 16, 17, 24]  # the first utterance has no padding
    assert cu_seq_q.dtype == torch.int32 and (max_q, max_k) == (8, 8) and kwargs == {"window_size": window_size}


@pytest.mark.parametrize("block_type", list(BLOCKS))
@pytest.mark.parametrize("frames, window, dense_up_to", [(40, 0, 256), (40, 3, 256), (70, 5, 0), (70, 40, 0)])
def test_varlen_path_equals_the_masked_sdpa_path_on_the_frames_of_each_utterance(monkeypatch, block_type, frames,
                                                                                 window, dense_up_to):
    """(70, w, 0): SDPA's blocks of LOCAL_BLOCK queries; a 40-frame window reaches past the neighbouring blocks."""
    monkeypatch.setattr(blocks, "LOCAL_DENSE_FRAMES", dense_up_to)
    torch.manual_seed(0)
    block = BLOCKS[block_type](encoder(block=block_type, attention_window=window, conv_kernel=5, dropout=0.0)).train()
    lengths = torch.tensor([frames, frames // 2 + 1, 1, 0])  # uneven, one frame, none
    x = torch.randn(4, frames, 32, requires_grad=True)  # (B, T', d)
    mask, keep = attention_mask(lengths, frames, window), keep_of(lengths, frames)

    def run():
        y = block(x, mask, keep)
        return y, torch.autograd.grad((y * keep).square().sum(), [x, *block.parameters()])

    want, want_grads = run()
    with monkeypatch.context() as patch:
        patch.setattr(blocks, "attention_path", lambda *args: "varlen")
        patch.setattr(blocks, "varlen_attn", reference_varlen_attn)
        got, got_grads = run()
    assert torch.isfinite(got).all()  # padding sees padding: no NaN to leak
    torch.testing.assert_close(got * keep, want * keep)
    torch.testing.assert_close(got_grads, want_grads)


@pytest.mark.parametrize("rotary", [False, True], ids=["transformer", "conformer-rotary"])
@pytest.mark.parametrize("window", [0, 4])
def test_attention_without_keep_stays_on_sdpa(varlen_on_cpu, rotary, window):
    lengths = torch.tensor([12, 7])
    qkv = torch.randn(3, 2, 2, 12, 8)
    mask = attention_mask(lengths, 12, window)
    q, k, v = qkv
    q, k = (blocks.rotate(q), blocks.rotate(k)) if rotary else (q, k)
    torch.testing.assert_close(attention(qkv, mask, rotary=rotary, window=window),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


# On a GPU (scripts/gpu_check.sh): the real varlen_attn against SDPA, both in bf16, each against fp32 SDPA.

def needs_varlen() -> None:
    if not blocks.varlen_available(torch.device("cuda")):
        pytest.skip("varlen_attn's Flash Attention needs an NVIDIA GPU of compute capability 8.0 or later")


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("rotary", [False, True], ids=["transformer", "conformer-rotary"])
@pytest.mark.parametrize("frames, window", [(100, 0), (300, 0), (300, 16), (300, 40)])  # over 128: cuDNN on sm90
def test_cuda_varlen_matches_sdpa_in_bf16_forward_and_backward(frames, window, rotary):
    needs_varlen()
    torch.manual_seed(0)
    lengths = torch.tensor([frames, frames // 2 + 7, 1], device="cuda")  # the first has no padding: an empty sequence
    keep = keep_of(lengths, frames).bfloat16()
    valid = keep[:, None]  # (B, 1, T', 1) against (B, H, T', dh)
    mask = attention_mask(lengths, frames, window)
    qkv = torch.randn(3, 3, 4, frames, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_out = torch.randn(3, 4, frames, 64, device="cuda", dtype=torch.bfloat16)
    assert attention_path(qkv.device, qkv.dtype, 64, 0.0) == "varlen"
    results = {}
    for name, inputs, given in (("varlen", qkv, keep), ("sdpa", qkv, None), ("fp32", qkv.float(), None)):
        y = attention(inputs, mask, rotary=rotary, keep=given, window=window)
        (grad,) = torch.autograd.grad((y * valid * grad_out).sum(), qkv)
        results[name] = (y * valid, grad)
    assert all(torch.isfinite(t).all() for t in results["varlen"])
    for i in range(2):  # output, gradient of qkv: varlen's bf16 error within twice SDPA's, plus bf16's resolution
        want = results["fp32"][i]
        assert error(results["varlen"][i], want) <= 2 * error(results["sdpa"][i], want) + 1e-2 * want.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("block_type", list(BLOCKS))
@pytest.mark.parametrize("window", [0, 8])
def test_cuda_encoder_under_bf16_autocast_agrees_on_both_paths(monkeypatch, tiny_model, waveforms, block_type, window):
    needs_varlen()
    model = tiny_model(block=block_type, attention_window=window).cuda().train()
    audio, lengths = waveforms(3.0, 1.7, 0.4)
    features, frames = model.features(audio.cuda(), lengths.cuda())
    results = {}
    for path in ("varlen", "sdpa"):
        monkeypatch.setattr(blocks, "attention_path", lambda *args, path=path: path)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            states, out_lengths = model.encoder(features, frames)
        keep = keep_of(out_lengths, states.shape[1])
        loss = (states.float() * keep).square().sum()
        results[path] = (states.float() * keep, torch.autograd.grad(loss, list(model.encoder.parameters())))
    torch.testing.assert_close(results["varlen"][0], results["sdpa"][0], atol=5e-2, rtol=5e-2)
    for got, want in zip(results["varlen"][1], results["sdpa"][1]):
        assert error(got, want) <= 5e-2 * want.abs().max().item() + 1e-3
