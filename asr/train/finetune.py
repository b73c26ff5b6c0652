"""Fine-tuning settings (``--model.finetune.*``): which of ``--model.init_from``'s weights to load
(asr.train.init_from) and which weights to hold still for the first steps.

Patterns are shell-style (fnmatch) over the model's weight names: ``model.encoder.subsampling.*`` (the
convolutions after the features), ``model.encoder.blocks.<i>.*`` (block i, from 0 at the input; ``[0-3]`` for
the lower four), ``model.norm.*`` and ``model.head.*`` (the CTC head, one row per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

import torch


PATTERNS = ("include", "exclude", "freeze")  # FineTune's fields that hold patterns
MIN_LOADED_SHARE = 0.5  # of a model's weights (tensors): a run that would load less stops unless allow_partial


@dataclass(frozen=True)
class FineTune:
    """What ``--model.init_from`` loads, and what stays frozen at first.

    Args:
        include: patterns of the weights to load from model.init_from ("*": all); one pattern, or a list.
        exclude: patterns of weights not to load (they keep their fresh initialisation), e.g.
            "model.encoder.subsampling.*" to learn a new front end for other features.
        mismatched: a weight whose shape differs from the checkpoint's (other than the CTC head under a new
            vocabulary, which is always re-initialised): "refuse" stops the run naming every such weight,
            "reinit" keeps its fresh initialisation and says so.
        copy_shared_tokens: under a new vocabulary, copy the CTC head's rows of pieces both tokenizers have (the
            blank included) from the checkpoint; false (the default) re-initialises the whole head, which did
            better (docs/benchmarks.md, 2026-11-26 afternoon).
        freeze: patterns of the weights held still for the first freeze_steps optimizer steps (their
            gradients are dropped; batch-norm statistics still follow the new data).
        freeze_steps: optimizer steps with the freeze patterns' weights held still; 0 = none.
        allow_partial: load what include / exclude select even where a pattern matches no weight of this model, or
            where less than MIN_LOADED_SHARE (half) of its weights would load (a mistyped pattern, the
            checkpoint of another architecture); without it such a run stops naming the patterns.
    """

    include: tuple[str, ...] | str = ("*",)
    exclude: tuple[str, ...] | str = ()
    mismatched: Literal["refuse", "reinit"] = "refuse"
    copy_shared_tokens: bool = False
    freeze: tuple[str, ...] | str = ("model.encoder.*",)
    freeze_steps: int = 0
    allow_partial: bool = False

    def __post_init__(self):
        for name in PATTERNS:  # one pattern may be given alone: --model.finetune.exclude 'model.head.*'
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        if self.freeze_steps < 0:
            raise ValueError(f"model.finetune.freeze_steps must be >= 0, got {self.freeze_steps}")

    def selected(self, name: str) -> bool:
        """Whether weight ``name`` is to be loaded: an include pattern matches it and no exclude pattern does."""
        return matches(name, self.include) and not matches(name, self.exclude)


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def frozen(module: torch.nn.Module, patterns: tuple[str, ...]) -> list[torch.nn.Parameter]:
    """``module``'s parameters whose names match ``patterns``."""
    return [p for name, p in module.named_parameters() if matches(name, patterns)]
