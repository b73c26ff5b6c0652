"""TimedCheckpoint: last.ckpt by minutes, the clock asked (and broadcast) only every check_every_n_steps steps."""

import datetime
from types import SimpleNamespace
from unittest import mock

import pytest

from asr.train.cadence import TimedCheckpoint


def steps(callback, count):
    """The broadcasts and saves of ``count`` training batches, the clock always past the interval."""
    strategy = mock.Mock(broadcast=mock.Mock(side_effect=lambda decision: decision))
    trainer = SimpleNamespace(global_step=0, strategy=strategy)
    saves = []
    with mock.patch.object(TimedCheckpoint, "_should_skip_saving_checkpoint", return_value=False), \
            mock.patch.object(TimedCheckpoint, "_monitor_candidates", return_value={}), \
            mock.patch.object(TimedCheckpoint, "_save_last_checkpoint", lambda *a: saves.append(trainer.global_step)), \
            mock.patch.object(TimedCheckpoint, "_save_topk_checkpoint"), \
            mock.patch.object(TimedCheckpoint, "_should_save_on_train_epoch_end", return_value=True):
        for step in range(1, count + 1):
            trainer.global_step = step
            callback._last_time_checked = -1e9  # long ago: every look at the clock finds the interval passed
            callback.on_train_batch_end(trainer, mock.Mock(automatic_optimization=True), None, None, step)
    return strategy.broadcast.call_count, saves


def test_the_clock_is_asked_every_n_steps_and_the_checkpoint_follows_it():
    callback = TimedCheckpoint(filename="last", train_time_interval=datetime.timedelta(minutes=10),
                               check_every_n_steps=50)
    broadcasts, saves = steps(callback, 120)
    assert broadcasts == 2 and saves == [50, 100]


def test_a_step_cadence_is_left_as_lightning_has_it():
    broadcasts, saves = steps(TimedCheckpoint(filename="last", every_n_train_steps=30), 90)
    assert broadcasts == 0 and saves == [30, 60, 90]


def test_the_check_interval_must_be_positive():
    with pytest.raises(ValueError, match="check_every_n_steps must be >= 1"):
        TimedCheckpoint(train_time_interval=datetime.timedelta(minutes=1), check_every_n_steps=0)
