"""What each size preset costs to train, computed from its shapes (no GPU needed, nothing timed).

    python -m asr.bench.presets                        # every configs/model/*.yaml on configs/recipes/gpu-100h.yaml
    python -m asr.bench.presets --mfu 0.3 --gpu "NVIDIA A100-SXM4-80GB"

Per preset: parameters, the model's own forward FLOP count (CTCModel.forward_flops, what CostMonitor's MFU
uses) per second of audio in utterances of ``--utterance_seconds``, and the GPU-hours of one epoch of 1,000
hours at ``--mfu`` of the GPU's dense bf16 peak (asr.train.cost.GPU_PEAKS): training counts
TRAIN_FLOPS_PER_FORWARD x the forward FLOPs. The MFU is an assumption until a run on that GPU measures it
(its ``cost/mfu``). Models are built on the meta device, so a 1B-parameter preset takes no memory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
from pathlib import Path
from unittest import mock

import torch
import yaml

from asr.configs import CONFIGS
from asr.models.config import EncoderConfig
from asr.models.ctc import CTCModel
from asr.models.features import HOP_SECONDS, FeatureConfig
from asr.train import fitting
from asr.train.cost import ASSUMED_MFU, TRAIN_FLOPS_PER_FORWARD, gpu_peak_flops

HOURS = 1000.0  # of audio in the epoch the GPU-hours are given for

# MFU of each GPU preset's bf16-mixed training step on an NVIDIA H200 (SXM, 989.5 TFLOP/s dense bf16; torch 2.11):
# python -m asr.bench.gpu at 1000 audio-seconds a step (gpu-1000h.yaml's batch), xl and conformer-xl at 200 s only,
# lower than they reach at 1000 s. Random data and no Lightning loop: an upper bound on a run's (docs/benchmarks.md,
# 2026-11-28 night). The conformers are launch-bound: their convolution modules add many small kernels.
MEASURED_MFU = {"conformer-large": 0.063, "large": 0.195, "xl": 0.155, "conformer-xl": 0.044, "conformer-1b": 0.189,
                "xxl": 0.352}


def model_of(*configs: Path, device: str = "meta", checkpoint_every: int = 0) -> CTCModel:
    """The CTCModel of ``python -m asr.fit --config A --config B ...``, on ``device`` (meta: shapes only): the
    settings as asr.fit's own parser resolves them (its ``--print_config``), the vocabulary at
    data.tokenizer.vocab_size."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit), \
            mock.patch.object(sys, "argv", sys.argv[:1]):  # this command's own flags are not asr.fit's
        fitting.main([arg for config in configs for arg in ("--config", str(config))] + ["--print_config"])
    config = yaml.safe_load(out.getvalue())
    model, data = config["model"], config["data"]
    features = FeatureConfig(data["sample_rate"], **model["features"])
    with torch.device(device):
        return CTCModel(features, EncoderConfig(**model["encoder"]), data["tokenizer"]["vocab_size"],
                        checkpoint_every=checkpoint_every).to(device)


def mfu_of(preset: str, given: float | None = None) -> tuple[float, str]:
    """(MFU, where it comes from) for GPU-hour estimates: ``given``, else MEASURED_MFU's, else ASSUMED_MFU."""
    if given is not None:
        return given, "given"
    if preset in MEASURED_MFU:
        return MEASURED_MFU[preset], "measured on an H200"
    return ASSUMED_MFU, "assumed"


def row(name: str, model: CTCModel, utterance_seconds: float, peak: float, mfu: tuple[float, str],
        worker_audio_per_second: float | None = None) -> str:
    mfu, source = mfu
    cfg = model.encoder.cfg
    parameters = sum(p.numel() for p in model.parameters())
    samples = round(utterance_seconds * model.sample_rate)
    per_second = model.forward_flops(torch.tensor([samples])).item() / utterance_seconds
    frames = torch.tensor([round(utterance_seconds / HOP_SECONDS)])
    front = model.encoder.subsampling.flops(frames)[0].item() / utterance_seconds
    hours = TRAIN_FLOPS_PER_FORWARD * per_second * HOURS / (peak * mfu)  # (x 3600 s of audio / 3600 s of GPU)
    consumed = peak * mfu / (TRAIN_FLOPS_PER_FORWARD * per_second)  # audio-seconds the GPU trains on per second
    feed = f" {math.ceil(consumed / worker_audio_per_second)} |" if worker_audio_per_second else ""
    shape = f"{cfg.block} {cfg.d_model}x{cfg.n_layers}, x{cfg.subsampling} {cfg.subsampling_conv}"
    return (f"| {name} | {shape} | {parameters / 1e6:,.0f}M | {per_second / 1e9:.2f} | "
            f"{front / per_second:.0%} | {mfu:.1%} ({source}) | {hours:.2g} | {consumed:,.0f} |{feed}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.presets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default=str(CONFIGS / "recipes" / "gpu-100h.yaml"),
                        help="the recipe the presets stack on (its features, sample rate and vocabulary)")
    parser.add_argument("--utterance_seconds", type=float, default=15.0)
    parser.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="a name as torch.cuda.get_device_name gives it")
    parser.add_argument("--mfu", type=float, help="share of the GPU's bf16 peak for every preset (default: each "
                        "GPU preset's measured on an H200, MEASURED_MFU; else ASSUMED_MFU)")
    parser.add_argument("--worker_audio_per_second", type=float,
                        help="what one data worker delivers (python -m asr.bench.loader): adds the workers each needs")
    args = parser.parse_args(argv)
    peak = gpu_peak_flops(args.gpu, "bf16")
    if peak is None:
        parser.error(f"--gpu {args.gpu!r}: no bf16 peak known (asr.train.cost.GPU_PEAKS)")
    print(f"on {Path(args.recipe).name}, {args.utterance_seconds:g} s utterances; GPU-hours at each row's MFU of "
          f"{args.gpu}'s {peak / 1e12:,.0f} TFLOP/s bf16\n")
    feed = " data workers to feed it |" if args.worker_audio_per_second else ""
    print("| preset | encoder | parameters | forward GFLOP per audio-second | of it, subsampling | "
          f"MFU | GPU-hours per {HOURS:,.0f} h epoch | audio-seconds trained on per GPU-second |{feed}")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if feed else ""))
    models = {preset.stem: model_of(Path(args.recipe), preset) for preset in (CONFIGS / "model").glob("*.yaml")}
    for name, model in sorted(models.items(), key=lambda item: sum(p.numel() for p in item[1].parameters())):
        print(row(name, model, args.utterance_seconds, peak, mfu_of(name, args.mfu), args.worker_audio_per_second))


def run() -> None:
    main()


if __name__ == "__main__":
    run()
