"""Checkpoints and settings of runs made before the settings were grouped (``model.d_model`` ->
``model.encoder.d_model``, ``model.warmup_steps`` -> ``model.schedule.warmup_steps``, ``data.tokenizer_type`` ->
``data.tokenizer.type``), the encoder became a module of its own (``model.blocks.0`` ->
``model.encoder.blocks.0``), a setting was added or a default changed: they load, resume and transcribe as they did.

A checkpoint's ``hyper_parameters`` hold plain values (dicts for the groups), never dataclasses, so that
``torch.load(weights_only=True)`` reads them; ``group_settings`` turns either form into the grouped one.
"""

from __future__ import annotations

import dataclasses
import re
import typing

from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.specaugment import SpecAugmentConfig
from asr.train.schedule import ScheduleConfig

GROUPS = {"features": FeatureConfig, "encoder": EncoderConfig, "spec_augment": SpecAugmentConfig,
          "schedule": ScheduleConfig}
# The data settings grouped after runs were made with them: old flat name -> (group, field).
DATA_GROUPS = {"tokenizer_model": ("tokenizer", "model"), "tokenizer_type": ("tokenizer", "type"),
               "tokenizer_vocab_size": ("tokenizer", "vocab_size"), "min_duration": ("filter", "min_duration"),
               "max_duration": ("filter", "max_duration"), "on_bad_line": ("filter", "on_bad_line"),
               "max_dropped_share": ("filter", "max_dropped_share"), "train_shard_weights": ("shards", "weights"),
               "shard_buffer": ("shards", "buffer"), "shard_stall_seconds": ("shards", "stall_seconds")}
# Flags of settings grouped after many commands, scripts and studies named them: read as the grouped ones.
FLAT_FLAGS = {f"--model.{f.name}": f"--model.schedule.{f.name}" for f in dataclasses.fields(ScheduleConfig)} | {
    f"--data.{name}": f"--data.{group}.{field}" for name, (group, field) in DATA_GROUPS.items()}
# old flat name -> (group, field), where the field's name is not the old one
RENAMED = {"features": ("features", "kind"), "feature_norm": ("features", "norm"),
           "feature_var_floor": ("features", "var_floor"), "feature_stats_db": ("features", "stats_db")}
# What a checkpoint's hyper-parameters (the model section) or a run's config.yaml that lacks a setting ran with, where
# that is not today's default. Each holds every setting there was when it was written, so a setting it lacks came
# later: one added with a default other than the behaviour before it (features.var_floor), or one whose default
# became the default run's (the demo recipe's values, moved into the signatures, issue 62).
BEFORE_THEIR_TIME = {
    "model": {"features": {"var_floor": 0.0, "norm": "bin", "quiet_db": 0.0},
              "encoder": {"d_model": 144, "n_layers": 4, "attention_dropout": 0.0, "subsampling": 4,
                          "attention_window": 0, "conv_channels": 0, "block": "transformer", "conv_kernel": 31},
              "spec_augment": {"freq_warp": 0.0, "freq_warp_jitter": 0.0},
              "inter_ctc": 0.0, "schedule": {"warmup_steps": 200}},
    "data": {"tokenizer": {"type": "char"}, "max_batch_seconds": 60.0, "speed_perturb": [1.0], "cache_audio_mb": 0.0,
             "augmentation": {"noise_prob": 0.0, "noise_snr_db": [5.0, 30.0], "reverb_prob": 0.0,
                              "reverb_rt60": [0.2, 0.8], "gain_prob": 0.0, "telephone_prob": 0.0,
                              "nonspeech_prob": 0.0, "pause_prob": 0.0}},
}
# The first line of a config.yaml that asr.fit wrote into a run folder (LightningCLI's; --print_config's too):
# every setting there was is in it.
WRITTEN_BY_A_RUN = re.compile(r"# (pytorch_lightning|lightning\.pytorch|lightning)==")
# old state_dict prefix -> new
MOVED_WEIGHTS = {"model.subsampling.": "model.encoder.subsampling.", "model.blocks.": "model.encoder.blocks."}


def flat_names() -> dict[str, tuple[str, str]]:
    """Every old flat name of a grouped setting -> (group, field)."""
    names = {f.name: (group, f.name) for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    return names | RENAMED


def regroup(settings: dict) -> dict:
    """Settings named the old, flat way, the grouped way, or both (a model section or hyper-parameters written
    between two groupings) -> grouped: ``{"encoder": {"d_model": 96, ...}, ...}``; a group none of them names is
    left out, ``spec_augment: false`` becomes None."""
    grouped, names = {}, flat_names()
    for name, value in settings.items():
        if name in GROUPS and (value is None or isinstance(value, dict)):  # written grouped
            grouped[name] = None if value is None else {**(grouped.get(name) or {}), **value}
        elif name in names:
            group, field = names[name]
            grouped.setdefault(group, {})[field] = value
        elif name not in GROUPS:
            grouped[name] = value
    if settings.get("spec_augment") is False:
        grouped["spec_augment"] = None
    return grouped


def group_settings(hyper_parameters: dict) -> dict:
    """A checkpoint's hyper-parameters in any form -> the grouped form, with BEFORE_THEIR_TIME for the settings
    it lacks: what that run had."""
    return with_former(regroup(hyper_parameters), BEFORE_THEIR_TIME["model"])


def current_flags(args: list[str]) -> list[str]:
    """Command-line ``args`` with each old flat flag of FLAT_FLAGS (``--model.warmup_steps 10``, or ``=10``) named
    as the grouped one."""
    out = []
    for arg in args:
        flag, sep, value = arg.partition("=")
        out.append(FLAT_FLAGS[flag] + sep + value if flag in FLAT_FLAGS else arg)
    return out


def with_former(settings: dict, former: dict) -> dict:
    """``settings`` (grouped) with each setting of ``former`` that it lacks at its value there; a group that is
    None (spec_augment off) stays None."""
    filled = dict(settings)
    for name, value in former.items():
        if not isinstance(value, dict):
            filled.setdefault(name, value)
        elif filled.get(name, {}) is not None:
            filled[name] = with_former(filled.get(name) or {}, value)
    return filled


def lacking(settings: dict, former: dict, prefix: str = "") -> list[str]:
    """The dotted names of ``former``'s settings that ``settings`` lacks (inside groups that are not None)."""
    names = []
    for name, value in former.items():
        if name not in settings:
            names += [f"{prefix}{name}.{k}" for k in value] if isinstance(value, dict) else [f"{prefix}{name}"]
        elif isinstance(value, dict) and isinstance(settings[name], dict):
            names += lacking(settings[name], value, f"{prefix}{name}.")
    return names


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


def complete_config(config: dict) -> tuple[dict, list[str]]:
    """A run's config.yaml (grouped; one WRITTEN_BY_A_RUN) with BEFORE_THEIR_TIME for the model and data settings
    it lacks, and their dotted names."""
    sections = {name: config.get(name) or {} for name in BEFORE_THEIR_TIME}
    names = [n for name, former in BEFORE_THEIR_TIME.items() for n in lacking(sections[name], former, f"{name}.")]
    if not names:
        return config, []
    return config | {name: with_former(sections[name], former) for name, former in BEFORE_THEIR_TIME.items()}, names


def group_config(config: dict) -> dict | None:
    """A config file's content (config.yaml of a run, or a recipe) in the grouped form, or None if it names no
    setting the old way: the model section ``regroup``ed (the linked sample_rate left out, as the parser links
    it), the data section's augmentation settings under ``data.augmentation`` and DATA_GROUPS' in their groups."""
    model, data = config.get("model") or {}, config.get("data") or {}
    names = flat_names()
    flat_model = any(name in names and not isinstance(value, dict) for name, value in model.items())
    groups = data_groups()
    flat_data = groups.keys() & set(data)
    if not flat_model and not flat_data:
        return None
    grouped = dict(config)
    if flat_model:
        grouped["model"] = regroup(model)
        grouped["model"].get("features", {}).pop("sample_rate", None)
    if flat_data:
        grouped["data"] = {k: v for k, v in data.items() if k not in flat_data}
        for name in sorted(flat_data):
            group, field = groups[name]
            grouped["data"][group] = {**(grouped["data"].get(group) or {}), field: data[name]}
    return grouped


def data_groups() -> dict[str, tuple[str, str]]:
    """Every old flat name of a data setting now in a group -> (group, field): DATA_GROUPS and the augmentation's."""
    from asr.data.augment import Augmentation  # only configs need it

    return DATA_GROUPS | {f.name: ("augmentation", f.name) for f in dataclasses.fields(Augmentation)}
