"""Peak memory of a training step per batch-second, CTC against the transducer and the hybrid, at the shapes of the
default run ("demo") and of the small preset: ``python -m asr.bench.objectives``.

    python -m asr.bench.objectives                                # demo and small, each recipe's max_batch_seconds
    python -m asr.bench.objectives --device cuda --joint_dims 64 128 256
    python -m asr.bench.objectives --presets demo --batch_seconds 2 -- --model.encoder.d_model 16   # a tiny shape

A transducer's step holds the joiner's (B, T', U+1, V) lattice (asr.models.transducer): its activations in the
autocast dtype and torchaudio's fp32 gradient of the logits, which rnnt_loss computes in its forward. The batch is
``--batch_seconds`` of ``--utterance_seconds`` utterances (no padding) of ``--tokens_per_second`` random tokens, as
asr.fit's settings for ``--presets`` (the default run, or configs/model/small.yaml on it) and the flags after
``--`` resolve them. On a CUDA device the figure is the allocator's peak during forward and backward, less what was
allocated before (weights); on a CPU, the bytes autograd saves for the backward pass (each storage once): a lower
bound, without the transients of the loss. Bytes, not time: the figures do not depend on a busy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import replace
from unittest import mock

import torch
import yaml

from asr.configs import CONFIGS
from asr.data.batch import Batch
from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.objectives import objective_class
from asr.models.transducer import TransducerConfig
from asr.train import fitting

PRESETS = {"demo": [], "small": [CONFIGS / "model" / "small.yaml"]}  # the default run, and small on it
OBJECTIVES = ("ctc", "transducer", "hybrid")


def resolved(configs: list, fit_args: list[str]) -> dict:
    """asr.fit's resolved config (its --print_config) of ``configs`` and ``fit_args``."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit), \
            mock.patch.object(sys, "argv", sys.argv[:1]):  # this command's own flags are not asr.fit's
        fitting.main([arg for config in configs for arg in ("--config", str(config))] + fit_args + ["--print_config"])
    return yaml.safe_load(out.getvalue())


def network(config: dict, objective: str, joint_dim: int, device: torch.device) -> tuple[torch.nn.Module, object]:
    """(the network, the objective) of ``objective`` at the resolved ``config``'s shapes, on ``device``."""
    model, data = config["model"], config["data"]
    transducer = replace(TransducerConfig(**(model.get("transducer") or {})), joint_dim=joint_dim)
    made = objective_class(objective)(**({} if objective == "ctc" else {"transducer": transducer}))
    features = FeatureConfig(data["sample_rate"], **model["features"])
    net = made.network(features, EncoderConfig(**model["encoder"]), data["tokenizer"]["vocab_size"], None, 0)
    return net.to(device).train(), made


def batch_of(seconds: float, utterance_seconds: float, tokens_per_second: float, vocab: int, rate: int,
             device: torch.device) -> Batch:
    """As many utterances of ``utterance_seconds`` as ``seconds`` holds (at least one), of random noise and tokens."""
    n, samples = max(1, int(seconds // utterance_seconds)), round(utterance_seconds * rate)
    tokens = max(1, round(tokens_per_second * utterance_seconds))
    generator = torch.Generator().manual_seed(0)
    return Batch((0.1 * torch.randn(n, samples, generator=generator)).to(device),
                 torch.full((n,), samples, device=device),
                 torch.randint(1, vocab, (n, tokens), generator=generator).to(device),
                 torch.full((n,), tokens, device=device), [""] * n)


def step_bytes(net: torch.nn.Module, objective, batch: Batch, dtype: torch.dtype | None) -> int:
    """Peak bytes of one training step beyond the weights (see the module docstring for the CPU's figure)."""
    device = batch.audio.device
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    if device.type != "cuda":
        saved: dict[tuple[int, torch.dtype], int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            saved[(storage.data_ptr(), tensor.dtype)] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast:
            objective(net, batch, True)
        return sum(saved.values())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with autocast:
        loss = objective(net, batch, True)
    loss.objective.backward()
    net.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated(device) - before


def rows(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.precision or ("bf16" if device.type == "cuda" else "fp32")]
    found = []
    for preset in args.presets:
        config = resolved(PRESETS[preset], args.fit_args)
        seconds = args.batch_seconds or config["data"]["max_batch_seconds"]
        ctc = None
        for objective in OBJECTIVES:
            for joint_dim in (args.joint_dims if objective != "ctc" else [0]):
                net, made = network(config, objective, joint_dim or 1, device)
                batch = batch_of(seconds, args.utterance_seconds, args.tokens_per_second,
                                 config["data"]["tokenizer"]["vocab_size"], net.sample_rate, device)
                peak = step_bytes(net, made, batch, dtype)
                ctc = peak if objective == "ctc" else ctc
                found.append({"preset": preset, "objective": objective, "joint_dim": joint_dim or None,
                              "utterances": len(batch.texts), "peak_mib": peak / 2**20, "vs_ctc": peak / ctc,
                              "batch_seconds": len(batch.texts) * args.utterance_seconds})
                del net, made, batch
    return found


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.objectives", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", choices=PRESETS, default=list(PRESETS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("bf16", "fp32"), help="autocast; default bf16 on CUDA, fp32 on a CPU")
    parser.add_argument("--batch_seconds", type=float, help="audio per step (default: the recipe's max_batch_seconds)")
    parser.add_argument("--utterance_seconds", type=float, default=10.0)
    parser.add_argument("--tokens_per_second", type=float, default=6.0,
                        help="target tokens per second of audio (data/mini's 64-piece unigram: about 6)")
    parser.add_argument("--joint_dims", type=int, nargs="+", default=[TransducerConfig.joint_dim])
    parser.add_argument("fit_args", nargs="*", help="after --: asr.fit flags for every preset")
    args = parser.parse_args(argv)
    found = rows(args)
    print(f"peak memory of a training step on {args.device} ({args.precision or 'default'} precision), "
          f"{args.utterance_seconds:g} s utterances of {args.tokens_per_second:g} tokens a second\n")
    print("| preset | objective | joint dim | utterances | batch s | peak MiB | MiB per batch-second | x CTC |")
    print("|---|---|---|---|---|---|---|---|")
    for r in found:
        print(f"| {r['preset']} | {r['objective']} | {r['joint_dim'] or '-'} | {r['utterances']} | "
              f"{r['batch_seconds']:g} | {r['peak_mib']:.1f} | {r['peak_mib'] / r['batch_seconds']:.2f} | "
              f"{r['vs_ctc']:.2f} |")
    return found


def run() -> None:
    main()


if __name__ == "__main__":
    run()
