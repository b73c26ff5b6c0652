"""Training steps of the GPU presets on this GPU, timed: ``python -m asr.bench.gpu`` (scripts/gpu_check.sh runs it).

    python -m asr.bench.gpu                                   # the six GPU presets, bf16, 200 s of 15 s utterances
    python -m asr.bench.gpu --presets conformer-large xl --batch_seconds 400 --precision 16-mixed

Per preset (configs/model/<preset>.yaml on configs/recipes/gpu-100h.yaml, as asr.bench.presets resolves them):
the median wall time of ``--steps`` optimizer steps after ``--warmup`` (forward under autocast, CTC loss, backward,
fused AdamW), x real time (audio-seconds trained on per second), peak memory, and MFU: the model's own FLOP count
(CTCModel.forward_flops x TRAIN_FLOPS_PER_FORWARD, what CostMonitor logs as cost/mfu) against the GPU's datasheet
peak (asr.train.cost.GPU_PEAKS) and against a measured 8192^3 matmul. Random audio and tokens: no data loading,
no Lightning loop, so it is the model's speed, an upper bound on a run's. A preset that does not fit says OOM.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from asr.bench.presets import model_of
from asr.configs import CONFIGS
from asr.train.cost import TRAIN_FLOPS_PER_FORWARD, compute_dtype, gpu_peak_flops, measure_matmul_flops

GPU_PRESETS = ("conformer-large", "large", "xl", "conformer-xl", "conformer-1b", "xxl")  # ~100M to ~1B parameters
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "32-true": None}
TOKENS_PER_SECOND = 3  # targets per audio-second: a 1024-piece BPE on read English gives about this many


def step_times(model, batch_seconds: float, utterance_seconds: float, precision: str, steps: int,
               warmup: int) -> list[float]:
    """Wall seconds of each timed optimizer step on random batches of ``batch_seconds`` of audio."""
    device, rate = next(model.parameters()).device, model.sample_rate
    count = max(1, round(batch_seconds / utterance_seconds))
    audio = 0.1 * torch.randn(count, round(utterance_seconds * rate), device=device)
    lengths = torch.full((count,), audio.shape[1], device=device)
    targets = round(utterance_seconds * TOKENS_PER_SECOND)
    tokens = torch.randint(1, model.head.out_features, (count, targets), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "16-mixed")
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=AUTOCAST[precision] or torch.float32, enabled=AUTOCAST[precision] is not None):
            log_probs, frames = model(audio, lengths)
        loss = F.ctc_loss(log_probs.float().transpose(0, 1), tokens, frames,
                          torch.full((count,), targets, device=device), zero_infinity=True)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def measure(preset: str, args, measured_peak: float) -> str:
    """One table row for ``preset``."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        model = model_of(CONFIGS / "recipes" / "gpu-100h.yaml", CONFIGS / "model" / f"{preset}.yaml", device="cuda")
        model.train()
        seconds = statistics.median(step_times(model, args.batch_seconds, args.utterance_seconds, args.precision,
                                               args.steps, args.warmup))
    except torch.OutOfMemoryError:
        return f"| {preset} | OOM at {args.batch_seconds:g} s a batch | | | | | |"
    finally:
        model = None
    count = max(1, round(args.batch_seconds / args.utterance_seconds))
    audio_seconds = count * args.utterance_seconds
    built = model_of(CONFIGS / "recipes" / "gpu-100h.yaml", CONFIGS / "model" / f"{preset}.yaml")  # meta: the count
    samples = torch.full((count,), round(args.utterance_seconds * built.sample_rate))
    flops = TRAIN_FLOPS_PER_FORWARD * built.forward_flops(samples).sum().item() / seconds
    parameters = sum(p.numel() for p in built.parameters())
    sheet = gpu_peak_flops(torch.cuda.get_device_name(), compute_dtype(args.precision))
    mfu_sheet = f"{flops / sheet:.1%}" if sheet else "?"
    return (f"| {preset} | {parameters / 1e6:,.0f}M | {seconds:.3f} | {audio_seconds / seconds:,.0f} | "
            f"{torch.cuda.max_memory_allocated() / 2**30:.1f} | {mfu_sheet} | {flops / measured_peak:.1%} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(GPU_PRESETS))
    parser.add_argument("--precision", choices=sorted(AUTOCAST), default="bf16-mixed")
    parser.add_argument("--batch_seconds", type=float, default=200.0, help="audio-seconds per step (gpu-1000h.yaml: 1000)")
    parser.add_argument("--utterance_seconds", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (asr.bench.presets estimates the same figures from shapes alone)")
    dtype = AUTOCAST[args.precision] or torch.float32
    measured_peak = measure_matmul_flops(dtype, size=8192, reps=10, budget_s=5.0, device="cuda")
    print(f"{torch.cuda.get_device_name()}, {args.precision}: an 8192^3 matmul ran at {measured_peak / 1e12:,.0f} "
          f"TFLOP/s; {args.batch_seconds:g} s of {args.utterance_seconds:g} s utterances a step, median of "
          f"{args.steps}\n")
    print("| preset | parameters | seconds a step | x real time | peak GiB | MFU (datasheet) | MFU (measured matmul) |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        print(measure(preset, args, measured_peak), flush=True)


def run() -> None:
    main()


if __name__ == "__main__":
    run()
