"""Resume from a checkpoint written at an epoch's end or by the step-interval callback, with and without
``max_steps`` (issue 44): the resumed run trains exactly the steps the uninterrupted one would have, to the
same per-step losses and weights; a run with nothing left to train says so and exits 0.

Runs are subprocesses of ``python -m asr.fit`` with a timeout (tests.e2e.test_resilience.run), on the same
28-utterance slice of data/mini as the preemption tests.
"""

from __future__ import annotations

import pytest
import torch

from tests.e2e.test_resilience import (DETERMINISTIC, SMALL, STEP_CHECKPOINTS, STRATEGIES,  # noqa: F401
                                       assert_same_run, data, fit, last_checkpoint, reference)
from tests.faults import signal_at


@pytest.mark.parametrize("strategy, max_steps", [("single", []), ("single", ["--trainer.max_steps", "100"]),
                                                 ("ddp", ["--trainer.max_steps", "100"])])
def test_resume_from_an_epoch_end_checkpoint_trains_the_next_epoch(strategy, max_steps, reference, data, tmp_path):
    """The 2-epoch reference run keeps the checkpoint written at epoch 0's end (as last.ckpt is); a run resumed from
    it trains epoch 1 to the uninterrupted run's losses and weights, also with max_steps set (issue 44: it trained
    nothing)."""
    args = [*STRATEGIES[strategy], "--trainer.max_epochs", "2", *SMALL, *DETERMINISTIC, *data]
    (end0,) = reference(strategy).glob("default/version_0/checkpoints/end0.ckpt")
    first = torch.load(end0, weights_only=True)
    assert first["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1  # written at the epoch's end
    resumed = tmp_path / "resumed"
    fit(resumed, *args, *max_steps, "--ckpt_path", str(end0))
    assert last_checkpoint(resumed)["global_step"] == 2 * first["global_step"] == last_checkpoint(reference(strategy))["global_step"]
    assert_same_run(resumed, reference(strategy), stopped_at=first["global_step"])


def test_resume_from_a_step_interval_checkpoint_with_max_steps_repeats_the_run(reference, data, tmp_path):
    """Killed after step 5 (last.ckpt every 2 steps holds step 4); resumed with max_steps above the run's end."""
    args = [*SMALL, *DETERMINISTIC, *data, STEP_CHECKPOINTS, "--trainer.max_epochs", "2"]
    fit(tmp_path, *args, *signal_at(5, "SIGKILL", group=True), ok=False)
    assert last_checkpoint(tmp_path)["global_step"] == 4
    fit(tmp_path, *args, "--trainer.max_steps", "100", "--ckpt_path", "last")
    assert_same_run(tmp_path, reference("single"), stopped_at=4)


@pytest.mark.parametrize("limit", ["max_steps", "max_epochs"])
def test_a_resumed_run_with_nothing_left_says_so_and_tests_nothing(limit, data, tmp_path):
    args = [*SMALL, *DETERMINISTIC, *data]
    fit(tmp_path, *args, "--trainer.max_epochs", "1")
    steps = last_checkpoint(tmp_path)["global_step"]
    value, holds = (steps, f"holds step {steps}") if limit == "max_steps" else (1, "finished epoch 0")
    again = fit(tmp_path, *args, f"--trainer.{limit}", str(value), "--test", "true", "--ckpt_path", "last")
    output = again.stdout + again.stderr
    assert f"asr.fit: already at {limit} {value} (the checkpoint {holds}): nothing to train" in output, output[-2000:]
    assert "test/wer" not in output and "Epoch 1" not in output
    assert last_checkpoint(tmp_path)["global_step"] == steps and len(list(tmp_path.glob("default/version_*"))) == 1
