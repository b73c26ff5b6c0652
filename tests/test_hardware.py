"""asr.hardware: precision "auto", threads and data workers chosen for the machine, and said once.

The CPU's bf16 and fp32 rates are injected (a CPU whose bf16 is fast, one with AVX2 only), and so is
a GPU's compute capability, so that every branch is tested on any machine.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from asr.train import cost

from asr import hardware
from asr.hardware import choose_precision, cpu_threads, data_workers, resolve_precision
from asr.train.fit import ConfigError, Trainer, build, main

FAST_BF16 = {"fp32": 180e9, "bf16": 800e9}  # FLOP/s of the earlier sessions' 2-core Xeon (DESIGN.md)
SLOW_BF16 = {"fp32": 86e9, "bf16": 0.9e9}  # FLOP/s of an AVX2-only EPYC (issue 37)


def peaks(rates: dict[str, float]):
    return lambda dtype: rates[dtype]


def test_a_cpu_with_fast_bf16_trains_in_bf16_mixed_and_says_why():
    choice, why = choose_precision(False, cpu_peak=peaks(FAST_BF16))
    assert choice == "bf16-mixed"
    assert "bf16 matmul 800.0 GFLOP/s against fp32 180.0" in why


def test_a_cpu_without_bf16_hardware_trains_in_fp32():
    assert choose_precision(False, cpu_peak=peaks(SLOW_BF16))[0] == "32-true"


def test_bf16_barely_faster_than_fp32_is_not_worth_its_casts():
    assert choose_precision(False, cpu_peak=peaks({"fp32": 128e9, "bf16": 140e9}))[0] == "32-true"


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"),
                                                  ((8, 6), "bf16-mixed"), ((7, 5), "16-mixed"), ((7, 0), "16-mixed")])
def test_a_gpu_trains_in_bf16_from_ampere_else_fp16(capability, expected):
    def no_cpu(dtype):
        raise AssertionError("a GPU run measured the CPU")
    assert choose_precision(True, capability, cpu_peak=no_cpu)[0] == expected


def test_auto_on_a_cuda_machine_follows_the_accelerator():
    assert resolve_precision("auto", "auto", cuda=True, capability=(7, 0)) == "16-mixed"
    assert resolve_precision("auto", "cpu", cuda=True, cpu_peak=peaks(SLOW_BF16)) == "32-true"


def test_an_explicit_precision_is_obeyed_without_measuring(monkeypatch):
    monkeypatch.setattr(cost, "cpu_peak_flops", lambda dtype: pytest.fail("measured an explicit precision"))
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    assert resolve_precision("32-true", "auto") == "32-true"


def test_auto_says_its_choice_in_one_line():
    lines = []
    resolve_precision("auto", "cpu", lines.append, cuda=False, cpu_peak=peaks(SLOW_BF16))
    assert lines == [lines[0]] and lines[0].startswith("precision auto -> 32-true: bf16 matmul 0.9 GFLOP/s against fp32 86.0")


def test_the_trainer_resolves_auto_for_python_users(monkeypatch):
    monkeypatch.setattr(cost, "cpu_peak_flops", peaks(SLOW_BF16))
    assert Trainer(accelerator="cpu", logger=False).precision == "32-true"
    monkeypatch.setattr(cost, "cpu_peak_flops", peaks(FAST_BF16))
    assert Trainer(accelerator="cpu", logger=False).precision == "bf16-mixed"


@pytest.mark.parametrize("rates, expected", [(FAST_BF16, "bf16-mixed"), (SLOW_BF16, "32-true")])
def test_the_default_run_resolves_auto_and_config_yaml_records_the_choice(tmp_path, monkeypatch, rates, expected):
    monkeypatch.setattr(cost, "cpu_peak_flops", peaks(rates))
    cli = main(["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.max_steps", "1", "--test", "false",
                "--trainer.enable_progress_bar", "false", "--data.num_workers", "0"])
    assert cli.trainer.precision == expected
    assert yaml.safe_load((tmp_path / "default" / "version_0" / "config.yaml").read_text())["trainer"]["precision"] == expected


def test_an_explicit_precision_on_the_command_line_is_obeyed(monkeypatch):
    monkeypatch.setattr(cost, "cpu_peak_flops", peaks(SLOW_BF16))
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
