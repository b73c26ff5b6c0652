"""Training from shards as the docs run it (python -m asr.shard, then python -m asr.fit --data.train_shards):
by steps, two DDP processes reading shards over https and s3 from servers on localhost, stopped by SIGTERM and
resumed, ending between validations with its last steps kept; a run not bounded by steps is refused in one line."""

from __future__ import annotations

import sys

import pytest

from asr.tools.shard import shard
from tests.data.test_shards import mini
from tests.cli import CHAR_FRAMES, one_line_refusal, refused
from tests.e2e.test_resilience import SMALL, last_checkpoint, run
from tests.faults import signal_at
from tests.servers import s3_server, web_server

STEPS = ["--trainer.max_steps", "5", "--trainer.val_check_interval", "3", "--data.max_batch_seconds", "8",
         "--data.max_duration", "8", "--test", "false",
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
        args = ["--config", "configs/recipes/demo.yaml", "--config", "configs/strategy/ddp.yaml", "--trainer.devices",
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
