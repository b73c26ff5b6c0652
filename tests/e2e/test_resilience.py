"""Runs that finish and tell the truth (issue #10): docs/scale-out.md's DDP, FSDP and torchrun commands finish
with the default progress bar and callbacks; SIGTERM / SIGUSR1 and kill -9 lose nothing but the steps
since the last checkpoint and resume exactly; a kill mid-write leaves the previous checkpoint; a rank
stuck past --collective_timeout ends the job naming rank and hook; NaN batches are skipped together.

Every run is a subprocess of ``python -m asr.fit`` in its own session, killed with its whole process
group if it outlives its timeout, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from asr.checkpoint import merge
from tests import MINI, REPO
from tests.cli import NO_AUGMENTATION
from tests.faults import signal_at
from tests.servers import free_port

SMALL = ["--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
         "--model.schedule.warmup_steps", "2", "--data.max_batch_seconds", "8"]
# no randomness left after the seed: a resumed run must then repeat the uninterrupted one exactly
DETERMINISTIC = ["--model.encoder.dropout", "0", "--model.encoder.attention_dropout", "0",
                 "--model.spec_augment", "null",
                 "--data.speed_perturb", "[1.0]", *NO_AUGMENTATION,
                 "--trainer.log_every_n_steps", "1", "--test", "false"]
STEP_CHECKPOINTS = '--trainer.callbacks+={"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", ' \
                   '"init_args": {"filename": "last", "save_top_k": 1, "enable_version_counter": false, ' \
                   '"every_n_train_steps": 2}}'
EPOCH_END_CHECKPOINTS = '--trainer.callbacks+={"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", ' \
                        '"init_args": {"filename": "end{epoch}", "auto_insert_metric_name": false, "save_top_k": -1, ' \
                        '"monitor": "epoch", "mode": "max", "save_on_train_epoch_end": true}}'


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    """28 training and 6 dev utterances of data/mini (4 steps per rank and epoch on 2 ranks, 7 on one)."""
    root = tmp_path_factory.mktemp("data")
    for split, count in (("train", 28), ("dev", 6)):
        rows = [json.loads(line) for line in (MINI / f"{split}.jsonl").read_text().splitlines()[:count]]
        rows = [dict(r, audio_filepath=str(MINI / r["audio_filepath"])) for r in rows]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--data.train_manifest", str(root / "train.jsonl"), "--data.val_manifest", str(root / "dev.jsonl"),
            "--data.test_manifest", str(root / "dev.jsonl")]


def run(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run to the end, or kill the whole process group at ``timeout`` seconds and fail; the returned
    ``pid`` names the group (its first process's id)."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{' '.join(command)} still running after {timeout} s; stderr:\n{err[-3000:]}")
    result = subprocess.CompletedProcess(command, process.returncode, out, err)
    result.pid = process.pid
    return result


def group_alive(pgid: int, seconds: float) -> bool:
    """Whether any process of group ``pgid`` is still there after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    return True


def fit(out: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    result = run([sys.executable, "-m", "asr.fit", *args, "--trainer.logger.init_args.save_dir", str(out)])
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def versions(out: Path) -> list[Path]:
    return sorted(out.glob("default/version_*"), key=lambda p: int(p.name.split("_")[1]))


def step_losses(out: Path) -> dict[int, float]:
    """train/loss_step by optimizer step over all the run's versions (a resumed run adds a version)."""
    losses = {}
    for version in versions(out):
        if (version / "metrics.csv").is_file():
            with open(version / "metrics.csv") as f:
                losses |= {int(r["step"]): float(r["train/loss_step"]) for r in csv.DictReader(f)
                           if r.get("train/loss_step")}
    return losses


def last_checkpoint(out: Path) -> dict:
    path = versions(out)[-1] / "checkpoints" / "last.ckpt"
    return merge(path) if path.is_dir() else torch.load(path, weights_only=True)  # the FSDP preset writes folders


def assert_same_run(resumed: Path, reference: Path, stopped_at: int) -> None:
    """Same losses at every step both logged, every step from ``stopped_at`` on logged again, same weights.
    (An interrupted run's last step is in its checkpoint but not in its metrics.csv.)"""
    ours, theirs = step_losses(resumed), step_losses(reference)
    assert {s: ours[s] for s in ours if s in theirs} == {s: theirs[s] for s in ours if s in theirs}
    assert set(ours) >= {s for s in theirs if s >= stopped_at} and len(ours) >= len(theirs) - stopped_at
    a, b = last_checkpoint(resumed), last_checkpoint(reference)
    assert a["global_step"] == b["global_step"]
    for name, value in b["state_dict"].items():
        torch.testing.assert_close(a["state_dict"][name], value, atol=0, rtol=0, msg=name)


STRATEGIES = {"single": [], "ddp": ["--config", "configs/strategy/ddp.yaml", "--trainer.devices", "2"],
              "fsdp": ["--config", "configs/strategy/fsdp.yaml", "--trainer.devices", "2"]}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_readme_scale_out_commands_finish_with_the_default_bar_and_callbacks(strategy, reference, data, tmp_path):
    """The deadlock of issue #10: rank 0's progress bar reduced an epoch metric while rank 1 was elsewhere. By
    epochs: the reference run below (2 epochs of 4 steps); by steps, ending mid-epoch: here."""
    folder, result = reference(strategy), reference.results[strategy]
    assert "Epoch 0" in result.stdout and "Epoch 1" in result.stdout  # the progress bar was on
    assert last_checkpoint(folder)["global_step"] == 8
    result = fit(tmp_path, *STRATEGIES[strategy], "--trainer.max_steps", "2", *SMALL, *data)
    assert "Epoch 0" in result.stdout
    assert last_checkpoint(tmp_path)["global_step"] == 2


def test_torchrun_two_nodes_of_one_process_train_and_leave_one_checkpoint(data, tmp_path):
    """docs/scale-out.md's torchrun line, as 2 nodes x 1 process on localhost with gloo."""
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank",
         str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "asr.fit", "--config",
         "configs/strategy/ddp.yaml", "--trainer.devices", "1", "--trainer.num_nodes", "2",
         "--trainer.max_epochs", "1", *SMALL, *data, "--trainer.logger.init_args.save_dir", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for rank in (0, 1)]
    try:
        results = [node.communicate(timeout=300) for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
        pytest.fail("torchrun nodes still running after 300 s")
    for node, (_, err) in zip(nodes, results):
        assert node.returncode == 0, err[-3000:]
    assert [p.name for p in tmp_path.rglob("last.ckpt")] == ["last.ckpt"]
    assert last_checkpoint(tmp_path)["global_step"] == 4


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """reference(strategy) -> folder of an uninterrupted deterministic 2-epoch run with the default progress bar and
    callbacks, and a checkpoint at each epoch's end (end0.ckpt, end1.ckpt), made once per strategy and module;
    ``reference.results[strategy]`` is its process' output."""
    made = {}

    def make(strategy: str) -> Path:
        if strategy not in made:
            made[strategy] = tmp_path_factory.mktemp(f"reference-{strategy}")
            make.results[strategy] = fit(made[strategy], *STRATEGIES[strategy], "--trainer.max_epochs", "2", *SMALL,
                                         *DETERMINISTIC, *data, EPOCH_END_CHECKPOINTS)
        return made[strategy]

    make.results = {}
    return make


@pytest.mark.parametrize("strategy, name, group", [("single", "SIGTERM", False), ("single", "SIGUSR1", False),
                                                   ("ddp", "SIGTERM", True), ("fsdp", "SIGTERM", False)])
def test_signal_mid_epoch_checkpoints_and_resume_repeats_the_uninterrupted_run(strategy, name, group, reference,
                                                                               data, tmp_path):
    """After step 2, rank 0 alone is signalled (as `kill PID` does), or with ``group`` every process,
    data workers included (as SLURM and a machine shutdown do); every rank stops after the same step,
    mid-epoch, and `--ckpt_path last` continues to the same losses and bit-identical weights."""
    args = [*STRATEGIES[strategy], "--trainer.max_epochs", "2", *SMALL, *DETERMINISTIC, *data]
    stopped = fit(tmp_path, *args, *signal_at(2, name, group))
    assert f"asr.fit: {name}: stopped after step 3 and wrote " in stopped.stderr
    checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["global_step"] == 3 and checkpoint["epoch"] == 0  # mid-epoch
    assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"]
    resumed = fit(tmp_path, *args, "--ckpt_path", "last")
    assert "--ckpt_path last: resuming from " in resumed.stdout + resumed.stderr
    assert_same_run(tmp_path, reference(strategy), stopped_at=3)


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_kill_9_loses_only_the_steps_since_the_last_step_checkpoint(strategy, reference, data, tmp_path):
    """Every rank is SIGKILLed after step 5; last.ckpt (every 2 steps here) holds step 4, and resuming
    from it repeats the uninterrupted run."""
    args = [*STRATEGIES[strategy], "--trainer.max_epochs", "2", *SMALL, *DETERMINISTIC, *data, STEP_CHECKPOINTS]
    killed = fit(tmp_path, *args, *signal_at(5, "SIGKILL", group=True), ok=False)
    assert killed.returncode == -signal.SIGKILL
    assert last_checkpoint(tmp_path)["global_step"] == 4
    fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(tmp_path, reference(strategy), stopped_at=4)


WRITER = """
import os, sys, time, torch
from asr.train.resilience import AtomicCheckpointIO

class Slow:  # pickling it stands for the minutes a large checkpoint takes to write
    def __reduce__(self):
        open(sys.argv[2], "w").close()
        time.sleep(60)
        return (int, (0,))

io = AtomicCheckpointIO()
io.save_checkpoint({"step": 1, "weights": torch.ones(1000)}, sys.argv[1])
io.save_checkpoint({"step": 2, "weights": torch.zeros(1000), "slow": Slow()}, sys.argv[1])
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    path, writing = tmp_path / "last.ckpt", tmp_path / "writing"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(writing)], cwd=REPO)
    deadline = time.monotonic() + 120
    while not writing.exists() and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    writer.kill()
    writer.wait()
    assert writing.exists(), "the second write never started"
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["step"] == 1 and torch.equal(checkpoint["weights"], torch.ones(1000))


HOLDS_WORKERS = """
import sys
from asr.data.datamodule import ASRDataModule
from asr.tokenizer import TokenizerConfig
data = ASRDataModule(sys.argv[1], sys.argv[2], None, tokenizer=TokenizerConfig(type="char"), num_workers=2, subsampling=4)
data.setup("fit")
LOADER = data.train_dataloader()  # a global, as a script or notebook holds it: its persistent workers live on
next(iter(LOADER))
print("read a batch", flush=True)
"""


def test_a_script_that_still_holds_its_data_workers_exits(data):
    """Data workers ignore SIGTERM (preemption), which multiprocessing's exit handler relies on; at exit they
    are killed instead of joined forever (this hung the suite's own interpreter after its last test)."""
    result = run([sys.executable, "-c", HOLDS_WORKERS, data[1], data[3]], timeout=120)
    assert result.returncode == 0 and "read a batch" in result.stdout, result.stderr[-3000:]
    assert not group_alive(result.pid, 5), "a data worker outlived the script"


def nan_corpus(root: Path, bad: int, count: int = 12) -> list[str]:
    """``count`` bundled utterances, the first ``bad`` of them rewritten as float WAVs so loud (1e36, finite:
    the data loader keeps them; NaN samples it would drop as broken files) that their features overflow."""
    rows = [json.loads(line) for line in (MINI / "train.jsonl").read_text().splitlines()[:count]]
    for i, row in enumerate(rows):
        row["audio_filepath"] = str(MINI / row["audio_filepath"])
        if i < bad:
            audio, rate = soundfile.read(row["audio_filepath"], dtype="float32")
            row["audio_filepath"] = str(root / f"loud{i}.wav")
            soundfile.write(row["audio_filepath"], audio * np.float32(1e36), rate, subtype="FLOAT")
    (root / "nan.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--data.train_manifest", str(root / "nan.jsonl"), "--data.val_manifest", str(root / "nan.jsonl")]


def test_a_nan_batch_is_skipped_on_both_ranks_and_counted(tmp_path):
    result = fit(tmp_path, *STRATEGIES["ddp"], "--trainer.max_epochs", "1", *SMALL, *DETERMINISTIC,
                 "--data.max_batch_seconds", "4", *nan_corpus(tmp_path, bad=1))
    assert "non-finite loss or gradient, update skipped on every rank (1 in a row, 1 in all)" in result.stdout
    with open(versions(tmp_path)[0] / "metrics.csv") as f:
        skipped = [float(r["train/skipped_steps"]) for r in csv.DictReader(f) if r.get("train/skipped_steps")]
    assert skipped[-1] == 1 and len(skipped) > 1  # counted, and the run went on
    weights = last_checkpoint(tmp_path)["state_dict"].values()
    assert all(torch.isfinite(w).all() for w in weights)  # the bad update never reached the weights


def test_consecutive_nan_batches_stop_the_run_with_a_message(tmp_path):
    result = fit(tmp_path, "--trainer.max_epochs", "1", "--model.max_consecutive_skips", "2", *SMALL,
                 "--data.max_batch_seconds", "8", *nan_corpus(tmp_path, bad=12), ok=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "asr.fit: error: 2 updates in a row had a non-finite loss or gradient")


def test_a_rank_stuck_past_the_collective_timeout_ends_the_job_naming_rank_and_hook(data, tmp_path):
    """Rank 1 sleeps 60 s in on_train_epoch_end; rank 0 gives up after 0.3 min in its next collective (the
    timeout also bounds the ranks' connection at start: 0.1 min was too short for it on a loaded CPU)."""
    stall = {"class_path": "tests.faults.SleepOnRank", "init_args": {"rank": 1, "seconds": 60}}
    result = fit(tmp_path, *STRATEGIES["ddp"], "--trainer.max_epochs", "2", *SMALL, *data, "--test", "false",
                 "--collective_timeout", "0.3", f"--trainer.callbacks+={json.dumps(stall)}", ok=False)
    assert result.returncode != 0
    assert "asr.fit: error: rank 0: a collective (all-reduce, broadcast or barrier) did not complete within " \
           "0.3 min in " in result.stderr
    if group_alive(result.pid, 15):  # rank 1 is stopped with the job, not left waiting out its own timeout
        os.killpg(result.pid, signal.SIGKILL)
        pytest.fail("a rank outlived the job that timed out")


def test_only_a_collective_that_timed_out_counts_as_one():
    from asr.train.resilience import is_collective_timeout

    assert is_collective_timeout(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms "
                                              "for recv operation to complete"))  # as gloo words it
    assert is_collective_timeout(torch.distributed.DistBackendError("Watchdog caught collective operation timeout"))
    assert not is_collective_timeout(RuntimeError("DataLoader worker (pid 12) timed out after 60 seconds"))



def test_a_sigterm_taken_by_lightning_before_training_started_still_stops_at_the_first_step():
    """Between Lightning's handler registration and on_train_start (restoring, building loaders) a
    SIGTERM lands in Lightning's flag; the preemption callback must honour it, not reset it."""
    from types import SimpleNamespace

    from asr.train.resilience import Preemption

    preemption = Preemption()
    loop = SimpleNamespace(epoch_loop=SimpleNamespace())
    preemption.on_train_start(SimpleNamespace(received_sigterm=True, global_step=7, fit_loop=loop), None)
    try:
        assert preemption.received == "SIGTERM"
    finally:
        preemption.on_train_end(None, None)
