"""Average the weights of several checkpoints of one run into one checkpoint (ESPnet/icefall style).

    python -m asr.average avg.ckpt runs/default/version_0/checkpoints/epoch098-wer0.0706.ckpt \\
        runs/default/version_0/checkpoints/last.ckpt
    python -m asr.average avg.ckpt --best 5 runs/default/version_0/checkpoints   # lowest val/wer
    python -m asr.average avg.ckpt --last 5 runs/default/version_0/checkpoints   # highest global step
    python -m asr.transcribe --checkpoint avg.ckpt data/mini/test.jsonl

Floating-point weights are averaged (in float64, stored in their own dtype); integer and bool
tensors are taken from the last checkpoint (the last given, or the newest selected). All
checkpoints must have the same weight names, shapes and dtypes, the same model
hyper-parameters and the same tokenizer; otherwise the error names the file that differs.

The result holds weights, hyper-parameters and tokenizer only: no optimizer, scheduler, loop or
callback state. It transcribes and exports (``asr.transcribe``, ``asr.export``) like any
checkpoint, but it cannot resume training: ``asr.fit --ckpt_path avg.ckpt`` stops at once and
says so. Its ``averaged_from`` key lists the source files.

``--best`` ranks by the ``wer`` in the file name that configs/trainer.yaml's ModelCheckpoint
writes (``epoch098-wer0.0706.ckpt``), else by the score the checkpoint's own val/wer
ModelCheckpoint state recorded for that file; files with neither (``last.ckpt``) are not ranked.
That callback keeps ``save_top_k`` files (5 in configs/trainer.yaml).

A sharded checkpoint folder (configs/strategy/fsdp.yaml writes ``last.ckpt/``) is read as the file
``python -m asr.convert`` would make of it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from asr.atomic import write_atomically
from asr.checkpoint import merge, missing, outline, precious
from asr.settings import dotted

MONITOR = "val/wer"  # what --best ranks by; lower is better
WER_IN_NAME = re.compile(r"wer(\d+(?:\.\d+)?)")  # configs/trainer.yaml: "epoch{epoch:03d}-wer{val/wer:.4f}"
KEPT = ("epoch", "global_step", "pytorch-lightning_version", "hparams_name", "hyper_parameters",
        "datamodule_hparams_name", "datamodule_hyper_parameters", "tokenizer")  # copied from the last input


class AverageError(ValueError):
    """Checkpoints that cannot be averaged; the message names the file."""


def load(path: Path, weights: bool = True) -> dict:
    """A checkpoint written by asr.fit, a file or a sharded folder (asr.checkpoint.merge), read without running
    pickled code; ``weights=False``: a folder's tensors are not read (``outline``), for ranking it."""
    try:
        if path.is_dir():
            checkpoint = merge(path) if weights else outline(path)
        else:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a file that is not a checkpoint
        raise AverageError(f"{path}: cannot read it as a checkpoint ({err})") from err
    lacks = missing(checkpoint)
    if lacks:
        raise AverageError(f"{path}: no {', '.join(lacks)} inside: it was not written by asr.fit")
    return checkpoint


def check_compatible(reference: dict, reference_path: Path, other: dict, path: Path) -> None:
    """Raise AverageError naming ``path`` if ``other`` cannot be averaged with ``reference``."""
    # the settings first: a differing d_model says more than the first weight of another shape
    from asr.train.legacy import group_settings
    from asr.train.module import ASRModule  # here: importing Lightning costs seconds, and only this check needs it

    a, b = (dotted(ASRModule.settings(c["hyper_parameters"])) for c in (reference, other))
    differing = sorted(k for k in a if a[k] != b.get(k))
    if differing:
        written = dotted(group_settings(reference["hyper_parameters"])).keys() & \
            dotted(group_settings(other["hyper_parameters"])).keys()
        details = ", ".join(f"{k}={b[k]!r} vs {a[k]!r}" + ("" if k in written else " (one file lacks it: its default)")
                            for k in differing)
        raise AverageError(f"{path}: hyper-parameters differ from {reference_path}'s: {details}")
    if other["tokenizer"] != reference["tokenizer"]:
        raise AverageError(f"{path}: its tokenizer differs from {reference_path}'s")
    ours, theirs = reference["state_dict"], other["state_dict"]
    if ours.keys() != theirs.keys():
        extra, missing = sorted(theirs.keys() - ours.keys()), sorted(ours.keys() - theirs.keys())
        raise AverageError(f"{path}: weights differ from {reference_path}'s: extra {extra[:5]}, missing {missing[:5]}")
    for name, tensor in ours.items():
        if (theirs[name].shape, theirs[name].dtype) != (tensor.shape, tensor.dtype):
            raise AverageError(f"{path}: {name} is {theirs[name].dtype} {tuple(theirs[name].shape)}, but "
                               f"{tensor.dtype} {tuple(tensor.shape)} in {reference_path}")


def average(paths: list[Path]) -> dict:
    """The averaged checkpoint of ``paths`` (at least one); metadata comes from the last path."""
    if not paths:
        raise AverageError("no checkpoints to average")
    first = load(paths[0])
    sums = {k: v.double() if v.is_floating_point() else v for k, v in first["state_dict"].items()}
    last = first
    for path in paths[1:]:
        last = load(path)
        check_compatible(first, paths[0], last, path)
        for name, tensor in last["state_dict"].items():
            sums[name] = sums[name] + tensor.double() if tensor.is_floating_point() else tensor
    state_dict = {k: (sums[k] / len(paths)).to(v.dtype) if v.is_floating_point() else v
                  for k, v in last["state_dict"].items()}
    averaged = {key: last[key] for key in KEPT if key in last}
    return averaged | {"state_dict": state_dict, "averaged_from": [str(p) for p in paths]}


def wer_of(path: Path, checkpoint: dict) -> float | None:
    """The checkpoint's val/wer: from its file name, else from its ModelCheckpoint(monitor=val/wer) state."""
    match = WER_IN_NAME.search(path.name)
    if match:
        return float(match.group(1))
    for state in checkpoint.get("callbacks", {}).values():
        if isinstance(state, dict) and state.get("monitor") == MONITOR:
            for kept, score in state.get("best_k_models", {}).items():
                if Path(kept).name == path.name:
                    return float(score)
    return None


def select(folder: Path, last: int = 0, best: int = 0) -> list[Path]:
    """The ``last`` newest (by global step) or ``best`` lowest-WER checkpoints in ``folder``, oldest first.

    Files of the same global step (last.ckpt beside an epoch file of the same epoch) count once.
    """
    if not folder.is_dir():
        raise AverageError(f"{folder}: not a folder of checkpoints")
    by_step: dict[int, tuple[Path, float | None]] = {}
    for path in sorted(folder.glob("*.ckpt")):
        checkpoint = load(path, weights=False)
        step, wer = int(checkpoint.get("global_step", -1)), wer_of(path, checkpoint)
        if step not in by_step or (by_step[step][1] is None and wer is not None):
            by_step[step] = (path, wer)
    if last:
        chosen = sorted(by_step.items())[-last:]
        wanted, flag = last, f"--last {last}"
    else:
        ranked = sorted((wer, step) for step, (_, wer) in by_step.items() if wer is not None)[:best]
        chosen = sorted((step, by_step[step]) for _, step in ranked)
        wanted, flag = best, f"--best {best}"
    if len(chosen) < wanted:
        raise AverageError(f"{flag}: {folder} has only {len(chosen)} such checkpoints; to keep more, raise "
                           f"save_top_k of the {MONITOR} ModelCheckpoint (configs/trainer.yaml trainer.callbacks)")
    return [path for _, (path, _) in chosen]


def save(checkpoint: dict, output: Path) -> None:
    """Write ``checkpoint`` to ``output`` atomically: a temporary file, then a rename."""
    with write_atomically(output) as partial:
        torch.save(checkpoint, partial)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the averaged .ckpt to write")
    parser.add_argument("inputs", nargs="+", help="checkpoint files, or one checkpoints folder with --last/--best")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--last", type=int, default=0, help="average the N newest checkpoints of the folder")
    choice.add_argument("--best", type=int, default=0, help=f"average the N checkpoints of lowest {MONITOR}")
    args = parser.parse_args(argv)
    if args.last < 0 or args.best < 0:
        parser.error("--last and --best take a positive number of checkpoints")
    if (args.last or args.best) and len(args.inputs) != 1:
        parser.error("--last/--best take one checkpoints folder, e.g. runs/default/version_0/checkpoints")
    try:
        paths = select(Path(args.inputs[0]), args.last, args.best) if args.last or args.best else \
            [Path(p) for p in args.inputs]
        refused = precious(Path(args.output), paths)
        if refused:
            raise AverageError(f"not written: {refused}")
        save(average(paths), Path(args.output))
    except (AverageError, OSError) as err:  # OSError: the output's folder cannot be written, or is full
        sys.exit(f"{parser.prog}: error: {err}")
    print(f"{args.output}: the average of {len(paths)} checkpoints: " + ", ".join(str(p) for p in paths))


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
