"""Reading asr's checkpoint files: one reader that names the flag that gave the path, and a sharded checkpoint
folder (what Lightning's ModelParallelStrategy writes with ``save_distributed_checkpoint: true``: each rank's shard
of the weights and optimizer state as torch.distributed.checkpoint files, plus ``meta.pt``) read as a file:
``merge`` is how every reader of asr (asr.transcribe, asr.average, asr.export, asr.convert, --model.init_from)
reads a folder; ``outline`` reads its names and shapes only (asr.fit --ckpt_path)."""

from __future__ import annotations

import pickle
import tempfile
import zipfile
from pathlib import Path

import torch

from asr.settings import ConfigError

# beside a sharded folder's torch.distributed.checkpoint files: everything but the weights and optimizer state
METADATA = "meta.pt"
HOLDS = ("state_dict", "hyper_parameters", "tokenizer")  # what every checkpoint of asr.fit and asr.average holds
UNREADABLE = "its shards cannot be read (incomplete, or not written by torch.distributed.checkpoint)"


def missing(checkpoint: dict) -> list[str]:
    """The keys of HOLDS that ``checkpoint`` lacks (none for a checkpoint of asr)."""
    return [key for key in HOLDS if key not in checkpoint]


def load_file(path: str | Path, flag: str) -> dict:
    """A checkpoint file's contents (tensors memory-mapped, no pickled code run); ConfigError naming ``flag``
    and the reason if it is missing or not a whole checkpoint."""
    if not Path(path).is_file():
        raise ConfigError(f"{flag} {path}: no such file")
    if not zipfile.is_zipfile(path):  # torch.save writes zip files; torch's own error talks of mmap
        raise ConfigError(f"{flag} {path}: not a readable checkpoint of asr.fit (not the zip file torch.save "
                          "writes); a copy cut short, or another kind of file?")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        reason = " ".join(str(err).split()).split(". ")[0][:160] or "empty or cut short"  # torch adds advice
        raise ConfigError(f"{flag} {path}: not a readable checkpoint of asr.fit ({type(err).__name__}: "
                          f"{reason}); a copy cut short, or another kind of file?") from err


def precious(output: Path, inputs: list[Path]) -> str:
    """Why writing ``output`` would destroy what a user wants back: it is one of the ``inputs``, or a
    checkpoint a run can resume from (its optimizer and loop state would be lost); "" if neither."""
    if not output.exists():
        return ""
    if any(output.resolve() == Path(p).resolve() for p in inputs):
        return f"{output} is also an input; write the output elsewhere"
    if output.is_dir():
        return f"{output} is a folder (a sharded checkpoint of FSDP?); write the output elsewhere"
    try:
        checkpoint = torch.load(output, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - anything unreadable is not a checkpoint to keep
        return ""
    if isinstance(checkpoint, dict) and "optimizer_states" in checkpoint:
        return (f"{output} is a checkpoint a run resumes from (--ckpt_path); replacing it would lose its "
                "optimizer and loop state: write the output elsewhere")
    return ""


def merge(folder: str | Path) -> dict:
    """The sharded checkpoint ``folder`` as the dict a single-file checkpoint holds (weights, optimizer state
    by parameter index, and meta.pt's keys); ValueError naming ``folder`` if it has no meta.pt or its shards
    cannot be read."""
    from torch.distributed.checkpoint.api import CheckpointException  # here: only a folder needs
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # torch.distributed.checkpoint (48 ms)

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
    from torch.distributed.checkpoint import FileSystemReader  # here, as in merge
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

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
