"""Measure the memory and speed levers on this machine and print ratios (no pass/fail).

    python -m asr.bench.scaling                          # small and base presets
    python -m asr.bench.scaling --presets tiny --rounds 2 --batch_seconds 16   # a quick look
    python -m asr.bench.scaling --compile                # also bf16-mixed with torch.compile

Models, trainer and precision are built by asr.fit's own builder, as ``python -m asr.fit --config
configs/model/<preset>.yaml --trainer.precision P --model.checkpoint_every K [--model.compile true]``
builds them (asr.bench.steps.build), with a character tokenizer of a few command words. One
training step is ASRModule's own (asr.bench.steps.plain_step: training_step, backward, its optimizer
and lr schedule, under the trainer's precision plugin) on a batch of ``--batch_seconds`` of audio at
the model's sample rate in utterances of ``--utterance_seconds``, as ``data.max_batch_seconds`` fills it.

- step time: every configuration of a preset lives in one process, and each round steps
  each configuration once, in an order that rotates from round to round. A ratio is taken
  inside each round (so a slow spell of the machine slows both of its sides) and the table
  gives the median over ``--rounds`` rounds and the lowest and highest round.
- recomputed share: the time of the forward passes activation checkpointing repeats (the
  subsampling convolutions and every block), as a share of the whole step without
  checkpointing, timed inside the same steps. Recomputing them cannot cost less, so
  1 + share is the lowest step-time ratio any full recomputation can reach.
- activation memory: the peak of the process's resident memory during a step, minus the
  resident memory before it (weights, gradients and optimizer state are allocated by the
  warm-up step, and here gradients are zeroed, not freed, after each step). glibc is told to return every large block at once
  (MALLOC_MMAP_THRESHOLD_), so resident memory follows live tensors; a thread samples
  /proc/self/statm every millisecond. That costs page faults, so memory is measured in
  a separate process per configuration (two at a time), and never timed.
- DDP: 2 processes (gloo, one thread each), each stepping on a batch like the single
  process's, so the throughput ratio is 2 x (single step time) / (DDP step time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from asr.bench.steps import build as build_cli
from asr.bench.steps import plain_step
from asr.data.batch import Batch
from asr.tokenizer import Tokenizer
from asr.train.fitting import ASRCLI

PAGE = os.sysconf("SC_PAGE_SIZE")
TEXT = "call five two nine enter number oh seven go left erase three repeat stop"
# name: (trainer.precision, model.checkpoint_every, model.compile)
CONFIGS = {"bf16-mixed": ("bf16-mixed", 0, False), "bf16-mixed, checkpoint_every 1": ("bf16-mixed", 1, False),
           "32-true": ("32-true", 0, False), "bf16-true": ("bf16-true", 0, False)}
COMPILED = {"bf16-mixed, compile": ("bf16-mixed", 0, True)}  # with --compile


def configurations(args) -> dict:
    return CONFIGS | (COMPILED if args.compile else {})


def build(preset: str, precision: str, checkpoint_every: int, compile: bool, args) -> tuple[ASRCLI, Batch]:
    """(model, data and trainer as asr.fit builds them for the preset and these settings, a batch for it)."""
    cli = build_cli(preset, f"--data.tokenizer.model={args.tokenizer_model}", f"--trainer.precision={precision}",
                    f"--model.checkpoint_every={checkpoint_every}", f"--model.compile={str(compile).lower()}")
    return cli, batch(args, cli)


def stepper(preset: str, precision: str, checkpoint_every: int, compile: bool, args, keep_gradients: bool = False):
    """(module, step(batch) of it, the batch)."""
    cli, data = build(preset, precision, checkpoint_every, compile, args)
    return cli.model, plain_step(cli, total_steps=10**6, keep_gradients=keep_gradients), data


def batch(args, cli: ASRCLI) -> Batch:
    """``--batch_seconds`` of noise in utterances of ``--utterance_seconds`` at the model's rate, with token ids."""
    n = max(1, int(args.batch_seconds // args.utterance_seconds))
    samples = int(args.utterance_seconds * cli.model.model.sample_rate)
    tokens = int(args.utterance_seconds * 12)  # ~12 characters a second, well inside CTC's reach
    generator = torch.Generator().manual_seed(0)
    vocab = cli.model.tokenizer.vocab_size
    return Batch(torch.randn(n, samples, generator=generator) * 0.1, torch.full((n,), samples),
                 torch.randint(2, vocab, (n, tokens), generator=generator), torch.full((n,), tokens), [TEXT] * n)


class ForwardClock:
    """Seconds spent in the forward passes of ``modules`` since the last ``take()``."""

    def __init__(self, modules):
        self.seconds, self.start = 0.0, 0.0
        for module in modules:
            module.register_forward_pre_hook(self.begin)
            module.register_forward_hook(self.end)

    def begin(self, *_):
        self.start = time.perf_counter()

    def end(self, *_):
        self.seconds += time.perf_counter() - self.start

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def timed(step, data: Batch) -> float:
    start = time.perf_counter()
    step(data)
    return time.perf_counter() - start


def run_times(args) -> dict:
    """All configurations of one preset in this process, interleaved: per configuration its step time in each round."""
    configs = configurations(args)
    steps = {name: stepper(args.preset, *config, args) for name, config in configs.items()}
    plain = steps["bf16-mixed"][0].model
    clock = ForwardClock([plain.encoder.subsampling, *plain.encoder.blocks])
    times = {name: [] for name in configs} | {"recomputed": []}
    for round_ in range(args.warmup + args.rounds):
        names = list(configs)[round_ % len(configs):] + list(configs)[:round_ % len(configs)]
        for name in names:
            _, step, data = steps[name]
            seconds = timed(step, data)
            if round_ >= args.warmup:
                times[name].append(seconds)
                if name == "bf16-mixed":
                    times["recomputed"].append(clock.take())
            clock.take()
    return times


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler:
    """Highest resident memory seen while the context is open, sampled every millisecond."""

    def __enter__(self):
        self.peak, self.running = resident(), True
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while self.running:
            self.peak = max(self.peak, resident())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


def run_memory(args) -> dict:
    """One configuration in this process: the highest activation memory of 2 steps after a warm-up."""
    _, step, data = stepper(args.preset, args.precision, args.checkpoint_every, args.compile_blocks, args,
                            keep_gradients=True)
    step(data)  # warm-up: allocates gradients (kept, zeroed) and optimizer state
    peaks = []
    for _ in range(2):
        before = resident()
        with PeakSampler() as sampler:
            step(data)
        peaks.append(sampler.peak - before)
    return {"activation_mb": max(peaks) / 2**20}


def run_ddp_rank(rank: int, args, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    cli, data = build(args.preset, "bf16-mixed", 0, False, args)
    cli.model.model = torch.nn.parallel.DistributedDataParallel(cli.model.model)
    step = plain_step(cli, total_steps=10**6)
    times = [timed(step, data) for _ in range(args.warmup + args.rounds)][args.warmup:]
    if rank == 0:
        results.put(times)
    torch.distributed.destroy_process_group()


def run_ddp(args) -> dict:
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = 29500 + os.getpid() % 1000
    torch.multiprocessing.start_processes(run_ddp_rank, args=(args, port, results), nprocs=2, start_method="spawn")
    return {"ddp": results.get()}


def child(args, mode: str, env: dict | None = None, precision: str = "bf16-mixed", checkpoint_every: int = 0,
          compile_blocks: bool = False) -> dict:
    """Run one measurement in a fresh process and return its JSON line."""
    command = [sys.executable, "-m", "asr.bench.scaling", "--child", mode, "--presets", args.preset, "--precision", precision,
               "--checkpoint_every", str(checkpoint_every), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--batch_seconds", str(args.batch_seconds), "--utterance_seconds", str(args.utterance_seconds),
               "--tokenizer_model", args.tokenizer_model,
               *(["--compile"] if args.compile else []), *(["--compile_blocks"] if compile_blocks else [])]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], unit: str = "") -> str:
    """median (lowest-highest)."""
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def report(args) -> list[str]:
    times = child(args, "times")
    times |= child(args, "ddp")
    low_memory = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    configs = configurations(args)
    with ThreadPoolExecutor(2) as pool:  # memory is never timed: two processes at a time, each its own resident memory
        measured = {name: pool.submit(child, args, "memory", low_memory, *config) for name, config in configs.items()}
        memory = {name: future.result()["activation_mb"] for name, future in measured.items()}
    rows = [f"| {args.preset} | {name} | {spread(times[name])} | {memory[name]:.0f} |" for name in configs]
    rows.append(f"| {args.preset} | DDP, 2 processes, each a batch like the above | {spread(times['ddp'])} | |")

    def ratio(top: str, bottom: str, scale: float = 1.0) -> list[float]:
        return [scale * a / b for a, b in zip(times[top], times[bottom])]

    plain, ckpt = "bf16-mixed", "bf16-mixed, checkpoint_every 1"
    single = statistics.median(times[plain])
    figures = [
        ("checkpointing: activation memory saved", f"{1 - memory[ckpt] / memory[plain]:.0%}"),
        ("checkpointing: step time with / without", spread(ratio(ckpt, plain), "x")),
        ("checkpointing: lowest possible ratio, 1 + recomputed share", spread(
            [1 + r for r in ratio("recomputed", plain)], "x")),
        ("bf16-mixed speed-up over 32-true", spread(ratio("32-true", plain), "x")),
        ("bf16-true speed-up over 32-true", spread(ratio("32-true", "bf16-true"), "x")),
        ("DDP 2 processes: throughput / 1 process", spread([2 * single / t for t in times["ddp"]], "x")),
    ]
    if args.compile:
        figures.append(("torch.compile speed-up (bf16-mixed)", spread(ratio(plain, "bf16-mixed, compile"), "x")))
    return rows + [f"| {args.preset} | {name} | {value} | |" for name, value in figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="small,base", help="comma-separated configs/model presets")
    parser.add_argument("--batch_seconds", type=float, default=60.0, help="audio per batch (data.max_batch_seconds)")
    parser.add_argument("--utterance_seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (each steps every configuration once)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--compile", action="store_true", help="also time bf16-mixed with --model.compile true")
    parser.add_argument("--child", choices=["times", "memory", "ddp"], help=argparse.SUPPRESS)  # internal
    parser.add_argument("--compile_blocks", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="bf16-mixed", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint_every", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer_model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.preset = args.presets
        print(json.dumps({"times": run_times, "memory": run_memory, "ddp": run_ddp}[args.child](args)))
        return
    print(f"batch: {args.batch_seconds:g} s of audio in {args.utterance_seconds:g} s utterances; median "
          f"(lowest-highest) of {args.rounds} rounds after {args.warmup}; torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores")
    print("| preset | configuration | step s, or ratio | activation MB |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        args.tokenizer_model = str(Path(tmp) / "tokenizer.model")
        Tokenizer.train([TEXT]).save(args.tokenizer_model)
        for preset in args.presets.split(","):
            args.preset = preset
            print("\n".join(report(args)), flush=True)


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
