"""``--model.init_from CKPT``: a new run starts from an earlier model's weights (fine-tuning, another language,
another rate, more data), with its own optimizer and schedule. asr.train.fitting calls ``initialize`` before
training, on every rank, unless the run resumes (--ckpt_path).

What is loaded, per weight (``model.finetune``, asr.train.finetune.FineTune):
- a weight ``include`` and not ``exclude`` selects, of the same shape in the checkpoint: loaded;
- the CTC head, when the data's tokenizer is not the checkpoint's: re-initialised (with ``copy_shared_tokens``, the
  rows of pieces both vocabularies have copied over);
- another shape: the run stops naming every such weight (``mismatched refuse``), or it keeps its fresh
  initialisation (``mismatched reinit``);
- not in the checkpoint, or not selected: left as initialised.
The run says each of these in a few lines, and the input features, when they differ from the checkpoint's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asr.checkpoint import load_file, merge, missing
from asr.settings import ConfigError, dotted
from asr.tokenizer import Tokenizer
from asr.train.finetune import MIN_LOADED_SHARE, FineTune, matches
from asr.train.legacy import current_names
from asr.train.module import ASRModule


def read_weights(path: str) -> dict:
    """``path``'s weights (today's names), tokenizer and hyper-parameters: a checkpoint file of asr.fit or
    asr.average, or a sharded checkpoint folder (asr.checkpoint.merge); ConfigError naming the flag."""
    flag = "--model.init_from"
    if Path(path).is_dir():
        try:
            checkpoint = merge(path)
        except ValueError as err:
            raise ConfigError(f"{flag} {err}") from err
    else:
        checkpoint = load_file(path, flag)
    lacks = missing(checkpoint)
    if lacks:
        raise ConfigError(f"{flag} {path}: not a checkpoint of asr.fit (it has no {', '.join(lacks)})")
    return {"state_dict": current_names(checkpoint["state_dict"]), "tokenizer": Tokenizer(checkpoint["tokenizer"]),
            "hyper_parameters": checkpoint["hyper_parameters"]}


def initialize(module: ASRModule, path: str, finetune: FineTune) -> list[str]:
    """Load ``path``'s weights into ``module`` as the module docstring says; the lines that say what happened.
    ConfigError (nothing loaded) when a selected weight has another shape and ``finetune.mismatched`` is refuse."""
    source = read_weights(path)
    theirs, own = source["state_dict"], module.state_dict()
    new_vocabulary = source["tokenizer"].serialized != module.tokenizer.serialized
    head = {f"model.{name}" for name in module.model.token_rows}
    selected = [name for name in own if name in theirs and finetune.selected(name)]
    renewed = [name for name in selected if new_vocabulary and name in head]
    mismatched = [name for name in selected if name not in renewed and theirs[name].shape != own[name].shape]
    if mismatched and finetune.mismatched == "refuse":
        shapes = "; ".join(f"{name} {tuple(theirs[name].shape)} -> {tuple(own[name].shape)}" for name in mismatched)
        changed = ", ".join(settings_changed(source["hyper_parameters"], module)) or "none"
        raise ConfigError(
            f"--model.init_from {path}: {len(mismatched)} weights differ in shape from this run's model (settings "
            f"that differ: {changed}). Give the checkpoint's settings (its run folder's config.yaml), or "
            "--model.finetune.mismatched reinit to start those weights anew, or leave them out with "
            f"--model.finetune.exclude. The weights: {shapes}")
    loaded = [name for name in selected if name not in renewed and name not in mismatched]
    if not finetune.allow_partial:
        check_selection(own, loaded, finetune, path)
    with torch.no_grad():
        for name in loaded:
            own[name].copy_(theirs[name])
        shared = copy_shared_rows(own, theirs, renewed, source["tokenizer"], module.tokenizer) \
            if finetune.copy_shared_tokens else 0
    lines = [f"--model.init_from {path}: loaded {len(loaded)} of this model's {len(own)} weights "
             f"({count(own, loaded):,} of {count(own, own):,} parameters)"]
    if renewed:
        rows = f", the rows of the {shared} pieces both have copied" if shared else ""
        lines.append(f"  the data's tokenizer ({module.tokenizer.vocab_size} pieces) is not the checkpoint's "
                     f"({source['tokenizer'].vocab_size}): the CTC head is re-initialised{rows}; to keep the "
                     "checkpoint's, --data.tokenizer.model " + path)
    if mismatched:
        lines.append(f"  re-initialised, another shape (model.finetune.mismatched reinit): {names(mismatched)}")
    left = [name for name in own if name not in selected]
    if left:
        lines.append(f"  left as initialised (not in the checkpoint, or not selected by model.finetune.include / "
                     f"exclude): {names(left)}")
    unused = [name for name in theirs if name not in own]
    if unused:
        lines.append(f"  in the checkpoint but not in this model: {names(unused)}")
    features = [c for c in settings_changed(source["hyper_parameters"], module) if c.startswith("features.")]
    if features:
        lines.append(f"  the input features differ from the checkpoint's ({', '.join(features)}): the weights after "
                     "them learnt other inputs (--model.finetune.exclude 'model.encoder.subsampling.*' starts those "
                     "anew)")
    return lines


def check_selection(own: dict, loaded: list[str], finetune: FineTune, path: str) -> None:
    """ConfigError naming the patterns when an include or exclude pattern matches none of this model's weights, or
    when ``loaded`` holds less than MIN_LOADED_SHARE of them (model.finetune.allow_partial lifts both)."""
    unmatched = [f"model.finetune.{field} {pattern!r}" for field in ("include", "exclude")
                 for pattern in getattr(finetune, field) if not any(matches(name, (pattern,)) for name in own)]
    if not unmatched and len(loaded) >= MIN_LOADED_SHARE * len(own):
        return
    groups = sorted({".".join(name.split(".")[:2]) + ".*" for name in own})
    why = (f"{', '.join(unmatched)} {'matches' if len(unmatched) == 1 else 'match'} no weight of this model "
           f"(its weights: {', '.join(groups)})") if unmatched else \
        (f"it would load {len(loaded)} of this model's {len(own)} weights (model.finetune.include "
         f"{list(finetune.include)}, exclude {list(finetune.exclude)}, mismatched {finetune.mismatched}), less than "
         f"{MIN_LOADED_SHARE:.0%}: the patterns, or the checkpoint's settings, are not this model's")
    raise ConfigError(f"--model.init_from {path}: {why}. Correct the pattern, or load what it selects anyway with "
                      "--model.finetune.allow_partial true")


def copy_shared_rows(own: dict, theirs: dict, renewed: list[str], old: Tokenizer, new: Tokenizer) -> int:
    """Copy into the re-initialised head weights ``renewed`` the checkpoint's rows of the pieces ``new`` shares
    with ``old``; how many pieces."""
    old_ids = {old.sp.id_to_piece(i): i for i in range(old.vocab_size)}
    pairs = [(i, old_ids[new.sp.id_to_piece(i)]) for i in range(new.vocab_size) if new.sp.id_to_piece(i) in old_ids]
    if not renewed or not pairs:
        return 0
    rows, sources = (torch.tensor(ids) for ids in zip(*pairs))
    for name in renewed:
        own[name][rows] = theirs[name][sources].to(own[name].dtype)
    return len(pairs)


def settings_changed(hyper_parameters: dict, module: ASRModule) -> list[str]:
    """The model settings that differ between a checkpoint's hyper-parameters and ``module``'s, as
    "encoder.d_model 96 -> 144" (how a run starts, init_from and finetune, left out)."""
    then, now = (dotted(ASRModule.settings(hp)) for hp in (hyper_parameters, dict(module.hparams)))
    return [f"{k} {then.get(k)} -> {now[k]}" for k in now
            if then.get(k) != now[k] and not k.startswith(("init_from", "finetune."))]


def count(own: dict, chosen: list[str] | dict) -> int:
    return sum(own[name].numel() for name in chosen)


def names(weights: list[str], shown: int = 6) -> str:
    """A few weight names and how many more."""
    more = f" and {len(weights) - shown} more" if len(weights) > shown else ""
    return ", ".join(weights[:shown]) + more
