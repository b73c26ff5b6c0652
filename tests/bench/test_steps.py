"""asr.bench.steps: the benchmarks build what ``python -m asr.fit`` builds and step as its trainer steps."""

from __future__ import annotations

import pytest
import torch

from asr.bench import steps as bench_steps

from asr.bench.sections import training_batches
from asr.configs import CONFIGS
from asr.data.batch import Batch
from asr.data.sampler import BucketBatchSampler
from asr.train import fitting
from tests import MINI
# steps are deterministic
NO_NOISE = ("--model.encoder.dropout=0", "--model.encoder.attention_dropout=0", "--model.spec_augment=null")


def batches(n: int, vocab: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(1)
    return [Batch(0.1 * torch.randn(2, 16000, generator=generator), torch.tensor([16000, 12000]),
                  torch.randint(2, vocab, (2, 4), generator=generator), torch.tensor([4, 3]), ["a", "b"])
            for _ in range(n)]


def test_bench_builds_the_model_and_data_asr_fit_builds(tmp_path):
    args = [f"--data.train_manifest={MINI / 'train.jsonl'}", f"--data.val_manifest={MINI / 'dev.jsonl'}",
            f"--data.test_manifest={MINI / 'test.jsonl'}", "--data.max_batch_seconds=30", "--model.encoder.n_layers=3",
            f"--trainer.default_root_dir={tmp_path}"]
    ours = bench_steps.build("small", *args)
    # the command asr.bench.steps.build stands for: the preset, then the overrides
    theirs = fitting.build(["--config", str(CONFIGS / "model" / "small.yaml"), *args])
    assert dict(ours.model.hparams) == dict(theirs.model.hparams) and ours.model.hparams.encoder["d_model"] == 256
    state, reference = ours.model.state_dict(), theirs.model.state_dict()
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in state)  # same seed
    weight = [torch.nn.Parameter(torch.zeros(1))]
    assert ours.model.optimizer_factory(weight).defaults == theirs.model.optimizer_factory(weight).defaults
    assert dict(ours.datamodule.hparams) == dict(theirs.datamodule.hparams)
    assert ours.trainer.precision == theirs.trainer.precision and ours.trainer.logger is None  # BENCH_TRAINER
    for cli in (ours, theirs):
        cli.datamodule.setup("fit")
    sampler, reference = ours.datamodule.train_dataloader().sampler, theirs.datamodule.train_dataloader().sampler
    assert isinstance(sampler, BucketBatchSampler) and list(sampler) == list(reference)

    def first_texts(cli) -> list[list[str]]:  # augmentation draws from torch's seed, in data workers or in this process
        torch.manual_seed(0)
        return [b.texts for b in training_batches(cli.datamodule, 2)]

    assert first_texts(ours) == first_texts(theirs)


def test_plain_step_takes_the_step_trainer_fit_takes(tokenizer_arg):
    """Same weights after three steps: the module's training_step, optimizer and lr schedule, in Lightning's order."""
    args = (tokenizer_arg, *NO_NOISE, "--model.schedule.warmup_steps=1", "--trainer.precision=32-true")
    plain = bench_steps.build("tiny", *args)
    data = batches(3, plain.model.tokenizer.vocab_size)
    initial = [p.detach().clone() for p in plain.model.parameters()]
    step = bench_steps.plain_step(plain, total_steps=len(data))
    for batch in data:
        step(batch)
    lightning = bench_steps.build("tiny", *args, f"--trainer.max_steps={len(data)}")
    assert len(bench_steps.lightning_times(lightning, data)) == len(data) - 1  # the first step warms up
    ours, theirs = list(plain.model.parameters()), list(lightning.model.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(ours, initial))  # the optimizer stepped
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision, keep_gradients", [("32-true", False), ("bf16-true", True)])
def test_plain_step_trains_in_its_precision_and_frees_or_zeroes_gradients(precision, keep_gradients, tokenizer_arg):
    cli = bench_steps.build("tiny", tokenizer_arg, f"--trainer.precision={precision}")
    data = batches(2, cli.model.tokenizer.vocab_size)
    before = [p.detach().float().clone() for p in cli.model.parameters()]
    step = bench_steps.plain_step(cli, total_steps=10, keep_gradients=keep_gradients)
    step(data[0])
    params = list(cli.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16 if precision == "bf16-true" else torch.float32}
    assert any(not torch.equal(p.detach().float(), b) for p, b in zip(params, before))  # the optimizer stepped
    grads = [p.grad for p in params]
    step(data[1])
    if keep_gradients:  # memory measurements: the same gradient buffers, zeroed in place before each backward
        assert all(p.grad is g for p, g in zip(params, grads))
    else:  # as Lightning: freed by zero_grad, allocated again by backward
        assert all(p.grad is not g for p, g in zip(params, grads))


def test_lightning_times_refuses_a_trainer_of_another_length(tokenizer_arg):
    cli = bench_steps.build("tiny", tokenizer_arg, "--trainer.max_steps=5")
    with pytest.raises(ValueError, match="--trainer.max_steps=2"):
        bench_steps.lightning_times(cli, batches(2, cli.model.tokenizer.vocab_size))


def test_fastest_takes_each_batch_best_pass():
    # two passes over three batches: (1, 2, 3) then (0.5, 2.5, 1)
    assert bench_steps.fastest([1.0, 2.0, 3.0, 0.5, 2.5, 1.0], 2) == pytest.approx(0.5 + 2.0 + 1.0)
    assert bench_steps.fastest([1.0, 2.0], 1) == 3.0


def test_unknown_preset_names_the_missing_file(tokenizer_arg):
    with pytest.raises(FileNotFoundError, match=r"configs/model/huge\.yaml"):
        bench_steps.build_module("huge", tokenizer_arg)
