"""Measure the memory and speed levers on this machine and print ratios (no pass/fail).

    python scripts/bench_scaling.py                          # small and base presets, 3 min 13 s on 2 cores
    python scripts/bench_scaling.py --presets tiny --steps 2 --batch_seconds 16   # a quick look

For each model preset (configs/model/<preset>.yaml) one training step is forward, CTC loss,
backward and an AdamW step on a batch of ``--batch_seconds`` of 16 kHz audio (utterances
of ``--utterance_seconds``), as ``data.max_batch_seconds`` fills it. Each configuration runs
in a fresh process; step time is the median of ``--steps`` steps after one warm-up step.

- activation memory: the peak of the process's resident memory during a step, minus the
  resident memory before it (weights, gradients and optimizer state are allocated by the
  warm-up step). glibc is told to return every large block at once
  (MALLOC_MMAP_THRESHOLD_), so resident memory follows live tensors; a thread samples
  /proc/self/statm every millisecond. That costs page faults, so step times come from a
  second process that runs as usual.
- checkpointing: ``--model.checkpoint_every 1`` against 0, both in bf16-mixed.
- precision: 32-true, bf16-mixed and bf16-true, without checkpointing.
- DDP: 2 processes (gloo), each stepping on a batch like the single process's, so the
  throughput ratio is 2 x (single step time) / (DDP step time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
TEXT = "call five two nine enter number oh seven go left erase three repeat stop"


def build(preset: str, checkpoint_every: int):
    from asr.module import ASRModule
    from asr.tokenizer import Tokenizer

    shape = yaml.safe_load((REPO / "configs" / "model" / f"{preset}.yaml").read_text())["model"]
    torch.manual_seed(0)
    return ASRModule(tokenizer=Tokenizer.train([TEXT]), checkpoint_every=checkpoint_every, **shape)


def batch(batch_seconds: float, utterance_seconds: float, vocab: int):
    n = max(1, int(batch_seconds // utterance_seconds))
    samples = int(utterance_seconds * 16000)
    tokens = int(utterance_seconds * 12)  # ~12 characters a second, well inside CTC's reach
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(n, samples, generator=generator) * 0.1, torch.full((n,), samples),
            torch.randint(2, vocab, (n, tokens), generator=generator), torch.full((n,), tokens))


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


def step_fn(module, data, precision: str):
    from asr.module import ctc_loss

    if precision == "bf16-true":
        module.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    audio, lengths, tokens, token_lengths = data

    def step():
        optimizer.zero_grad(set_to_none=False)
        with autocast:
            log_probs, out_lengths = module.model(audio, lengths)
            loss = ctc_loss(log_probs, out_lengths, tokens, token_lengths)
        loss.backward()
        optimizer.step()

    return step


def run_one(args) -> dict:
    """One configuration in this process: median step time and activation memory."""
    module = build(args.preset, args.checkpoint_every).train()
    step = step_fn(module, batch(args.batch_seconds, args.utterance_seconds, module.tokenizer.vocab_size),
                   args.precision)
    step()  # warm-up: allocates gradients and optimizer state
    times, peaks = [], []
    for _ in range(args.steps):
        before = resident()
        with PeakSampler() as sampler:
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        peaks.append(sampler.peak - before)
    return {"step_s": statistics.median(times), "activation_mb": max(peaks) / 2**20}


def run_ddp_rank(rank: int, args, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    module = build(args.preset, 0).train()
    module.model = torch.nn.parallel.DistributedDataParallel(module.model)
    step = step_fn(module, batch(args.batch_seconds, args.utterance_seconds, module.tokenizer.vocab_size),
                   "bf16-mixed")
    step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        results.put(statistics.median(times))
    torch.distributed.destroy_process_group()


def run_ddp(args) -> dict:
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = 29500 + os.getpid() % 1000
    torch.multiprocessing.start_processes(run_ddp_rank, args=(args, port, results), nprocs=2, start_method="spawn")
    return {"step_s": results.get()}


def measure(preset: str, precision: str, checkpoint_every: int, args, ddp: bool = False) -> dict:
    """Run one configuration in fresh processes: one for memory, with glibc returning freed blocks at
    once (which costs page faults, so it would slow the step), and one as usual for the step time."""
    command = [sys.executable, __file__, "--one", "--presets", preset, "--precision", precision,
               "--checkpoint_every", str(checkpoint_every), "--steps", str(args.steps),
               "--batch_seconds", str(args.batch_seconds), "--utterance_seconds", str(args.utterance_seconds)]

    def run(extra: list[str], env: dict) -> dict:
        out = subprocess.run(command + extra, capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    if ddp:
        return run(["--ddp"], dict(os.environ))
    memory = run([], dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"))
    return {"step_s": run([], dict(os.environ))["step_s"], "activation_mb": memory["activation_mb"]}


def report(preset: str, args) -> list[str]:
    runs = {name: measure(preset, precision, ckpt, args) for name, precision, ckpt in [
        ("bf16-mixed", "bf16-mixed", 0), ("bf16-mixed+ckpt", "bf16-mixed", 1),
        ("32-true", "32-true", 0), ("bf16-true", "bf16-true", 0)]}
    runs["ddp2"] = measure(preset, "bf16-mixed", 0, args, ddp=True)
    base, ckpt = runs["bf16-mixed"], runs["bf16-mixed+ckpt"]
    rows = [f"| {preset} | {name} | {r['step_s']:.2f} | {r['activation_mb']:.0f} |" if "activation_mb" in r
            else f"| {preset} | {name} | {r['step_s']:.2f} | not measured |" for name, r in runs.items()]
    rows.append(f"| {preset} | checkpointing: activation memory saved | {1 - ckpt['activation_mb'] / base['activation_mb']:.0%} | |")
    rows.append(f"| {preset} | checkpointing: step time ratio | {ckpt['step_s'] / base['step_s']:.2f}x | |")
    rows.append(f"| {preset} | bf16-mixed speed-up over 32-true | {runs['32-true']['step_s'] / base['step_s']:.2f}x | |")
    rows.append(f"| {preset} | bf16-true speed-up over 32-true | {runs['32-true']['step_s'] / runs['bf16-true']['step_s']:.2f}x | |")
    rows.append(f"| {preset} | DDP 2 processes throughput / 1 process | {2 * base['step_s'] / runs['ddp2']['step_s']:.2f}x | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="small,base", help="comma-separated configs/model presets")
    parser.add_argument("--batch_seconds", type=float, default=60.0, help="audio per batch (data.max_batch_seconds)")
    parser.add_argument("--utterance_seconds", type=float, default=6.0)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration, after one warm-up")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # internal: one configuration
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="bf16-mixed", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint_every", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.preset = args.presets
        print(json.dumps(run_ddp(args) if args.ddp else run_one(args)))
        return
    print(f"batch: {args.batch_seconds:g} s of audio in {args.utterance_seconds:g} s utterances; "
          f"median of {args.steps} steps; torch {torch.__version__}, {os.cpu_count()} CPU cores")
    print("| preset | configuration | step s (or ratio) | activation MB |\n|---|---|---|---|")
    for preset in args.presets.split(","):
        print("\n".join(report(preset, args)), flush=True)


if __name__ == "__main__":
    main()
