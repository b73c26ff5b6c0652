"""The objective seam: what training minimises, the network it trains, and how that network's frames become token
ids, word times and cut points. What a model's output means is the models' own, so the layers above ask it here:
the data its length rule, training its loss, inference its decoding.

    objective.network(features, encoder, vocab_size, spec_augment, checkpoint_every) -> the nn.Module it trains
    objective(model, batch, training) -> Loss(objective to minimise, summed loss of the output, frames, lengths)
    objective.frames_needed(ids) -> encoder frames an utterance needs to be trained on with these ids (data's rule)
    objective.decoding(model) -> what inference asks (the Decoding protocol below), bound to the model's weights

    decoding.decode(frames, lengths) -> token ids per utterance (what WER/CER are scored on; greedy)
    decoding.decoder(tokenizer, beam_size, lm, **options) -> a decoder of the same form (beam search)
    decoding.align(frames, ids, first_frame) -> token spans on one utterance's frames (word times, confidences)
    decoding.silent_frames(frames) -> how many frames emit nothing (a Result's blank_share)
    decoding.cut(frames, lo, hi) -> a frame in [lo, hi) where a long recording's frames may be split

What flows from network to objective are its *frames*: per encoder frame, what the objective reads. For CTC they
are the log-probabilities (B, T', V); for a transducer (asr.models.transducer_objectives) the encoder states in the
joiner's space. asr.inference asks the model's decoding (AcousticModel.objective) for everything above, never CTC's
functions by name; CTC's are asr.models.ctc_decoding's (beam search with a language model, BeamSearch, its own), a
transducer's asr.models.transducer_decoding's.

``--model.objective`` names the objective: a key of OBJECTIVES or a class path ``package.module:Class``. Its
constructor's arguments are ASRModule settings of the same names (CTC takes ``inter_ctc``, the transducers
``transducer`` and ``inter_ctc``); a setting that no argument of the chosen objective names must be left at its
default.
A new objective is a class in a file of its own with these methods, and one line in OBJECTIVES.

``CTC`` is today's. Intermediate CTC (Lee and Watanabe 2021, ``with_inter_ctc``) is any objective's that takes
``inter_ctc``: a CTC loss on the middle block's output beside the final objective's. Loss and log-softmax are
fp32; a loss is a sum over the batch, so ASRModule divides by the global batch's tokens (a per-token mean over all
ranks).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Literal, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from asr.models.config import EncoderConfig
from asr.models.ctc import CTCModel
from asr.models.ctc_decoding import Decoder, Span, align, blank_cut, blank_frames, greedy, make_decoder
from asr.models.features import FeatureConfig
from asr.models.specaugment import SpecAugment
from asr.tokenizer import BLANK_ID, Tokenizer

# --model.objective -> "module:Class", imported only when chosen; a value with a ":" is a class path itself (the
# paths of before the objectives moved here, asr.train.objectives and asr.train.transducer, import: asr.MOVED)
OBJECTIVES: dict[str, str] = {
    "ctc": "asr.models.objectives:CTC",
    "transducer": "asr.models.transducer_objectives:Transducer",
    "hybrid": "asr.models.transducer_objectives:Hybrid",
}


class Loss(NamedTuple):
    objective: torch.Tensor  # () what to minimise, summed over the batch
    loss_sum: torch.Tensor  # () the output's own loss, summed over the batch (what train/loss logs)
    frames: torch.Tensor  # (B, T', *) what decoding reads (CTC: log-probs (B, T', V))
    lengths: torch.Tensor  # (B,) encoder frames


class LabelledBatch(Protocol):
    """What an objective reads of a batch (asr.data.batch.Batch, the one shape every loader gives, has it)."""

    @property
    def audio(self) -> torch.Tensor: ...  # (B, n) float32 waveforms, zero-padded

    @property
    def audio_lengths(self) -> torch.Tensor: ...  # (B,) samples

    @property
    def tokens(self) -> torch.Tensor: ...  # (B, L) int64 token ids, padded with the blank

    @property
    def token_lengths(self) -> torch.Tensor: ...  # (B,)


class Decoding(Protocol):
    """What inference asks of a model's objective (asr.inference.acoustic.AcousticModel.objective)."""

    def decode(self, frames: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]: ...

    def decoder(self, tokenizer: Tokenizer, beam_size: int = 1, lm: str | None = None, **options) -> Decoder: ...

    def align(self, frames: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]: ...

    def silent_frames(self, frames: torch.Tensor) -> int: ...

    def cut(self, frames: torch.Tensor, lo: int, hi: int) -> int: ...


class Objective(Decoding, Protocol):
    def network(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int,
                spec_augment: SpecAugment | None, checkpoint_every: int) -> nn.Module:
        """The network this objective trains: features, encoder and its head(s). Its forward takes (audio, lengths,
        middle=False, statistics=None) and gives (frames, lengths); it has ``sample_rate``, ``frame_seconds``,
        ``encoder_frames``, ``forward_flops`` and ``token_rows`` as asr.models.ctc.CTCModel has."""

    def __call__(self, model: nn.Module, batch: LabelledBatch, training: bool) -> Loss: ...

    @staticmethod
    def frames_needed(ids: list[int]) -> int:
        """Encoder frames an utterance must give for this objective to train on the token ids ``ids``."""

    def decoding(self, model: nn.Module) -> Decoding:
        """What inference asks, decoding with ``model``'s weights (this objective's network)."""


def objective_class(name: str, flag: str = "model.objective") -> type:
    """The class ``name`` stands for (a key of OBJECTIVES, or ``module:Class``); ValueError naming ``flag``."""
    path = OBJECTIVES.get(name, name)
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"{flag} {name!r}: not one of {', '.join(OBJECTIVES)}, nor a class path module:Class")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{flag} {name!r}: cannot import {path} ({err})") from err


def build_objective(name: str, settings: dict, defaults: dict) -> Objective:
    """The objective ``name`` made from the ``settings`` its constructor names; ValueError for a setting given
    (not at its ``defaults`` value) that it does not take."""
    cls = objective_class(name)
    takes = inspect.signature(cls).parameters
    unread = [k for k, v in settings.items() if k not in takes and v != defaults[k]]
    if unread:
        raise ValueError(f"model.{unread[0]} is not read by model.objective {name}: leave it at its default "
                         f"({defaults[unread[0]]!r}) or choose an objective that takes it")
    return cls(**{k: v for k, v in settings.items() if k in takes})


class CTC:
    """CTC on the model's output; in training with ``inter_ctc`` = w > 0, (1 - w) x that + w x the CTC loss of
    the middle block's output through the same head. Decoding is greedy (best path); beam search optionally with
    an n-gram LM (asr.models.ctc_decoding)."""

    def __init__(self, inter_ctc: float = 0.0):
        self.inter_ctc = inter_ctc_weight(inter_ctc)

    def network(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int,
                spec_augment: SpecAugment | None, checkpoint_every: int) -> CTCModel:
        return with_middle_block(CTCModel(features, encoder, vocab_size, spec_augment, checkpoint_every), encoder,
                                 self.inter_ctc)

    def __call__(self, model: nn.Module, batch: LabelledBatch, training: bool) -> Loss:
        weight = self.inter_ctc if training else 0.0
        log_probs, lengths, *middle = model(batch.audio, batch.audio_lengths, middle=weight > 0)
        loss_sum = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lengths, reduction="sum")
        objective = with_inter_ctc(loss_sum, middle[0], lengths, batch, weight) if middle else loss_sum
        return Loss(objective, loss_sum, log_probs, lengths)

    @staticmethod
    def frames_needed(ids: list[int]) -> int:
        """One frame per token, and a blank between repeats."""
        return len(ids) + sum(a == b for a, b in zip(ids, ids[1:]))

    def decoding(self, model: nn.Module) -> "CTC":
        return self  # CTC decodes the log-probs alone

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
        return greedy(log_probs, lengths)

    def decoder(self, tokenizer: Tokenizer, beam_size: int = 1, lm: str | None = None, **options) -> Decoder:
        """asr.models.ctc_decoding.make_decoder: greedy, or beam search with an optional n-gram LM."""
        return make_decoder(tokenizer, beam_size, lm, **options)

    def align(self, frames: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]:
        """CTC forced alignment of ``ids`` on one utterance's (T', V) log-probs (asr.models.ctc_decoding.align)."""
        return align(frames, ids, first_frame)

    def silent_frames(self, frames: torch.Tensor) -> int:
        """Frames whose most likely class is the blank."""
        return blank_frames(frames)

    def cut(self, frames: torch.Tensor, lo: int, hi: int) -> int:
        """The middle of the longest run of blank frames in [lo, hi) (asr.models.ctc_decoding.blank_cut)."""
        return blank_cut(frames, lo, hi)


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor,
             reduction: Literal["mean", "sum"] = "mean", zero_infinity: bool = False):
    """CTC loss in fp32, summed over the batch, and with "mean" divided by its target tokens (a per-token mean).
    ``zero_infinity``: an utterance whose frames are too few for its tokens adds 0 (and no gradient), not inf."""
    loss = F.ctc_loss(log_probs.float().transpose(0, 1), tokens, lengths, token_lengths, blank=BLANK_ID,
                      reduction="sum", zero_infinity=zero_infinity)
    return loss if reduction == "sum" else loss / token_lengths.sum().clamp(min=1)


def inter_ctc_weight(inter_ctc: float) -> float:
    """model.inter_ctc, the weight w of intermediate CTC, if it is in [0, 1); else ValueError naming it."""
    if not 0.0 <= inter_ctc < 1.0:
        raise ValueError(f"model.inter_ctc must be in [0, 1), got {inter_ctc:g}")
    return inter_ctc


def with_middle_block(model: nn.Module, encoder: EncoderConfig, inter_ctc: float) -> nn.Module:
    """``model`` (of ``encoder``'s shapes), if its encoder has the middle block that intermediate CTC of weight
    ``inter_ctc`` > 0 reads; else ValueError naming model.encoder.n_layers and model.inter_ctc."""
    if inter_ctc and model.encoder.middle_block < 0:
        raise ValueError(f"model.inter_ctc needs a middle block, so model.encoder.n_layers >= 2, got "
                         f"{encoder.n_layers} (with model.inter_ctc {inter_ctc}; model.inter_ctc 0 turns it "
                         "off)")
    return model


def with_inter_ctc(objective: torch.Tensor, middle: torch.Tensor, lengths: torch.Tensor, batch: LabelledBatch,
                   weight: float, zero_infinity: bool = False) -> torch.Tensor:
    """Intermediate CTC (Lee and Watanabe 2021) beside any final objective: (1 - w) x ``objective`` + w x the summed
    CTC loss of ``middle``, the middle block's log-probabilities (B, T', V) through a CTC head (ctc_loss's
    ``zero_infinity``)."""
    middle_loss = ctc_loss(middle, lengths, batch.tokens, batch.token_lengths, "sum", zero_infinity)
    return (1 - weight) * objective + weight * middle_loss
