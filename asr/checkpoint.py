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
