"""Checkpoint size and save time of a model preset under configs/strategy/fsdp.yaml, 2 processes (gloo on a CPU):
rank 0 gathering one full file, each rank writing its shard, and that write in the background (the default).

    python -m asr.bench.checkpoints --config configs/model/xl.yaml
    python -m asr.bench.checkpoints --config configs/model/tiny.yaml --rounds 1   # a quick look

torchrun starts 2 processes of ``python -m asr.fit --config PRESET --config configs/strategy/fsdp.yaml``
(32-true, batches of 4 s); after its first optimizer step, when AdamW holds its moments,
each way saves ``last.ckpt`` ``--rounds`` times with ``trainer.save_checkpoint``, as ModelCheckpoint does, the rounds
after the first rewriting it. Per way, the median round of:
- blocked: how long save_checkpoint kept the slower rank from training (state dicts, gather, copy to CPU memory,
  and the write unless it is in the background);
- written: until the checkpoint is whole on disk under its name (in the background: save_checkpoint, then
  ShardedStrategy.wait_for_save, every rank);
- size: the file, or the folder's files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import pytorch_lightning as pl
import torch

from asr.train import fitting
from asr.train.fsdp import remove

WAYS = (("full file, rank 0 gathers", False, False), ("sharded folder", True, False),
        ("sharded folder, in the background", True, True))  # (name, save_distributed_checkpoint, async_save)
MODULE = "asr.bench.checkpoints"  # this file, also when it runs as __main__


class TimeSaves(pl.Callback):
    """After the first optimizer step, time every way of saving (WAYS), print the table on rank 0, stop the fit."""

    def __init__(self, rounds: int = 3):
        """
        Args:
            rounds: saves of each way; the table gives the median.
        """
        self.rounds = rounds

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.global_step < 1:
            return
        path = Path(trainer.log_dir) / "last.ckpt"
        rows = [self.measure(trainer, path, *way) for way in WAYS]
        if trainer.is_global_zero:
            parameters = sum(p.numel() for p in pl_module.parameters())
            print(f"\n{parameters / 1e6:.1f}M parameters, {trainer.world_size} processes, median of {self.rounds}")
            print("| way | size GB | blocked s | written s |\n|---|---|---|---|")
            print("\n".join(f"| {name} | {size / 1e9:.2f} | {blocked:.2f} | {written:.2f} |"
                            for name, size, blocked, written in rows))
        trainer.should_stop = True

    def measure(self, trainer: pl.Trainer, path: Path, name: str, sharded: bool, background: bool) -> tuple:
        strategy = trainer.strategy
        strategy._save_distributed_checkpoint, strategy.async_save = sharded, background
        blocked, written = [], []
        for _ in range(self.rounds):
            strategy.barrier()
            start = time.perf_counter()
            trainer.save_checkpoint(path, weights_only=False)
            blocked.append(slowest(strategy, time.perf_counter() - start))
            strategy.wait_for_save()
            strategy.barrier()
            written.append(slowest(strategy, time.perf_counter() - start))
        size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
        strategy.barrier()
        if trainer.is_global_zero:
            remove(path)
        return name, size, statistics.median(blocked), statistics.median(written)


def slowest(strategy, seconds: float) -> float:
    """The largest of every rank's ``seconds``."""
    return strategy.reduce(torch.tensor([seconds]), reduce_op="max").item()


def fit_args(config: str, rounds: int, out: str) -> list[str]:
    """asr.fit's arguments: the preset, FSDP, one step of 4 s batches, nothing else written."""
    callbacks = [{"class_path": f"{MODULE}.TimeSaves", "init_args": {"rounds": rounds}}]
    return ["--config", config, "--config", "configs/strategy/fsdp.yaml",
            "--trainer.precision", "32-true", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
            "--trainer.enable_checkpointing", "false",
            "--data.max_batch_seconds", "4", "--data.num_workers", "0", "--test", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.callbacks", json.dumps(callbacks),
            "--trainer.logger.init_args.save_dir", out]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.checkpoints", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/model/xl.yaml", help="the model preset")
    parser.add_argument("--rounds", type=int, default=3, help="saves of each way")
    parser.add_argument("--out", help="the run folder (default: a temporary one)")
    args = parser.parse_args(argv)
    if "LOCAL_RANK" in os.environ:  # one of torchrun's processes
        with mock.patch.object(sys, "argv", sys.argv[:1]):  # asr.fit's parser is given its arguments
            fitting.main(fit_args(args.config, args.rounds, args.out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", MODULE,
                   "--config", args.config, "--rounds", str(args.rounds), "--out", args.out or tmp]
        sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
