"""The models asr.transcribe runs: the AcousticModel protocol, and loading one from a file.

``load_model`` reads a model written by ``asr.export`` or a checkpoint of ``asr.fit``, a file or a
sharded folder (with ``torch.load(weights_only=True)``: no pickled code runs) and names the file in
one line if it is neither.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Protocol

import torch

from asr.checkpoint import METADATA
from asr.inference import exported
from asr.tokenizer import Tokenizer
from asr.train.module import ASRModule


class CheckpointError(ValueError):
    """A --checkpoint that does not exist or is not a checkpoint of asr.fit / a model of asr.export."""


class AcousticModel(Protocol):
    """What the Transcriber needs from a model (a checkpoint, an exported model, or your own)."""

    sample_rate: int  # Hz of the audio log_probs expects
    tokenizer: Tokenizer  # output class i is tokenizer piece i; 0 is the CTC blank
    frame_seconds: float  # seconds per output frame: feature hop x subsampling
    # and optionally ``objective`` (asr.models.objectives.Decoding): how its frames become ids, word times and cut
    # points; a model without one is CTC's (a CTC export, or your own); and optionally a ``statistics`` argument of
    # log_probs (CheckpointModel's, ExportedModel's), without which a second pass runs on the speech's audio alone
    # (asr.inference.focus)

    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio (B, n) fp32 and lengths (B,) in samples -> the model's frames (B, T', *) fp32 on the CPU and lengths
        (B,): CTC's log-probs (B, T', V), or what another objective decodes (a transducer's: asr.models.transducer).
        The name is CTC's, kept for the models written against it."""
        ...


class CheckpointModel:
    """AcousticModel of an ASRModule (a checkpoint of asr.fit), in eval mode on ``device``."""

    def __init__(self, module: ASRModule, device: str | torch.device = "cpu"):
        self.module, self.device = module.to(device).eval(), torch.device(device)
        self.sample_rate: int = module.model.sample_rate
        self.tokenizer: Tokenizer = module.tokenizer
        self.frame_seconds: float = module.model.frame_seconds
        self.objective = module.decoding  # how its frames become ids, word times and cut points

    @torch.inference_mode()
    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor, statistics: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """As AcousticModel's; ``statistics`` (B, 2): the samples [start, end) whose frames alone give each
        utterance's feature statistics (asr.models.features.FeatureExtractor)."""
        statistics = None if statistics is None else statistics.to(self.device)
        log_probs, out_lengths = self.module.model(audio.to(self.device), lengths.to(self.device),
                                                   statistics=statistics)
        return log_probs.float().cpu(), out_lengths.cpu()


def load_model(path: str | Path, device: str = "cpu") -> AcousticModel:
    """A model written by asr.export, or a checkpoint of asr.fit (a file, or a sharded folder of FSDP); anything
    else raises CheckpointError."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path}: no such file")
    if path.is_dir() and not (path / METADATA).is_file():
        raise CheckpointError(f"checkpoint {path}: a folder, not a sharded checkpoint (it has no {METADATA})")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:  # e.g. cuda on a machine without a GPU: the device, not the file
        raise CheckpointError(f"--device {device}: {str(err).splitlines()[0]}") from err
    try:
        if exported.is_exported(path):
            return exported.load(path, device)
        return CheckpointModel(ASRModule.from_checkpoint(path, map_location=device), device)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, OSError, KeyError, TypeError, ValueError,
            RuntimeError) as err:  # what torch.load and load_state_dict raise for a file that is not ours
        reason = " ".join(str(err).split()).split(". ")[0] or "empty or cut short"  # torch adds pages of advice
        raise CheckpointError(f"checkpoint {path}: not a checkpoint of asr.fit or a model of asr.export "
                              f"({type(err).__name__}: {reason})") from err
