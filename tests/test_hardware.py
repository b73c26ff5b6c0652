"""asr.hardware: precision "auto", threads and data workers chosen for the machine, and said once.

The step times of the run's model in each precision are injected (a model bf16 speeds up, one it slows down,
a tie, a CPU that emulates bf16), and so is a GPU's compute capability, so that every branch is tested on any
machine; tests/train/test_precision.py times real steps.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from asr.train import cost, precision

from asr import hardware
from asr.hardware import choose_precision, cpu_threads, data_workers, resolve_precision
from asr.train.fitting import ConfigError, Trainer, build, main

FAST_BF16 = {"32-true": 0.30, "bf16-mixed": 0.12}  # seconds a step: a model that bf16 speeds up (a preset on AMX)
SLOW_BF16 = {"32-true": 0.055, "bf16-mixed": 0.064}  # the default model on a Xeon with AMX (DESIGN.md, 2026-11-28)
EQUAL = {"32-true": 0.20, "bf16-mixed": 0.198}  # a tie within the timing's noise
EMULATED = {"32-true": 0.16, "bf16-mixed": float("inf")}  # an AVX2 CPU: bf16 not timed


def steps(times: dict[str, float]):
    return lambda: dict(times)


def test_a_model_whose_step_is_faster_in_bf16_trains_in_bf16_mixed_and_says_both_times():
    choice, why = choose_precision(False, cpu_steps=steps(FAST_BF16))
    assert choice == "bf16-mixed"
    assert "32-true 0.300 s, in bf16-mixed 0.120 s" in why and "timed on this model" in why


def test_a_model_whose_step_is_slower_in_bf16_trains_in_fp32_though_bf16_matmuls_are_fast():
    assert choose_precision(False, cpu_steps=steps(SLOW_BF16))[0] == "32-true"


def test_equal_step_times_go_to_fp32():
    assert choose_precision(False, cpu_steps=steps(EQUAL))[0] == "32-true"


def test_a_cpu_that_emulates_bf16_trains_in_fp32_and_says_so():
    choice, why = choose_precision(False, cpu_steps=steps(EMULATED))
    assert choice == "32-true" and "emulates bf16" in why and "0.160 s" in why


def test_cached_times_are_said_to_be_cached():
    assert "cached for this CPU and model" in choose_precision(False, cpu_steps=steps({**FAST_BF16, "cached": True}))[1]


def test_without_a_model_to_time_a_cpu_trains_in_fp32():
    assert choose_precision(False)[0] == "32-true"


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"),
                                                  ((8, 6), "bf16-mixed"), ((7, 5), "16-mixed"), ((7, 0), "16-mixed")])
def test_a_gpu_trains_in_bf16_from_ampere_else_fp16(capability, expected):
    def no_cpu():
        raise AssertionError("a GPU run timed the CPU")
    assert choose_precision(True, capability, cpu_steps=no_cpu)[0] == expected


def test_auto_on_a_cuda_machine_follows_the_accelerator():
    assert resolve_precision("auto", "auto", cuda=True, capability=(7, 0)) == "16-mixed"
    assert resolve_precision("auto", "cpu", cuda=True, cpu_steps=steps(FAST_BF16)) == "bf16-mixed"


def test_an_explicit_precision_is_obeyed_without_measuring():
    def no_timing():
        raise AssertionError("timed an explicit precision")
    assert resolve_precision("bf16-mixed", "cpu", cpu_steps=no_timing) == "bf16-mixed"
    assert resolve_precision("32-true", "auto", cpu_steps=no_timing) == "32-true"


def test_auto_says_its_choice_in_one_line():
    lines = []
    resolve_precision("auto", "cpu", lines.append, cuda=False, cpu_steps=steps(SLOW_BF16))
    assert lines == [lines[0]]
    assert lines[0].startswith("precision auto -> 32-true: a training step in 32-true 0.055 s, in bf16-mixed 0.064 s")


def test_the_trainer_resolves_auto_for_python_users_without_a_model():
    assert Trainer(accelerator="cpu", logger=False).precision == "32-true"


@pytest.mark.parametrize("times, expected", [(FAST_BF16, "bf16-mixed"), (SLOW_BF16, "32-true")])
def test_the_default_run_times_its_model_and_config_yaml_records_the_choice(tmp_path, monkeypatch, times, expected):
    timed = []
    monkeypatch.setattr(precision, "step_seconds", lambda module, batch, p: timed.append(p) or times[p])
    monkeypatch.setattr(cost, "cpu_peak_flops", {"fp32": 200e9, "bf16": 900e9}.get)  # bf16 units: both are timed
    monkeypatch.setattr(precision, "STEP_CACHE", tmp_path / "steps.json")
    monkeypatch.delenv(precision.INHERITED, raising=False)
    cli = main(["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.max_steps", "1", "--test", "false",
                "--trainer.enable_progress_bar", "false", "--data.num_workers", "0"])
    assert timed == ["32-true", "bf16-mixed"]
    assert cli.trainer.precision == expected
    assert yaml.safe_load((tmp_path / "default" / "version_0" / "config.yaml").read_text())["trainer"]["precision"] == expected


def test_an_explicit_precision_on_the_command_line_is_obeyed(monkeypatch):
    monkeypatch.setattr(precision, "step_seconds", lambda *args: pytest.fail("timed an explicit precision"))
    assert build(["--trainer.precision", "bf16-mixed"]).trainer.precision == "bf16-mixed"


def test_the_peak_cache_tells_kernels_apart(monkeypatch):
    """A bf16 rate measured with AVX512 kernels must not answer for a run under ONEDNN_MAX_CPU_ISA=AVX2."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    native = cost.cpu_kernels()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cost.cpu_kernels() != native and "AVX2" in cost.cpu_kernels()


def test_the_matmul_measurement_stops_at_its_budget(monkeypatch):
    """A CPU that emulates bf16 (2.5 s a product) must not spend half a minute measuring it: with a clock
    that says a second passes at every look, one timed product is all it takes."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(cost.time, "perf_counter", lambda: float(next(ticks)))
    assert cost.measure_matmul_flops(torch.float32, size=64, reps=1000, budget_s=1.0) == 2 * 64**3
    assert next(ticks) < 10  # 1000 products would have read the clock 3,000 times


@pytest.mark.parametrize("cores, on_gpu, processes, workers", [
    (2, False, 1, 1), (1, False, 1, 0), (16, False, 1, 1), (2, False, 2, 0),
    (16, True, 1, 8), (96, True, 8, 8), (16, True, 8, 1), (8, True, 8, 1)])
def test_data_workers_fit_the_machine(cores, on_gpu, processes, workers):
    assert data_workers(cores, on_gpu, processes) == workers


@pytest.mark.parametrize("cores, workers, threads", [(2, 1, 2), (1, 0, 1), (3, 1, 3), (4, 1, 3), (16, 1, 15)])
def test_cpu_threads_leave_the_workers_their_cores_from_four_up(cores, workers, threads):
    assert cpu_threads(cores, workers) == threads


def test_threads_auto_and_explicit(keep_threads):
    lines = []
    assert hardware.resolve_threads("auto", False, "auto", lines.append, cores=4) == 3
    assert torch.get_num_threads() == 3 and lines == ["threads auto -> 3 torch threads (1 data worker, 4 cores)"]
    assert hardware.resolve_threads(1, False, "auto") == 1 and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="--threads"):
        hardware.resolve_threads(0, False, "auto")


def test_a_bad_threads_value_is_one_line_naming_the_flag():
    with pytest.raises(ConfigError, match="--threads"):
        main(["--threads", "0"])
