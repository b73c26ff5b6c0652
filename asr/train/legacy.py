"""Checkpoints and settings of runs made before the settings were grouped (``model.d_model`` ->
``model.encoder.d_model``) and the encoder became a module of its own (``model.blocks.0`` ->
``model.encoder.blocks.0``): they load, resume and transcribe as they did.

A checkpoint's ``hyper_parameters`` hold plain values (dicts for the groups), never dataclasses, so that
``torch.load(weights_only=True)`` reads them; ``group_settings`` turns either form into the grouped one.
"""

from __future__ import annotations

import dataclasses
import typing

from asr.audio import FeatureConfig, SpecAugmentConfig
from asr.models.config import EncoderConfig

GROUPS = {"features": FeatureConfig, "encoder": EncoderConfig, "spec_augment": SpecAugmentConfig}
# old flat name -> (group, field), where the field's name is not the old one
RENAMED = {"features": ("features", "kind"), "feature_norm": ("features", "norm"),
           "feature_var_floor": ("features", "var_floor"), "feature_stats_db": ("features", "stats_db")}
# Settings added with a default other than the behaviour before them: what a checkpoint without them ran with.
BEFORE_THEIR_TIME = {("features", "var_floor"): 0.0}
# old state_dict prefix -> new
MOVED_WEIGHTS = {"model.subsampling.": "model.encoder.subsampling.", "model.blocks.": "model.encoder.blocks.",
                 "subsampling.": "encoder.subsampling.", "blocks.": "encoder.blocks."}


def flat_names() -> dict[str, tuple[str, str]]:
    """Every old flat name of a grouped setting -> (group, field)."""
    names = {f.name: (group, f.name) for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    return names | RENAMED


def group_settings(hyper_parameters: dict) -> dict:
    """Hyper-parameters in either form -> the grouped form: ``{"encoder": {"d_model": 96, ...}, ...}``."""
    if any(isinstance(hyper_parameters.get(group), dict) for group in ("features", "encoder")):
        return dict(hyper_parameters)  # already grouped
    grouped: dict = {group: {} for group in GROUPS}
    names = flat_names()
    for name, value in hyper_parameters.items():
        if name in names:
            group, field = names[name]
            grouped[group][field] = value
        elif name not in GROUPS:
            grouped[name] = value
    for (group, field), value in BEFORE_THEIR_TIME.items():
        grouped[group].setdefault(field, value)
    if hyper_parameters.get("spec_augment") is False:
        grouped["spec_augment"] = None
    return grouped


def as_setting(annotation, value):
    """A plain dict as the dataclass ``annotation`` names (``X`` or ``X | None``); anything else as it is."""
    if not isinstance(value, dict):
        return value
    cls = next((c for c in (annotation, *typing.get_args(annotation)) if dataclasses.is_dataclass(c)), None)
    if cls is None:
        return value
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items() if k in known})


def current_names(state_dict: dict) -> dict:
    """A state_dict with the weights' names of today's model (MOVED_WEIGHTS applied where they are old)."""
    if any(key.startswith(("model.encoder.", "encoder.")) for key in state_dict):
        return state_dict
    renamed = {}
    for key, value in state_dict.items():
        new = next((new + key[len(old):] for old, new in MOVED_WEIGHTS.items() if key.startswith(old)), key)
        renamed[new] = value
    return renamed


def group_config(config: dict) -> dict | None:
    """A config file's content (config.yaml of a run, or a recipe) in the grouped form, or None if it needs no
    change: the model section as ``group_settings``, the data section's augmentation settings under
    ``data.augmentation``."""
    from asr.data.augment import Augmentation  # only configs need it

    model, data = config.get("model") or {}, config.get("data") or {}
    flat_model = set(model) & (set(flat_names()) - set(GROUPS)) or (model.get("features") is not None
                                                                       and not isinstance(model["features"], dict))
    augmentation = {f.name for f in dataclasses.fields(Augmentation)} & set(data)
    if not flat_model and not augmentation:
        return None
    grouped = dict(config)
    if flat_model:
        grouped["model"] = {k: v for k, v in group_settings(model).items() if v != {} and k != "sample_rate"}
        if "spec_augment" in grouped["model"] and grouped["model"]["spec_augment"] is True:
            del grouped["model"]["spec_augment"]
        features = grouped["model"].get("features")
        if isinstance(features, dict):
            features.pop("sample_rate", None)
        if "feature_var_floor" not in model and isinstance(features, dict):
            features.pop("var_floor", None)  # a config that did not say keeps today's default, as the run did then
    if augmentation:
        grouped["data"] = {k: v for k, v in data.items() if k not in augmentation}
        grouped["data"]["augmentation"] = {k: data[k] for k in sorted(augmentation)}
    return grouped
