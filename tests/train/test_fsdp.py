"""asr.train.fsdp in one gloo process: the mixed-precision policy, gradient sync on accumulation, the fp16 plugin.

One rank shards nothing away, but FSDP2 runs all its machinery (all-gather in the policy's dtype,
unsharded gradient accumulation, reduce-scatter), so what a rank sees is what it sees among eight.
The two-process runs are in tests/e2e/test_scale_out.py.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
from pytorch_lightning.plugins.precision import MixedPrecision
from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from asr.train import fsdp


@contextlib.contextmanager
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def batch(waveforms):
    return waveforms(1.0, 0.7)


def loss(model, audio, lengths):
    log_probs, _ = model(audio, lengths)
    return log_probs.float().logsumexp(-1).mean()  # any scalar of every weight


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16),
                                              ("32-true", torch.float32)])
def test_blocks_compute_with_the_precisions_parameters_and_keep_fp32_weights_and_gradients(
        precision, dtype, tiny_model, waveforms):
    model, seen = tiny_model(), []
    block = model.encoder.units()[0]
    block.register_forward_pre_hook(lambda module, args: seen.append(next(module.parameters()).dtype))
    with one_rank() as mesh:
        fsdp.shard(model, model.encoder.units(), mesh, precision)
        loss(model, *batch(waveforms)).backward()
        assert seen == [dtype]  # all-gathered for compute in the policy's dtype
        assert {p.dtype for p in model.parameters()} == {p.grad.dtype for p in model.parameters()} == {torch.float32}


def test_accumulated_micro_batches_reduce_once_and_sum_like_one_unsharded_model(tiny_model, waveforms):
    reference, sharded = tiny_model(), tiny_model()
    audio, lengths = batch(waveforms)
    halves = [(audio[:1], lengths[:1]), (audio[1:, : int(lengths[1])], lengths[1:])]
    for half in halves:
        loss(reference, *half).backward()
    with one_rank() as mesh:
        fsdp.shard(sharded, sharded.encoder.units(), mesh, "32-true")
        fsdp.gradient_sync(sharded, False)
        loss(sharded, *halves[0]).backward()
        assert all(p.grad is None for p in sharded.parameters())  # kept unsharded, not reduced
        fsdp.gradient_sync(sharded, True)
        loss(sharded, *halves[1]).backward()
        for (name, theirs), ours in zip(reference.named_parameters(), sharded.parameters()):
            torch.testing.assert_close(ours.grad.full_tensor(), theirs.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_sync_leaves_an_unsharded_model_alone(tiny_model):
    model = tiny_model()
    fsdp.gradient_sync(model, False)  # no FSDP2: nothing to switch, no error
    assert not hasattr(model, "set_requires_gradient_sync")


def test_the_sharded_scaler_skips_an_overflowing_step_and_lowers_its_scale(tiny_model, waveforms):
    model = tiny_model()
    with one_rank() as mesh:
        fsdp.shard(model, model.encoder.units(), mesh, "32-true")
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scaler = ShardedGradScaler(device="cpu", init_scale=2.0 ** 10)
        scaler.scale(loss(model, *batch(waveforms))).backward()
        next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
        before = [p.to_local().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        assert scaler.get_scale() == 2.0 ** 9
        assert all(torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters()))


def test_fp16_under_fsdp2_gets_a_sharded_scaler_and_nothing_else_changes():
    fsdp_strategy, extra = ModelParallelStrategy(), object()
    precision, plugins = fsdp.sharded_fp16("16-mixed", fsdp_strategy, [extra])
    assert precision is None and plugins[0] is extra and isinstance(plugins[1], MixedPrecision)
    assert plugins[1].precision == "16-mixed" and isinstance(plugins[1].scaler, ShardedGradScaler)
    assert fsdp.sharded_fp16("bf16-mixed", fsdp_strategy, None) == ("bf16-mixed", None)
    assert fsdp.sharded_fp16("16-mixed", DDPStrategy(), None) == ("16-mixed", None)
    assert fsdp.sharded_fp16("16-mixed", "ddp", [extra]) == ("16-mixed", [extra])
