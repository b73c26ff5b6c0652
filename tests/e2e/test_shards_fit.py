"""Training from shards as the docs run it (python -m asr.shard, then python -m asr.fit --data.train_shards):
by steps, two DDP processes reading shards over https and s3 from servers on localhost, stopped by SIGTERM and
resumed, ending between validations with its last steps kept; a run not bounded by steps is refused in one line.
A stream that cannot make progress (issue 61) stops the run with a message naming the shards, after last.ckpt:
a server that stops answering, a SIGTERM meanwhile, and two ranks whose every shard is unreadable."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from asr.tools.sharding import shard
from tests.cli import CHAR_FRAMES, one_line_refusal, refused
from tests.data.test_shards import mini
from tests import REPO
from tests.e2e.test_resilience import SMALL, last_checkpoint, run
from tests.faults import signal_at
from tests.servers import s3_server, web_server

STEPS = ["--trainer.max_steps", "5", "--trainer.val_check_interval", "3", "--data.max_batch_seconds", "8",
         "--data.filter.max_duration", "8", "--test", "false",
         "--trainer.log_every_n_steps", "1"]  # several ranks hear a SIGTERM at logging steps (asr.train.resilience)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 bundled utterances in 8 shards of 5 (enough for 2 ranks x 2 workers), and 6 dev lines."""
    tmp = tmp_path_factory.mktemp("shards")
    shard(tmp / "train", [str(mini(tmp, 40))], shard_size=5, tokenizer_type="char")
    return tmp / "train", mini(tmp, 6, "dev.jsonl", start=600)


def fit(out, *args: str, ok: bool = True):
    """python -m asr.fit in its own process group, killed at a timeout; its environment is this process' (the
    servers' addresses and credentials). The shards hold characters: the 40 ms front end (CHAR_FRAMES) after ``args``."""
    result = run([sys.executable, "-m", "asr.fit", *args, *CHAR_FRAMES, "--trainer.logger.init_args.save_dir", str(out)])
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("server", ["s3"])  # https too, once by hand (docs/benchmarks.md)
def test_two_ranks_train_from_served_shards_stop_on_sigterm_and_resume(server, corpus, tmp_path):
    train, dev = corpus
    with (web_server(train.parent) if server == "https" else s3_server(train)) as (address, _):
        shards = f"{address}/{train.name}" if server == "https" else address
        args = ["--config", "configs/strategy/ddp.yaml", "--trainer.devices",
                "2", *SMALL, *STEPS, "--data.train_shards", shards, "--data.val_manifest", str(dev)]
        stopped = fit(tmp_path, *args, *signal_at(2, "SIGTERM"))
        assert "asr.fit: SIGTERM: stopped after step 3 and wrote " in stopped.stderr
        assert f"data.train_shards {shards}: 8 shards, 40 utterances" in stopped.stdout + stopped.stderr
        assert last_checkpoint(tmp_path)["global_step"] == 3
        resumed = fit(tmp_path, *args, "--ckpt_path", "last")
    said = resumed.stdout + resumed.stderr
    assert "data.train_shards: resumed at step 3; the shards' order and buckets are drawn anew" in said
    # step 5 is no validation step and the stream's epoch never ends: last.ckpt is written at the end all the same
    assert last_checkpoint(tmp_path)["global_step"] == 5


def test_a_run_from_shards_without_a_step_bound_is_refused_in_one_line(corpus, tmp_path):
    train, dev = corpus
    args = ["--data.train_shards", str(train), "--data.val_manifest", str(dev), *CHAR_FRAMES,
            "--trainer.logger.init_args.save_dir", str(tmp_path)]
    one_line_refusal(refused(*args), "data.train_shards streams without end: set --trainer.max_steps")
    assert "set --trainer.val_check_interval to a number of steps" in refused(*args, "--trainer.max_steps", "4")


def served_fit_args(train, dev, address: str, *args: str) -> list[str]:
    """One process training from ``train``'s shards at ``address`` for up to 500 steps, in fp32 (no precision probe:
    the stream's own batches are what is tested)."""
    return [*SMALL, "--data.filter.max_duration", "8", "--test", "false",
            "--trainer.max_steps", "500", "--trainer.val_check_interval", "400", "--trainer.precision", "32-true",
            "--data.train_shards", f"{address}/{train.name}", "--data.val_manifest", str(dev), *args]


def test_a_server_that_stops_answering_stops_the_run_in_stall_seconds_after_last_ckpt(corpus, tmp_path):
    train, dev = corpus
    with web_server(train.parent, answers=2) as (address, _):  # each file twice: the third pass gets no answer
        result = fit(tmp_path, *served_fit_args(train, dev, address, "--data.shards.stall_seconds", "5"), ok=False)
    assert result.returncode == 1, result.stderr[-3000:]
    said = result.stderr[result.stderr.index("asr.fit: error: "):]
    assert said.startswith("asr.fit: error: data.train_shards: no training batch for 5 s (--data.shards.stall_seconds "
                           f"5):\n  worker 0 has been reading {address}/{train.name}/recording.0000"), said
    steps = last_checkpoint(tmp_path)["global_step"]
    assert steps > 0 and f"last.ckpt at step {steps} before stopping" in result.stdout + result.stderr


def test_sigterm_while_the_stream_waits_for_a_server_writes_last_ckpt_and_exits(corpus, tmp_path):
    train, dev = corpus
    hung = threading.Event()
    with web_server(train.parent, answers=2, hung=hung) as (address, _):
        command = [sys.executable, "-m", "asr.fit", *served_fit_args(train, dev, address), *CHAR_FRAMES,
                   "--trainer.logger.init_args.save_dir", str(tmp_path)]  # no stall limit but the default 600 s
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            assert hung.wait(240), "the run never began a third pass"
            time.sleep(3)  # the batches read before are trained on: the run waits for the server
            process.send_signal(signal.SIGTERM)  # as `kill PID`
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-3000:]
    steps = last_checkpoint(tmp_path)["global_step"]
    assert steps > 0 and f"asr.fit: SIGTERM: stopped after step {steps} and wrote " in err


def test_two_ranks_whose_every_shard_is_unreadable_both_stop_naming_their_shards(corpus, tmp_path):
    train, dev = corpus
    broken = tmp_path / "broken"
    shutil.copytree(train, broken)
    for tar in broken.glob("recording.*.tar"):
        tar.write_bytes(bytes(range(256)) * (tar.stat().st_size // 256))
    args = ["--config", "configs/strategy/ddp.yaml", "--trainer.devices", "2",
            *SMALL, *STEPS, "--trainer.precision", "32-true", "--data.filter.max_dropped_share", "1.0",
            "--data.train_shards", str(broken), "--data.val_manifest", str(dev)]
    result = fit(tmp_path / "runs", *args, ok=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("asr.fit: error: data.train_shards on rank 0: ") == 2, result.stderr[-3000:]  # both
    for rank in (0, 1):
        assert f"data.train_shards on rank {rank}: every shard that its reader read in a whole pass failed" in \
            result.stderr
    assert result.stderr.count(": shard unreadable after 3 tries, its last 5 utterances skipped: ReadError") >= 8
