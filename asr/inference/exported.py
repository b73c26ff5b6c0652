"""A model written by ``python -m asr.export`` (asr.tools.exporting), read back for transcription: ``load``.

The file is a ``torch.export`` program (ATen graph plus weights; ``load`` imports no network from ``asr.models``, only
its decoding of frames, and refuses files whose loading would unpickle code) of the whole network in fp32 eval mode:
the feature front end (STFT, log-mel or log-linear, normalisation), the encoder and the CTC head. A transducer's file
(model.objective transducer or hybrid) holds three: the network to its frames (the encoder's states in the joint space,
after the hybrid's CTC log-probs), the prediction network's one-token step and the joiner of one lattice point, which
asr.models.transducer_decoding decodes with; ``asr.json``'s format names the objective (``asr-ctc-export``,
``asr-transducer-export``, ``asr-hybrid-export``).
Batch size and audio length are dynamic. Its inputs are the audio, the lengths and, since format version 2, the
samples whose frames give each utterance's normalisation statistics (the second pass of asr.inference.focus);
files of version 1 (audio and lengths only) still load, and their second pass runs on the speech's audio alone.
Beside the graph, as the archive's extra files, it carries what decoding needs: ``asr.json`` (sample rate,
seconds per output frame, ...) and the sentencepiece model (``tokenizer.model.b64``, base64: extra files are text).

    from asr.inference.exported import load
    model = load("model.pt2")
    log_probs, out_lengths = model.log_probs(audio, lengths)   # (B, N) samples -> (B, T', V), (B,)
    log_probs, out_lengths = model.log_probs(audio, lengths, statistics)  # statistics from samples (B, 2) [start, end)
    texts = [model.tokenizer.decode(ids) for ids in asr.models.ctc_decoding.greedy(log_probs, out_lengths)]
    # a transducer's file: model.objective decodes its frames (model.objective.decode(log_probs, out_lengths))
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from asr.tokenizer import Tokenizer

FORMAT = "asr-ctc-export"  # asr.json's "format" of a CTC model
FORMATS = {"ctc": FORMAT, "transducer": "asr-transducer-export", "hybrid": "asr-hybrid-export"}  # model.objective's
FORMAT_VERSION = 2  # 2: the graph takes ``statistics``; 1 (audio and lengths only, CTC's only) is still read
READS = (1, FORMAT_VERSION)
METADATA_FILE = "asr.json"
TOKENIZER_FILE = "tokenizer.model.b64"


@dataclass
class ExportedModel:
    """An exported model ready to decode; the same members as asr.transcribe's checkpoint adapter."""

    program: nn.Module  # the exported graph: (audio (B, N) fp32, lengths (B,) int64, statistics (B, 2) int64)
    # -> (log_probs, out_lengths)
    sample_rate: int  # Hz the audio must have
    tokenizer: Tokenizer  # output class i is piece i; class 0 is the CTC blank
    frame_seconds: float  # seconds of audio per output frame (feature hop x subsampling)
    min_samples: int  # narrower batches are zero-padded to this width (the graph's lower bound)
    device: torch.device
    objective: object = None  # a transducer's decoding (asr.models.transducer_decoding); None: CTC's (Transcriber)

    @torch.inference_mode()
    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor, statistics: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """audio (B, N) float samples at ``sample_rate``, lengths (B,) in samples ->
        log_probs (B, T', V) fp32 (a transducer's frames, (B, T', [V +] J)) and out_lengths (B,) in output frames.
        ``statistics`` (B, 2): the samples [start, end) whose frames alone give each utterance's feature statistics;
        None: all of its samples.

        Frames at or past ``out_lengths[b]`` are padding: their values mean nothing, and T'
        follows the padded width N, so it may exceed ``max(out_lengths)``.
        """
        lengths = lengths.to(self.device, torch.int64)
        if statistics is None:
            statistics = torch.stack([torch.zeros_like(lengths), lengths], 1)
        return self.program(self.widened(audio), lengths, statistics.to(self.device, torch.int64))

    def widened(self, audio: torch.Tensor) -> torch.Tensor:
        """fp32 on the device, zero-padded to ``min_samples`` if narrower (padding past the lengths changes no
        frame)."""
        audio = audio.to(self.device, torch.float32)
        return F.pad(audio, (0, self.min_samples - audio.shape[1])) if audio.shape[1] < self.min_samples else audio


class ExportedModelV1(ExportedModel):
    """A file of format version 1: its graph takes the audio and lengths only, so its statistics are always of the
    whole utterance (and the Transcriber's second pass runs on the speech's audio alone)."""

    @torch.inference_mode()
    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.program(self.widened(audio), lengths.to(self.device, torch.int64))


def is_exported(path: str | Path) -> bool:
    """True if ``path`` is a file written by ``python -m asr.export`` (not a training checkpoint)."""
    try:
        with zipfile.ZipFile(path) as archive:  # a torch.save checkpoint is a zip too: look inside
            return any(name.endswith(f"/extra/{METADATA_FILE}") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def load(path: str | Path, device: str | torch.device = "cpu") -> ExportedModel:
    """Read a file written by ``python -m asr.export``; imports no network from asr.models (its decoding only)."""
    from torch.export.pt2_archive._package import load_pt2  # what torch.export.load reads a file with

    if not is_exported(path):
        raise ValueError(f"{path} is not a file written by python -m asr.export (no {METADATA_FILE} inside)")
    refuse_pickled_code(path)
    with open(path, "rb") as f:  # a file object: by name, torch.export.load wants a .pt2 suffix
        contents = load_pt2(f)
    meta = json.loads(contents.extra_files[METADATA_FILE])
    objective = objective_of(meta, path)
    device = torch.device(device)
    programs = {name: torch.export.passes.move_to_device_pass(program, device) if device.type != "cpu" else program
                for name, program in contents.exported_programs.items()}
    tokenizer = Tokenizer(base64.b64decode(contents.extra_files[TOKENIZER_FILE]))
    kind = ExportedModel if meta["version"] == FORMAT_VERSION else ExportedModelV1
    model = kind(programs["model"].module(), meta["sample_rate"], tokenizer, meta["frame_seconds"],
                 meta["min_samples"], device)
    if objective != "ctc":
        model.objective = transducer_decoding(programs, meta["decoder"], device)
    return model


def objective_of(meta: dict, path: str | Path) -> str:
    """The objective (a key of FORMATS) of a file's asr.json; ValueError naming the file if this asr cannot read it."""
    objective = next((name for name, fmt in FORMATS.items() if fmt == meta.get("format")), None)
    versions = READS if objective == "ctc" else (FORMAT_VERSION,)
    if objective is None or meta.get("version") not in versions:
        others = ", ".join(fmt for fmt in FORMATS.values() if fmt != FORMAT)
        raise ValueError(f"{path}: format {meta.get('format')} version {meta.get('version')}; this asr reads "
                         f"{FORMAT} versions {', '.join(map(str, READS))} and {others} version {FORMAT_VERSION}: "
                         "export the checkpoint again")
    return objective


def transducer_decoding(programs: dict, decoder: dict, device: torch.device):
    """asr.models.transducer_decoding's decoding of an exported transducer's prediction network and joiner graphs."""
    from asr.models.transducer_decoding import TransducerDecoding

    return TransducerDecoding(programs["predictor"].module(), programs["joiner"].module(),
                              tuple(decoder["state_shape"]), decoder["ctc_width"], decoder["max_symbols"],
                              decoder["beam_size"], device=lambda: device)


def refuse_pickled_code(path: str | Path) -> None:
    """Raise ValueError unless ``path``'s tensors load without unpickling code.

    torch.export.load unpickles (``weights_only=False``) any weight or constant marked
    ``use_pickle`` and custom objects, and falls back to it for sample inputs that a
    weights-only load refuses: a crafted file could run code. asr.export writes none of these.
    """
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith("_config.json") and "/data/" in name:
                for fqn, payload in json.loads(archive.read(name)).get("config", {}).items():
                    if payload.get("use_pickle") or not payload.get("path_name", "").startswith(("weight_", "tensor_")):
                        raise ValueError(f"{path}: {fqn} would be unpickled; asr.export never writes that")
            elif "/data/sample_inputs/" in name:
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as err:  # UnpicklingError, or whatever a malformed file raises
                    raise ValueError(f"{path}: its sample inputs need unpickling ({err})") from err
