"""Checkpoints by minutes of training: ``TimedCheckpoint``, the third ModelCheckpoint of asr/configs/trainer.yaml.

Lightning's ModelCheckpoint(train_time_interval=...) broadcasts rank 0's decision at every training batch,
a collective and a device-to-host read in every step; a step cadence (every_n_train_steps) needs none, but
fits one machine only: 500 steps were 90 s of the CPU demo (0.174 s a step, docs/benchmarks.md 2026-11-26),
and a GPU steps faster with larger checkpoints. TimedCheckpoint asks the clock at every
``check_every_n_steps``-th step only, so a step without a log and without a checkpoint stays free of both.
"""

from __future__ import annotations

from pytorch_lightning.callbacks import ModelCheckpoint


class TimedCheckpoint(ModelCheckpoint):
    def __init__(self, *args, check_every_n_steps: int = 50, **kwargs):
        """As ModelCheckpoint, with ``train_time_interval`` asked at every ``check_every_n_steps``-th step."""
        super().__init__(*args, **kwargs)
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._train_time_interval is not None and trainer.global_step % self.check_every_n_steps:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
