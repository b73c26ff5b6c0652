"""``python -m asr.bench.attention [--batch 16 --frames 400 --d_model 512 --heads 8 --window 0 --dtype bf16]``:
milliseconds of one forward and backward of asr.models.blocks.attention on this machine's device (CUDA if torch
sees one), through each path that device can take: masked SDPA (the mask BlockEncoder builds) and, where
attention_path allows it, varlen_attn. Lengths are drawn between ``--min_share`` of ``--frames`` and all of them,
as in length-bucketed batches. A CPU's figures say nothing of a GPU's.
"""

from __future__ import annotations

import argparse
import time

import torch

from asr.models.blocks import attention, attention_mask, attention_path

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def inputs(batch: int, frames: int, d_model: int, heads: int, min_share: float, dtype: torch.dtype,
           device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(qkv (3, B, H, T', d/H) that requires grad, keep (B, T', 1)); the longest utterance fills T'."""
    generator = torch.Generator().manual_seed(seed)
    lengths = (frames * (min_share + (1 - min_share) * torch.rand(batch, generator=generator))).long().clamp(1, frames)
    lengths[0] = frames
    keep = (torch.arange(frames) < lengths[:, None]).unsqueeze(-1).to(device, dtype)
    qkv = torch.randn(3, batch, heads, frames, d_model // heads, generator=generator).to(device, dtype)
    return qkv.requires_grad_(), keep


def measure(qkv: torch.Tensor, keep: torch.Tensor, window: int, rotary: bool, repeats: int) -> dict[str, float]:
    """Milliseconds per forward and backward of each path the device can take: {"sdpa": ms, "varlen": ms}."""
    lengths = keep[..., 0].gt(0).sum(1)
    mask = attention_mask(lengths, qkv.shape[3], window)
    grad = torch.randn_like(qkv[0])
    paths = {"sdpa": None}  # attention without keep: the masked SDPA path
    if attention_path(qkv.device, qkv.dtype, qkv.shape[-1], 0.0) == "varlen":
        paths["varlen"] = keep
    times = {}
    for name, given in paths.items():
        for i in range(3 + repeats):  # 3 to warm up: kernel choice, allocator, cuDNN plans
            if i == 3:
                synchronize(qkv.device)
                start = time.perf_counter()
            attention(qkv, mask, rotary=rotary, keep=given, window=window).backward(grad)
        synchronize(qkv.device)
        times[name] = (time.perf_counter() - start) / repeats * 1000
        qkv.grad = None
    return times


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=400, help="T', encoder frames (400: 16 s at x4)")
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--window", type=int, default=0, help="frames either side; 0 = global")
    parser.add_argument("--rotary", action="store_true", help="rotate q and k (Conformer)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--min_share", type=float, default=0.8, help="shortest length as a share of --frames")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    qkv, keep = inputs(args.batch, args.frames, args.d_model, args.heads, args.min_share, DTYPES[args.dtype], device)
    times = measure(qkv, keep, args.window, args.rotary, args.repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, {args.dtype}, B {args.batch}, T' {args.frames}, d {args.d_model}, {args.heads} heads, "
          f"window {args.window}, padding {1 - keep.float().mean().item():.1%}")
    print("| path | ms, forward + backward | x sdpa |\n|---|---|---|")
    for path, ms in times.items():
        print(f"| {path} | {ms:.3f} | {times['sdpa'] / ms:.2f} |")


if __name__ == "__main__":
    main()
