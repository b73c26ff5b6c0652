"""What this machine is good at: precision, torch threads and data workers, chosen once at start-up.

``trainer.precision: auto`` (asr.fit.Trainer's default, so the default run's and the study's; the recipes say
it) resolves here:

- a CUDA GPU: ``bf16-mixed`` from compute capability 8.0 (A100, H100, L4, RTX 30xx/40xx), else
  ``16-mixed`` (V100, T4), fp16 with Lightning's loss scaler;
- a CPU: the faster of ``32-true`` and ``bf16-mixed`` for the run's own model, by the seconds of its optimizer
  steps timed in each (asr.train.precision: cached per CPU, kernels, threads and model shape, and handed to
  the ranks the run starts). bf16-mixed must be ``BF16_MIN_GAIN`` faster to be chosen: it rounds activations,
  so a tie goes to fp32. A matrix product is no witness: on a Xeon with AMX a 1024^3 bf16 product ran 4.6x
  fp32's while the default model trained 16% slower in bf16-mixed; on AVX2 CPUs bf16 is emulated, 100-300x
  slower (docs/benchmarks.md). Without a model to time (``Trainer(precision="auto")`` from Python) a CPU
  trains in 32-true.

``--threads auto`` and ``--data.num_workers auto`` split the cores between the training step's torch threads
and the DataLoader workers that read and augment audio (see ``cpu_threads`` and ``data_workers``).
Each choice is said once, in one line, and an explicit value is obeyed as given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Literal

import torch

AUTO = "auto"
Auto = Literal["auto"]
CACHE_DIR = Path(os.environ.get("ASR_CACHE_DIR") or Path.home() / ".cache" / "asr")  # measurements reused across runs
BF16_MIN_GAIN = 1.05  # bf16-mixed's steps must be this much faster than fp32's: it rounds activations, so near-ties
                      # (within the 3-7% that two timings of one step differ by) go to fp32
BF16_EMULATED = 0.25  # a bf16 matmul below this share of fp32's speed has no bf16 units behind it (0.003 on AVX2)
MIN_BF16_CAPABILITY = (8, 0)  # Ampere: the first NVIDIA GPUs with bf16 tensor cores
MAX_GPU_WORKERS = 8  # per GPU process: each worker holds its own copy of the dataset and audio cache; not yet measured
                     # against a GPU's appetite (issue 43)


def uses_cuda(accelerator: str, cuda: bool | None = None) -> bool:
    """Whether ``trainer.accelerator`` runs on a CUDA GPU here (``cuda``: whether this machine has one)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return cuda and str(accelerator) in ("auto", "gpu", "cuda")


def emulates_bf16(fp32: float, bf16: float) -> bool:
    """Whether a CPU whose matmuls run at these FLOP/s has no bf16 units: each bf16 step would take minutes."""
    return bf16 < BF16_EMULATED * fp32


def choose_precision(on_gpu: bool, capability: tuple[int, int] | None = None,
                     cpu_steps: Callable[[], dict[str, float]] | None = None) -> tuple[str, str]:
    """(precision, why) for ``trainer.precision: auto``.

    ``capability``: the GPU's compute capability (default: CUDA device 0's); ``cpu_steps()``: seconds of one
    training step of the run's model in "32-true" and "bf16-mixed" on this CPU (inf: not timed, this CPU
    emulates bf16; "cached": True if read from the cache), as asr.train.precision.measured_steps gives them;
    None: no model to time. Tests inject both.
    """
    if on_gpu:
        major, minor = capability or torch.cuda.get_device_capability()
        if (major, minor) >= MIN_BF16_CAPABILITY:
            return "bf16-mixed", f"this GPU (compute capability {major}.{minor}) has bf16 tensor cores"
        return "16-mixed", f"this GPU (compute capability {major}.{minor}, below 8.0) has no bf16: fp16 with a loss scaler"
    if cpu_steps is None:
        return "32-true", "a CPU, and no model to time in bf16 (asr.fit times the run's model)"
    steps = cpu_steps()
    fp32, bf16 = steps["32-true"], steps["bf16-mixed"]
    choice = "bf16-mixed" if bf16 * BF16_MIN_GAIN <= fp32 else "32-true"
    source = "cached for this CPU and model" if steps.get("cached") else "timed on this model"
    if bf16 == float("inf"):
        return choice, f"this CPU emulates bf16 (its bf16 matmuls are 100x slower); a step in 32-true {fp32:.3f} s"
    return choice, (f"a training step in 32-true {fp32:.3f} s, in bf16-mixed {bf16:.3f} s ({source}; "
                    f"bf16-mixed needs {BF16_MIN_GAIN}x)")


def resolve_precision(precision, accelerator: str, say: Callable[[str], None] | None = None, **inject):
    """``precision`` itself, unless it is "auto": then the choice for this machine, said through ``say``."""
    if precision != AUTO:
        return precision
    choice, why = choose_precision(uses_cuda(accelerator, inject.pop("cuda", None)), **inject)
    if say:
        say(f"precision auto -> {choice}: {why}")
    return choice


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity: taskset, cgroups' cpusets), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def data_workers(cores: int, on_gpu: bool, processes: int = 1) -> int:
    """DataLoader workers for each of ``processes`` training processes on a machine of ``cores``.

    A GPU process needs the CPU only to launch kernels, so its share of the cores, less one for itself,
    reads and augments audio (up to MAX_GPU_WORKERS). A CPU process trains on the cores itself: one worker
    keeps reading and augmentation off the step (the loader in the main process was no faster on 2 cores,
    docs/benchmarks.md), and a process with a single core has none to spare.
    """
    share = max(1, cores // processes)
    if on_gpu:
        return max(1, min(MAX_GPU_WORKERS, share - 1))
    return 1 if share >= 2 else 0


def cpu_threads(cores: int, workers: int) -> int:
    """Torch threads of a CPU training process with ``cores`` to itself: all of them up to 3 cores, else all
    but one per data worker. On 2 cores one thread and two trained the default run equally fast (0.17-0.26 s
    a step either way, natively and under AVX2: docs/benchmarks.md 2026-11-26), so torch's own default stays there. From 4 cores up
    (argued, not measured here) a worker that takes a core from one of the step's threads stalls the others
    at their next barrier, so the workers get cores of their own."""
    return max(1, cores - workers) if cores >= 4 else cores


def resolve_threads(threads: int | str, on_gpu: bool, workers: int | str,
                    say: Callable[[str], None] | None = None, cores: int | None = None) -> int:
    """Set and return torch's intra-op threads: ``threads``, or with "auto" the choice for this machine."""
    cores = usable_cores() if cores is None else cores
    if threads == AUTO:
        if on_gpu:  # the step runs on the GPU; Lightning's DDP gives each process its share of the cores
            threads = torch.get_num_threads()
        else:
            workers = data_workers(cores, on_gpu) if workers == AUTO else int(workers)
            threads = cpu_threads(cores, workers)
            if say:
                say(f"threads auto -> {threads} torch threads ({workers} data worker{'s' if workers != 1 else ''}, {cores} cores)")
    if int(threads) < 1:
        raise ValueError(f"--threads must be 'auto' or at least 1, got {threads}")
    torch.set_num_threads(int(threads))
    return int(threads)
