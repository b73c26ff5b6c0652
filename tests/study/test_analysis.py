"""The scaling study's numbers (asr/study/analysis.py) on known inputs: steps to convergence, the
power-law fit, the plateau, the GPU projection and the sentence that answers the study's question.
"""

from __future__ import annotations

import numpy as np
import pytest

from asr.study.analysis import (Target, answer, fit_power_law, gpu_step_seconds, plateau, smoothed,
                                steps_to_converge, stopped_early)


def test_fit_recovers_known_exponents_from_noisy_steps():
    rng = np.random.default_rng(0)
    a, k1, k2 = 5e4, 0.7, 0.35
    hours, params = np.meshgrid([0.5, 1.0, 2.0, 4.0], [2e5, 5e5, 1e6, 3e6, 1e7])
    hours, params = hours.ravel(), params.ravel()
    steps = a * hours**k1 / params**k2 * np.exp(rng.normal(0, 0.05, hours.size))  # 5% noise
    fit = fit_power_law(hours.tolist(), params.tolist(), steps.tolist())
    assert fit.k1 == pytest.approx(k1, abs=0.05)
    assert fit.k2 == pytest.approx(k2, abs=0.05)
    assert fit.a == pytest.approx(a, rel=0.5)  # log a carries the error of both slopes at log M ~ 14
    assert 0.95 < fit.r2 <= 1.0
    assert fit.steps(2.0, 1e6) == pytest.approx(a * 2.0**k1 / 1e6**k2, rel=0.1)


def test_fit_with_one_data_size_leaves_k1_unknown():
    fit = fit_power_law([1.0, 1.0, 1.0], [1e5, 1e6, 1e7], [1000.0, 500.0, 250.0])
    assert fit.k1 is None
    assert fit.k2 == pytest.approx(np.log(2) / np.log(10))
    assert fit.r2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2"):
        fit_power_law([1.0], [1e5], [100.0])


@pytest.mark.parametrize("losses, expected", [
    ([4.0, 3.0, 2.5, 2.02, 2.0], 400),  # monotone: 2.02 is within 1% of 2.0
    ([4.0, 3.0, 2.5, 2.03, 2.0], 500),  # 2.03 is not: the minimum itself
    ([4.0, 2.015, 2.6, 2.0, 2.4], 200),  # noisy: the first entry into the band counts, even if it leaves again
    ([5.0, 2.0, 3.0, 4.0, 6.0], 200),  # overfitting after the minimum
    ([3.0, 3.0, 3.0, 3.0, 3.0], 100),  # flat
])
def test_steps_to_within_one_percent_of_the_minimum(losses, expected):
    assert steps_to_converge([100, 200, 300, 400, 500], losses) == expected


def test_smoothing_keeps_a_lucky_dip_from_deciding_the_steps():
    steps = [100 * i for i in range(1, 12)]
    trend = [3.0, 2.0, 1.5, 1.2, 1.0, 0.9, 0.85, 0.82, 0.8, 0.8, 0.8]
    jitter = [0.0, 0.0, 0.0, 0.0, -0.25, 0.0, 0.05, -0.05, 0.05, -0.05, 0.05]  # a dip at step 500
    noisy = [t + j for t, j in zip(trend, jitter)]
    assert steps_to_converge(steps, noisy) == 500  # the raw curve: the dip is the minimum
    assert steps_to_converge(*smoothed(steps, noisy, 5)) == 900  # where the trend reaches its floor, 0.8
    assert smoothed(steps, noisy, 1) == (steps, noisy)
    assert smoothed([1, 2, 3, 4], [1.0, 2.0, 3.0, 5.0], 3) == ([2, 3], pytest.approx([2.0, 10 / 3]))
    assert smoothed([1, 2], [1.0, 2.0], 5) == ([1, 2], [1.0, 2.0])  # shorter than the window: as it is
    with pytest.raises(ValueError, match="odd number"):
        smoothed(steps, noisy, 4)


def test_smoothing_leaves_out_the_ends_where_the_window_does_not_fit():
    steps = [100 * i for i in range(1, 11)]
    losses = [3.0, 2.0, 1.0, 0.9, 0.9, 1.0, 1.1, 1.2, 1.3, 0.4]  # over-fitting, then one lucky last validation
    assert steps_to_converge(*smoothed(steps, losses, 5)) == 500  # not 1000, where a 3-wide end window is 0.967


def test_a_curve_has_converged_only_when_patience_validations_followed_its_minimum():
    assert stopped_early([3.0, 2.0, 1.0, 1.1, 1.2, 1.0], patience=3)  # a tie is no new minimum
    assert not stopped_early([3.0, 2.0, 1.0, 1.1, 1.2], patience=3)  # cut by max_steps two validations on
    assert not stopped_early([3.0, 2.0, 1.0], patience=1)  # still falling at the last validation


def test_steps_to_converge_refuses_mismatched_curves():
    with pytest.raises(ValueError, match="one loss per validation"):
        steps_to_converge([100, 200], [1.0])


def test_plateau_is_the_size_beyond_which_steps_stop_falling():
    params = [1e5, 3e5, 1e6, 3e6, 1e7]
    assert plateau(params, [1000, 600, 400, 390, 395]) == 1e6
    assert plateau(params, [1000, 800, 600, 450, 300]) is None  # still falling at the largest size
    assert plateau(params[::-1], [395, 390, 400, 600, 1000]) == 1e6  # order of the trials does not matter
    assert plateau([1e6], [400]) is None


def test_gpu_projection_uses_the_cost_table_and_names_an_unknown_gpu():
    a100 = Target("A100", mfu=0.5, devices=2, price_per_device_hour=2.0)
    assert gpu_step_seconds(312e12, a100, "bf16-mixed") == pytest.approx(312e12 / (312e12 * 0.5 * 2))
    slow = Target("A100", mfu=0.5, devices=2, step_overhead=0.02)
    assert gpu_step_seconds(312e12, slow, "bf16-mixed") == pytest.approx(1.02)
    assert gpu_step_seconds(19.5e12, Target("A100", mfu=1.0), "32-true") == pytest.approx(19.5 / 156)  # tf32
    with pytest.raises(ValueError, match="gpu.name 'Voodoo 2'"):
        gpu_step_seconds(1e12, Target("Voodoo 2"), "bf16-mixed")


def test_answer_names_the_soonest_size_here_and_on_the_gpu():
    rows = [{"fraction": f, "train_hours": f, "width": w, "depth": 2, "params": w * 1e4, "steps": s,
             "hours_here": here, "hours_gpu": gpu, "converged": True}
            for f, w, s, here, gpu in [(1.0, 64, 900, 0.5, 0.010), (1.0, 128, 500, 0.4, 0.012),
                                       (1.0, 256, 450, 0.9, 0.009), (0.5, 32, 10, 0.001, 0.0001)]]
    sentence = answer(rows, Target("H100"))
    assert "d_model 128 x 2 layers" in sentence.split("converges soonest on this machine")[0]
    assert "d_model 256 x 2 layers" in sentence.split("H100")[1]
    assert "0.5" not in sentence.split("(")[1].split(")")[0]  # the largest fraction, not the cheapest trial
