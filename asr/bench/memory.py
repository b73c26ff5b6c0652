"""How much audio a GPU's memory holds per training step, for each GPU preset: ``python -m asr.bench.memory``.

    python -m asr.bench.memory                         # the GPU presets on configs/recipes/gpu-100h.yaml, 80 GB
    python -m asr.bench.memory --presets conformer-1b --gpu_gib 40 --gpus 8

Two parts, each counted on this machine's CPU, so no GPU is needed:
- the state: fp32 weights, fp32 gradients and AdamW's two fp32 moments, 16 bytes a parameter on each GPU under
  DDP, 16 / N under FSDP2 over N GPUs plus the bf16 copy of the largest block while it is gathered;
- the activations: the bytes autograd saves for the backward pass (``torch.autograd.graph.saved_tensors_hooks``,
  each storage counted once) in a training forward of one ``--utterance_seconds`` utterance under bf16 autocast,
  per audio-second, with and without activation checkpointing of every block (``model.checkpoint_every 1``;
  checkpointed, the backward pass also holds one block's recomputed activations: the plain count over the blocks).
  On a GPU, FlashAttention keeps no T' x T' scores where the CPU's attention may: an upper bound.
The audio a step can hold is what is left of ``--gpu_gib`` (less HEADROOM for the allocator, the CUDA context and
the cuBLAS workspace) over the activations per audio-second.
"""

from __future__ import annotations

import argparse

import torch

from asr.bench.gpu import GPU_PRESETS
from asr.bench.presets import model_of
from asr.configs import CONFIGS

STATE_BYTES = 16  # per parameter: fp32 weight, fp32 gradient, AdamW's exp_avg and exp_avg_sq
HEADROOM = 0.25  # of the GPU's memory left to fragmentation, the CUDA context, NCCL and cuBLAS workspaces
RECIPE = CONFIGS / "recipes" / "gpu-100h.yaml"


def saved_bytes(model: torch.nn.Module, seconds: float) -> int:
    """Bytes autograd saves for backward in one training forward of a ``seconds`` utterance (bf16 autocast)."""
    saved: dict[tuple[int, torch.dtype], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[(storage.data_ptr(), tensor.dtype)] = storage.nbytes()  # a view of a saved storage costs nothing
        return tensor

    samples = round(seconds * model.sample_rate)
    audio, lengths = 0.1 * torch.randn(1, samples), torch.tensor([samples])
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        model(audio, lengths)
    return sum(saved.values())


def estimate(preset: str, seconds: float) -> dict:
    """Parameters, the largest block's parameters and activation bytes per audio-second, plain and checkpointed."""
    row = {}
    for every in (0, 1):
        model = model_of(RECIPE, CONFIGS / "model" / f"{preset}.yaml", device="cpu", checkpoint_every=every)
        row["parameters"] = sum(p.numel() for p in model.parameters())
        row["block"] = max(sum(p.numel() for p in unit.parameters()) for unit in model.encoder.units())
        row["checkpointed" if every else "plain"] = saved_bytes(model, seconds) / seconds
        row["blocks"] = len(model.encoder.units())
        model = None  # a 1B model is 4 GB on the CPU: one at a time
    row["checkpointed"] += row["plain"] / row["blocks"]  # the block being recomputed
    return row


def batch_seconds(row: dict, gpu_gib: float, gpus: int, sharded: bool, checkpointed: bool) -> float:
    """Audio-seconds a step of one GPU holds: free memory over activation bytes per audio-second (0: none)."""
    state = STATE_BYTES * row["parameters"] / (gpus if sharded else 1) + (2 * row["block"] if sharded else 0)
    free = gpu_gib * 2**30 * (1 - HEADROOM) - state
    return max(0.0, free / row["checkpointed" if checkpointed else "plain"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(GPU_PRESETS))
    parser.add_argument("--gpu_gib", type=float, default=80.0)
    parser.add_argument("--gpus", type=int, default=8, help="the GPUs FSDP2 shards the state over")
    parser.add_argument("--utterance_seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    print(f"audio-seconds per GPU per step on {args.gpu_gib:g} GiB ({HEADROOM:.0%} kept free), FSDP2 over "
          f"{args.gpus}; activations of a {args.utterance_seconds:g} s utterance in bf16 autocast, counted on the CPU\n")
    print("| preset | parameters | state per GPU, DDP / FSDP2 (GiB) | activations per audio-second, plain / "
          "checkpointed (MiB) | DDP | DDP, checkpointed | FSDP2 | FSDP2, checkpointed |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        row = estimate(preset, args.utterance_seconds)
        ddp, fsdp = (STATE_BYTES * row["parameters"] / n / 2**30 for n in (1, args.gpus))
        fits = [batch_seconds(row, args.gpu_gib, args.gpus, sharded, ckpt) for sharded in (False, True)
                for ckpt in (False, True)]
        print(f"| {preset} | {row['parameters'] / 1e6:,.0f}M | {ddp:.1f} / {fsdp:.1f} | {row['plain'] / 2**20:.1f} / "
              f"{row['checkpointed'] / 2**20:.1f} | " + " | ".join(f"{s:,.0f}" for s in fits) + " |", flush=True)


def run() -> None:
    main()


if __name__ == "__main__":
    run()
