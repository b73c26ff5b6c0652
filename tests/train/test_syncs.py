"""A training step never waits for the device (asr.intervals): no host read between logging steps, counted
by tests.syncs.SyncCounter on a CPU and by torch's sync debug mode on a GPU; what is read at the logging steps is
what the steps computed; a non-finite update is skipped on the device and said, counted and stopped at a read."""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from asr.data.batch import Batch
from asr.models import objectives
from asr.train.fitting import main
from asr.train.module import ASRModule, NonFiniteLossError
from tests import MINI
from tests.cli import CHAR_FRAMES
from tests.conftest import encoder
from tests.syncs import SyncCounter


def sliced(src: Path, dst: Path, n: int) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines()[:n]]
    dst.write_text("".join(json.dumps(dict(r, audio_filepath=str(src.parent / r["audio_filepath"]))) + "\n"
                           for r in rows))
    return dst


class StepTotals(pl.Callback):
    """Each update's (loss sum, tokens, utterances) as the module holds them before its own hook reads them: a
    copy on the device, read after the fit (callbacks' on_before_optimizer_step runs before the module's)."""

    def __init__(self):
        self.totals: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.totals.append(pl_module.step_totals.clone())


def default_fit(tmp_path: Path, *args: str, cuda: bool = False):
    """python -m asr.fit as documented (the default run, default callbacks, progress bar and CSV log), small: a tiny
    char model on 60 utterances of data/mini, one epoch of 22 updates; the CLI, its SyncCounter and StepTotals."""
    train = sliced(MINI / "train.jsonl", tmp_path / "train.jsonl", 60)
    dev = sliced(MINI / "dev.jsonl", tmp_path / "dev.jsonl", 2)
    counter = {"class_path": "tests.syncs.SyncCounter", "init_args": {"cuda": cuda}}
    cli = main(["--trainer.logger.init_args.save_dir", str(tmp_path), "--data.num_workers", "0", "--test", "false",
                "--model.encoder.d_model", "32", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
                "--data.tokenizer.type", "char", *CHAR_FRAMES, "--data.max_batch_seconds", "6", "--trainer.max_epochs", "1",
                "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
                f"--trainer.callbacks+={json.dumps(counter)}", "--trainer.callbacks+=tests.train.test_syncs.StepTotals",
                *args])
    callbacks = cli.trainer.callbacks
    return cli, *(next(cb for cb in callbacks if isinstance(cb, kind)) for kind in (SyncCounter, StepTotals))


def test_the_default_fit_reads_nothing_on_the_host_between_logging_steps_and_logs_what_its_steps_computed(
        tmp_path, capsys):
    """Before issue 43 each step of this run made 5 host reads (under 2-process DDP 7, with 4 all-reduces, 4
    barriers and a broadcast)."""
    cli, counter, recorded = default_fit(tmp_path)
    steps = len(recorded.totals)
    assert steps == 22 and counter.logging == {10, 20}  # configs/trainer.yaml's log_every_n_steps
    quiet = [s for s in range(1, steps + 1) if s not in counter.logging]
    assert {s: counter.steps[s] for s in quiet if counter.steps[s]} == {}
    assert all(counter.steps[s] for s in counter.logging)  # what the logging steps read is counted

    loss, tokens, utterances = torch.stack(recorded.totals).T.tolist()
    with open(Path(cli.trainer.log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss_step") or r.get("train/loss_epoch")]
    logged = {int(r["step"]) + 1: float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")}
    assert logged == pytest.approx({10: sum(loss[:10]) / sum(tokens[:10]), 20: sum(loss[10:20]) / sum(tokens[10:20])})
    epoch = [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]
    per_update = [lo / t * u for lo, t, u in zip(loss, tokens, utterances)]
    assert epoch == pytest.approx([sum(per_update) / sum(utterances)])
    assert f"epoch 0: train/loss {sum(loss) / sum(tokens):.4f}" in capsys.readouterr().out


def nan_run(char_tokenizer, bad: set[int], every: int, fused: bool = True, **settings):
    """Fit a tiny module on 6 batches, those numbered in ``bad`` (0-based) of NaN audio, logging every ``every``
    updates; (module, trainer, SyncCounter, the first weight after each update)."""
    torch.manual_seed(0)
    module = ASRModule(tokenizer=char_tokenizer, encoder=encoder(d_model=16, n_heads=2, n_layers=1), inter_ctc=0.0,
                       spec_augment=None, optimizer=lambda p: torch.optim.AdamW(p, fused=fused), **settings)
    batches = []
    for i, texts in enumerate([["nine four", "two five"]] * 6):
        audio = torch.full((2, 16000), math.nan) if i in bad else torch.randn(2, 16000) * 0.1
        tokens = [torch.tensor(char_tokenizer.encode(t)) for t in texts]
        batches.append(Batch(audio, torch.tensor([16000, 14000]), torch.nn.utils.rnn.pad_sequence(tokens, True),
                             torch.tensor([len(t) for t in tokens]), texts))
    counter, weights = SyncCounter(), []
    keep = pl.callbacks.LambdaCallback(
        on_train_batch_end=lambda *_: weights.append(next(module.parameters()).detach().clone()))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=every, callbacks=[counter, keep],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    return module, trainer, counter, weights


def test_a_non_finite_update_is_skipped_on_the_device_and_said_at_the_next_logging_step(char_tokenizer, capsys):
    module, trainer, counter, weights = nan_run(char_tokenizer, bad={2}, every=5)
    assert all(not counter.steps[s] for s in (1, 2, 3, 4, 6))  # a skip needs no host read either
    assert torch.equal(weights[2], weights[1]) and not torch.equal(weights[3], weights[2])
    (state,) = [s for p, s in trainer.optimizers[0].state.items() if p is next(module.parameters())]
    assert state["step"] == 5  # 6 updates, one skipped: the fused step took found_inf and undid its count
    out = capsys.readouterr().out
    assert "steps 0-4: non-finite loss or gradient, update skipped on every rank (0 in a row, 1 in all)" in out
    assert trainer.callback_metrics["train/skipped_steps"] == 1


def test_an_optimizer_without_found_inf_reads_the_skip_flag_once_a_step(char_tokenizer):
    module, trainer, counter, weights = nan_run(char_tokenizer, bad={2}, every=5, fused=False)
    assert torch.equal(weights[2], weights[1])
    assert {s: [(what, where.split()[-1]) for what, where in counter.steps[s]] for s in (1, 2, 3, 4, 6)} == \
        {s: [("item", "skip_update")] for s in (1, 2, 3, 4, 6)}


def test_max_consecutive_skips_stop_the_run_at_the_next_logging_step(char_tokenizer):
    with pytest.raises(NonFiniteLossError, match=r"^2 updates in a row had a non-finite loss or gradient \(step 1\)"):
        nan_run(char_tokenizer, bad=set(range(6)), every=4, max_consecutive_skips=2)


@pytest.mark.gpu
def test_on_a_gpu_a_step_between_logging_steps_synchronizes_only_in_torchs_ctc_loss(tmp_path):
    """torch's CTC loss reads its lengths on the host and copies its plan to the device (forward and backward),
    which nothing in asr can avoid; a sync CUDA's debug mode sees anywhere else fails the test. How many the loss
    makes depends on torch's version and the batch (torch 2.11 on an H200: 20 a step in the default run, where a
    2-utterance call alone made 11), so the test checks where they come from, not their number."""
    ctc_places = ctc_sync_places()
    _, counter, _ = default_fit(tmp_path, "--trainer.accelerator", "gpu", "--trainer.devices", "1", cuda=True)
    quiet = [s for s in range(2, 23) if s not in counter.logging]  # step 1 makes the optimizer's state
    syncs = {s: [where for what, where in counter.steps[s] if what == "cuda sync"] for s in quiet}
    calls = {s: sum(what == "ctc_loss" for what, _ in counter.steps[s]) for s in quiet}
    assert all(calls[s] for s in quiet), calls  # the counter saw the loss
    assert {s: sorted(set(w) - ctc_places) for s, w in syncs.items()} == {s: [] for s in quiet}, syncs


def ctc_sync_places() -> set[str]:
    """Where (file:line) the syncs CUDA's debug mode sees in one forward and backward of asr's CTC loss happen."""
    log_probs = torch.randn(2, 30, 8, device="cuda", requires_grad=True)
    tokens, lengths = torch.ones(2, 5, dtype=torch.long, device="cuda"), torch.tensor([30, 20], device="cuda")
    token_lengths = torch.tensor([5, 3], device="cuda")
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            objectives.ctc_loss(log_probs.log_softmax(-1), lengths, tokens, token_lengths, "sum").backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    places = {f"{Path(w.filename).name}:{w.lineno}" for w in seen if "synchronizing" in str(w.message)}
    assert places, "CUDA's debug mode saw no sync in torch's CTC loss: the test's premise is gone"
    return places
