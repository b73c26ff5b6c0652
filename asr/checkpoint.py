"""Reading asr's checkpoint files: one reader that names the flag that gave the path, and the layout of a sharded
checkpoint folder (what Lightning's ModelParallelStrategy writes with ``save_distributed_checkpoint: true``)."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from asr.settings import ConfigError

# beside a sharded folder's torch.distributed.checkpoint files: everything but the weights and optimizer state
METADATA = "meta.pt"
HOLDS = ("state_dict", "hyper_parameters", "tokenizer")  # what every checkpoint of asr.fit and asr.average holds


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
