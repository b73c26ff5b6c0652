"""Turn a sharded checkpoint folder into one ``.ckpt`` file.

Under configs/strategy/fsdp.yaml (``save_distributed_checkpoint: true``) each rank writes
its shard of the weights and optimizer state into a folder (torch.distributed.checkpoint
files plus ``meta.pt``). This merges them into the file format every other strategy writes,
which ``asr.fit --ckpt_path`` resumes from under any strategy and device count:

    python -m asr.convert runs/default/version_0/checkpoints/last.ckpt last-full.ckpt

``merge`` is how every reader of asr (asr.transcribe, asr.average, asr.export, --model.init_from)
reads a folder; ``outline`` reads its names and shapes only (asr.fit --ckpt_path).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from asr.atomic import write_atomically
from asr.checkpoint import METADATA, precious

UNREADABLE = "its shards cannot be read (incomplete, or not written by torch.distributed.checkpoint)"


def convert(folder: str | Path, output: str | Path) -> Path:
    """Merge the sharded checkpoint ``folder`` into the single file ``output`` (written atomically).

    Raises ValueError naming ``folder`` if it has no meta.pt or its shards cannot be read.
    """
    checkpoint = merge(folder)
    with write_atomically(Path(output)) as partial:  # never a half-written checkpoint under the real name
        torch.save(checkpoint, partial)
    return Path(output)


def merge(folder: str | Path) -> dict:
    """The sharded checkpoint ``folder`` as the dict a single-file checkpoint holds (weights, optimizer state
    by parameter index, and meta.pt's keys); ValueError naming ``folder`` if it has no meta.pt or its shards
    cannot be read."""
    folder = Path(folder)
    checkpoint = meta(folder)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dcp_to_torch_save(folder, Path(tmp) / "merged.pt")
        except CheckpointException as err:  # a BaseException: it would escape `except Exception`
            raise ValueError(f"{folder}: {UNREADABLE}") from err
        merged = torch.load(Path(tmp) / "merged.pt", map_location="cpu", weights_only=True)
    checkpoint["state_dict"] = merged["state_dict"]
    optimizers = sorted((k for k in merged if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint["optimizer_states"] = [by_parameter_index(merged[k]) for k in optimizers]
    return checkpoint


def outline(folder: str | Path) -> dict:
    """What the sharded checkpoint ``folder`` holds, without reading a tensor: meta.pt's keys, ``state_dict`` as
    meta-device tensors of the saved names, shapes and dtypes, and ``optimizer_states`` as one None per optimizer
    (no key without one); ValueError naming ``folder`` as ``merge``'s. For checks of a 12 GB checkpoint on
    every rank (asr.fit --ckpt_path)."""
    folder = Path(folder)
    checkpoint = meta(folder)
    try:
        saved = FileSystemReader(folder).read_metadata()
    except (OSError, EOFError, pickle.UnpicklingError) as err:  # no .metadata: the write never finished
        raise ValueError(f"{folder}: {UNREADABLE}") from err
    state_dict, optimizers = {}, set()
    for key, item in saved.state_dict_metadata.items():
        where = saved.planner_data[key]  # ("state_dict", name) or ("optimizer_0", "state", name, "exp_avg")
        if where[0] == "state_dict" and isinstance(item, TensorStorageMetadata):
            state_dict[where[1]] = torch.empty(item.size, dtype=item.properties.dtype, device="meta")
        elif where[0].startswith("optimizer_"):
            optimizers.add(where[0])
    checkpoint["state_dict"] = state_dict
    return checkpoint | ({"optimizer_states": [None] * len(optimizers)} if optimizers else {})


def meta(folder: Path) -> dict:
    """A sharded checkpoint folder's meta.pt (everything but weights and optimizer state); ValueError if none."""
    if not (folder / METADATA).is_file():
        raise ValueError(f"{folder} is not a sharded checkpoint folder: it has no {METADATA}")
    return torch.load(folder / METADATA, map_location="cpu", weights_only=True)


def by_parameter_index(state: dict) -> dict:
    """A sharded optimizer state is keyed by parameter name; torch.optim.Optimizer.load_state_dict wants indices."""
    names = [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    groups = [dict(group, params=[index[n] for n in group["params"]]) for group in state["param_groups"]]
    per_parameter = state.get("state", {})  # absent for a stateless optimizer (plain SGD)
    return {"state": {index[name]: value for name, value in per_parameter.items()}, "param_groups": groups}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a sharded checkpoint folder (configs/strategy/fsdp.yaml writes them)")
    parser.add_argument("output", help="the .ckpt file to write")
    args = parser.parse_args(argv)
    refused = precious(Path(args.output), [])
    if refused:
        sys.exit(f"python -m asr.convert: error: not written: {refused}")
    try:
        print(f"wrote {convert(args.folder, args.output)}")
    except (ValueError, OSError) as err:  # OSError: the output's folder cannot be written, or is full
        sys.exit(f"python -m asr.convert: error: {err}")


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
