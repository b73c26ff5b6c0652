"""Checkpoints and settings of runs made before the settings were grouped (``model.d_model`` ->
``model.encoder.d_model``) and the encoder became a module of its own (``model.blocks.0`` ->
``model.encoder.blocks.0``): they load, resume and transcribe as they did.

A checkpoint's ``hyper_parameters`` hold plain values (dicts for the groups), never dataclasses, so that
``torch.load(weights_only=True)`` reads them; ``group_settings`` turns either form into the grouped one.
"""

from __future__ import annotations

import dataclasses
import typing

from asr.audio import FeatureConfig
from asr.models.config import EncoderConfig
from asr.specaugment import SpecAugmentConfig

GROUPS = {"features": FeatureConfig, "encoder": EncoderConfig, "spec_augment": SpecAugmentConfig}
# old flat name -> (group, field), where the field's name is not the old one
RENAMED = {"features": ("features", "kind"), "feature_norm": ("features", "norm"),
           "feature_var_floor": ("features", "var_floor"), "feature_stats_db": ("features", "stats_db")}
# Settings added with a default other than the behaviour before them: what a checkpoint without them ran with.
BEFORE_THEIR_TIME = {("features", "var_floor"): 0.0}
# old state_dict prefix -> new
MOVED_WEIGHTS = {"model.subsampling.": "model.encoder.subsampling.", "model.blocks.": "model.encoder.blocks."}


def flat_names() -> dict[str, tuple[str, str]]:
    """Every old flat name of a grouped setting -> (group, field)."""
    names = {f.name: (group, f.name) for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    return names | RENAMED


def regroup(flat: dict) -> dict:
    """Settings named the old, flat way (a model section or hyper-parameters) -> grouped: ``{"encoder":
    {"d_model": 96, ...}, ...}``; a group none of them names is left out, ``spec_augment: false`` becomes None."""
    grouped, names = {}, flat_names()
    for name, value in flat.items():
        if name in names:
            group, field = names[name]
            grouped.setdefault(group, {})[field] = value
        elif name not in GROUPS:
            grouped[name] = value
    if flat.get("spec_augment") is False:
        grouped["spec_augment"] = None
    return grouped


def group_settings(hyper_parameters: dict) -> dict:
    """A checkpoint's hyper-parameters in either form -> the grouped form. One written before the grouping also
    gets BEFORE_THEIR_TIME: what that run had for settings added since."""
    if any(isinstance(hyper_parameters.get(group), dict) for group in ("features", "encoder")):
        return dict(hyper_parameters)  # written grouped
    grouped = regroup(hyper_parameters)
    for (group, field), value in BEFORE_THEIR_TIME.items():
        if grouped.get(group, {}) is not None:
            grouped.setdefault(group, {}).setdefault(field, value)
    return grouped


def as_setting(annotation, value):
    """A plain dict as the dataclass ``annotation`` names (``X`` or ``X | None``); anything else as it is."""
    if not isinstance(value, dict):
        return value
    cls = next((c for c in (annotation, *typing.get_args(annotation)) if dataclasses.is_dataclass(c)), None)
    if cls is None:
        return value
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in value.items() if k in known})


def current_names(state_dict: dict) -> dict:
    """A state_dict with the weights' names of today's model (MOVED_WEIGHTS applied where they are old)."""
    if any(key.startswith("model.encoder.") for key in state_dict):
        return state_dict
    renamed = {}
    for key, value in state_dict.items():
        new = next((new + key[len(old):] for old, new in MOVED_WEIGHTS.items() if key.startswith(old)), key)
        renamed[new] = value
    return renamed


def group_config(config: dict) -> dict | None:
    """A config file's content (config.yaml of a run, or a recipe) in the grouped form, or None if it names no
    setting the old way: the model section ``regroup``ed (the linked sample_rate left out, as the parser links
    it), the data section's augmentation settings under ``data.augmentation``."""
    from asr.data.augment import Augmentation  # only configs need it

    model, data = config.get("model") or {}, config.get("data") or {}
    names = flat_names()
    flat_model = any(name in names and not isinstance(value, dict) for name, value in model.items())
    augmentation = {f.name for f in dataclasses.fields(Augmentation)} & set(data)
    if not flat_model and not augmentation:
        return None
    grouped = dict(config)
    if flat_model:
        grouped["model"] = regroup(model)
        grouped["model"].get("features", {}).pop("sample_rate", None)
    if augmentation:
        grouped["data"] = {k: v for k, v in data.items() if k not in augmentation}
        grouped["data"]["augmentation"] = {k: data[k] for k in sorted(augmentation)}
    return grouped
