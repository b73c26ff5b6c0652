"""docs/scale-out.md's DDP and FSDP commands: between logging steps a training step reads nothing on the host
and enters only the two sums over ranks it needs, queued on the device (asr.intervals), counted on every
rank by tests.syncs.SyncCounter. Before issue 43 each step on rank 0 made 7 host reads, 4 all-reduces, 4 barriers
and a broadcast."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import MINI, REPO
from tests.cli import CHAR_FRAMES


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_distributed_step_between_logging_steps_only_queues_its_two_sums(strategy, tmp_path):
    for split, count in (("train", 60), ("dev", 2)):
        rows = [json.loads(line) for line in (MINI / f"{split}.jsonl").read_text().splitlines()[:count]]
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps(dict(r, audio_filepath=str(MINI / r["audio_filepath"]))) + "\n" for r in rows))
    counter = {"class_path": "tests.syncs.SyncCounter", "init_args": {"path": str(tmp_path / "syncs")}}
    command = [sys.executable, "-m", "asr.fit", "--config",
               f"configs/strategy/{strategy}.yaml", "--trainer.devices", "2", "--model.encoder.d_model", "32",
               "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2", "--data.tokenizer.type", "char", *CHAR_FRAMES,
               "--data.max_batch_seconds", "4", "--trainer.max_steps", "12", "--data.num_workers", "0",
               "--test", "false", "--data.train_manifest", str(tmp_path / "train.jsonl"),
               "--data.val_manifest", str(tmp_path / "dev.jsonl"), "--trainer.logger.init_args.save_dir",
               str(tmp_path), f"--trainer.callbacks+={json.dumps(counter)}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        report = json.loads((tmp_path / f"syncs.{rank}").read_text())
        assert report["logging"] == [10]
        calls = {step: [(what, where.split()[-1]) for what, where in report["steps"].get(str(step), [])]
                 for step in range(1, 13) if step != 10}
        assert calls == {step: [("all_reduce", "all_sum")] * 2 for step in calls}, rank
        assert report["steps"]["10"]  # the logging step reads
