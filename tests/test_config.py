"""One layer of defaults: the signature defaults of model and data (and of their groups of settings: model.encoder,
model.features, model.spec_augment, data.augmentation), configs/trainer.yaml and seed 0 are the default run. It is
what ``python -m asr.fit`` trains and what ``--help`` prints; every shipped recipe and preset names only what differs
from it, so a preset stacked on any recipe changes only what it names.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
from contextlib import redirect_stdout
from functools import cache
from unittest import mock

import pytest
import yaml
from asr.configs import CONFIGS
from asr.data.datamodule import ASRDataModule
from asr.models.config import EncoderConfig
from asr.train.fitting import TRAINER_DEFAULTS, Trainer, main
from asr.train.module import ASRModule

SHIPPED = sorted(p.relative_to(CONFIGS).as_posix() for kind in ("recipes", "model", "data", "strategy")
                 for p in (CONFIGS / kind).glob("*.yaml"))
PRESETS = [name for name in SHIPPED if not name.startswith("recipes/")]
# What a preset is about, named even where it equals the default, so that on any recipe it is that: a size preset's
# size and frame rate, a data preset's rate and features.
SUBJECTS = {"model": {"model.encoder.block", "model.encoder.d_model", "model.encoder.n_heads", "model.encoder.n_layers",
                      "model.encoder.subsampling"},
            "data": {"data.sample_rate", "model.features.kind"}, "strategy": set(), "recipes": set()}


def resolved(*args: str) -> dict:
    """What ``python -m asr.fit ARGS --print_config`` resolves to."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out, mock.patch.object(sys, "argv", ["asr.fit"]):
        main([*args, "--print_config"])
    return yaml.safe_load(out.getvalue())


@cache
def resolved_recipe(recipe: str | None = None) -> dict:
    """What a shipped recipe resolves to; None: the default run."""
    return resolved(*(["--config", str(CONFIGS / recipe)] if recipe else []))


def default_run() -> dict:
    return resolved_recipe()


def shipped(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text()) or {}


def signature_defaults(cls) -> dict:
    """Defaults of ``cls``'s arguments, and of its base's where it passes **kwargs on (asr.fit.Trainer); a group of
    settings (a dataclass, e.g. ASRModule's encoder) as a dict of its fields' values."""
    parameters = inspect.signature(cls).parameters
    inherited = signature_defaults(cls.__base__) if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) else {}
    return inherited | {name: group_fields(p.default) for name, p in parameters.items() if p.default is not p.empty}


def group_fields(value):
    """A dataclass instance (a group of settings) as {field: value}; anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value


def plain(value):
    """YAML lists and Python tuples compare alike, and so do 1 and 1.0."""
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def restated(config: dict, default: dict, prefix: str = "") -> list[str]:
    """The dotted names of ``config``'s settings whose value equals ``default``'s (a resolved config). Under a
    class_path other than the default's, none: the init_args are that class's (a strategy preset spells out its
    options), not the default run's."""
    found = []
    for key, value in config.items():
        name, base = f"{prefix}{key}", default.get(key) if isinstance(default, dict) else None
        base_class = base.get("class_path") if isinstance(base, dict) else base
        if isinstance(value, dict) and "class_path" in value and value["class_path"] != base_class:
            continue
        if isinstance(value, dict) and isinstance(base, dict):
            found += restated(value, base, f"{name}.")
        elif key in (default or {}) and plain(value) == plain(base):
            found.append(name)
    return found


def leaves(config: dict, prefix: str = "") -> dict:
    """{dotted name: value} of a config's settings (a class_path's init_args each on its own)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_restated_finds_a_default_and_ignores_a_change():
    default = default_run()
    encoder = {"d_model": EncoderConfig.d_model, "attention_window": 99}
    assert restated({"model": {"encoder": encoder, "inter_ctc": 0.3}}, default) == ["model.encoder.d_model",
                                                                                    "model.inter_ctc"]
    assert restated({"data": {"speed_perturb": [0.9, 1, 1.1], "augmentation": {"noise_kinds": ["white", "pink", "babble"]}}},
                    default) == ["data.speed_perturb", "data.augmentation.noise_kinds"]
    assert restated({"model": {"spec_augment": None, "features": {"var_floor": 0.0}}}, default) == []
    optimizer = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.001, "weight_decay": 0.5}}
    assert restated({"model": {"optimizer": optimizer}}, default) == ["model.optimizer.class_path",
                                                                      "model.optimizer.init_args.lr"]
    sgd = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.001, "momentum": 0.0}}
    assert restated({"model": {"optimizer": sgd}}, default) == []  # another class: its arguments are its own
    assert restated({"seed_everything": 0, "trainer": {"max_epochs": 50, "devices": 2}}, default) == [
        "seed_everything", "trainer.max_epochs"]


@pytest.mark.parametrize("name", SHIPPED)
def test_no_preset_or_recipe_restates_a_default(name):
    """A setting equal to the default run's would hide where its value comes from, and pin it when the default moves."""
    duplicates = sorted(set(restated(shipped(name), default_run())) - SUBJECTS[name.split("/")[0]])
    assert not duplicates, (f"configs/{name}: {duplicates} equal the default run's (the signature defaults, "
                            "configs/trainer.yaml): delete them there")


def test_the_default_run_is_the_signature_defaults_and_trainer_yaml():
    """No third source: what `python -m asr.fit` resolves to is ASRModule's and ASRDataModule's signature defaults
    (their groups' dataclass defaults, ASRModule's optimizer), the Trainer's with configs/trainer.yaml, and seed 0."""
    run = default_run()
    for section, cls in (("model", ASRModule), ("data", ASRDataModule)):
        defaults = signature_defaults(cls)
        for key, value in run[section].items():
            expected = defaults[key]
            if isinstance(expected, dict) and "class_path" in expected:  # model.optimizer
                assert value["class_path"] == expected["class_path"]
                assert value["init_args"].items() >= expected["init_args"].items()
            elif isinstance(expected, dict):
                assert value.keys() == expected.keys() - {"sample_rate"}, f"{section}.{key}"  # linked from data
                for name, setting in value.items():
                    assert plain(setting) == plain(expected[name]), f"{section}.{key}.{name}"
            elif key not in ("tokenizer", "subsampling", "objective"):  # linked from the model
                assert plain(value) == plain(expected), f"{section}.{key}"
    trainer = signature_defaults(Trainer) | yaml.safe_load(TRAINER_DEFAULTS.read_text())
    for key in ("accelerator", "devices", "max_epochs", "precision", "log_every_n_steps", "num_sanity_val_steps"):
        assert plain(run["trainer"][key]) == plain(trainer[key]), f"trainer.{key}"
    assert run["seed_everything"] == 0


def test_help_prints_the_default_run():
    """`python -m asr.fit --help` describes the model the no-flag run trains."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out, mock.patch.object(sys, "argv", ["asr.fit"]):
        main(["--help"])
    help_text = " ".join(out.getvalue().split())
    run = default_run()
    for flag, value in (("--model.encoder.block", run["model"]["encoder"]["block"]),
                        ("--model.encoder.subsampling", run["model"]["encoder"]["subsampling"]),
                        ("--model.inter_ctc", run["model"]["inter_ctc"]),
                        ("--data.augmentation.noise_prob", run["data"]["augmentation"]["noise_prob"])):
        shown = help_text.rsplit(f"{flag} ", 1)[1].split(" --", 1)[0]  # its entry (after the usage line)
        assert shown.endswith(f"default: {value})"), f"{flag}: {shown}"


@pytest.mark.parametrize("recipe, preset", [(None, preset) for preset in PRESETS] + [
    ("recipes/gpu-100h.yaml", "model/small.yaml"), ("recipes/real-1h-cpu.yaml", "model/conformer-large.yaml"),
    ("recipes/real-1h-cpu.yaml", "data/8khz.yaml"), ("recipes/gpu-1000h.yaml", "strategy/fsdp.yaml")])
def test_a_preset_stacked_on_a_recipe_changes_only_what_it_names(recipe, preset):
    """`--config configs/model/small.yaml` alone is the default run with small's settings, not a third config;
    on a recipe, it changes the recipe's settings it names and nothing else (a class it names comes with its own
    arguments)."""
    before = leaves(resolved_recipe(recipe))
    after = leaves(resolved(*(["--config", str(CONFIGS / recipe)] if recipe else []), "--config", str(CONFIGS / preset)))
    named = leaves(shipped(preset))
    classes = [key.removesuffix("class_path") + "init_args." for key in named if key.endswith(".class_path")]
    changed = {key for key in after if after[key] != before.get(key) and not key.startswith(tuple(classes))}
    assert changed <= named.keys(), f"{preset} on {recipe or 'the default run'} changed {sorted(changed - named.keys())} too"
    for key, value in named.items():
        assert plain(after[key]) == plain(value), f"{preset} on {recipe or 'the default run'}: {key}"


def test_a_config_named_as_the_docs_write_it_resolves_to_the_shipped_file_from_any_folder(tmp_path, monkeypatch):
    from asr.configs import map_configs, resolve

    monkeypatch.chdir(tmp_path)  # no configs/ here: an installed asr run from elsewhere
    shipped_file = str(CONFIGS / "recipes" / "real-1h-cpu.yaml")
    assert resolve("configs/recipes/real-1h-cpu.yaml") == resolve("recipes/real-1h-cpu.yaml") == shipped_file
    assert resolve("configs/recipes/none.yaml") == "configs/recipes/none.yaml"  # left for asr.fit to refuse
    (tmp_path / "configs" / "recipes").mkdir(parents=True)
    (tmp_path / "configs" / "recipes" / "real-1h-cpu.yaml").write_text("trainer: {}\n")
    assert resolve("configs/recipes/real-1h-cpu.yaml") == "configs/recipes/real-1h-cpu.yaml"  # the user's file first
    args = map_configs(["-c", "a", "--x", "1", "--config=b", "--config", "c"], str.upper)
    assert args == ["-c", "A", "--x", "1", "--config=B", "--config", "C"]


def test_the_bar_and_summary_are_lightnings_plain_ones_with_or_without_rich(monkeypatch):
    """rich (which import-linter installs) would switch Lightning to its bar, whose log files keep only the last
    line; asr's Trainer keeps the plain bar everywhere, and the switches still turn each off."""
    from pytorch_lightning.callbacks import ModelSummary, TQDMProgressBar
    from pytorch_lightning.callbacks.rich_model_summary import RichModelSummary

    monkeypatch.setattr("pytorch_lightning.trainer.connectors.callback_connector._RICH_AVAILABLE", True)
    trainer = Trainer(accelerator="cpu", precision="32-true", logger=False)
    assert type(trainer.progress_bar_callback) is TQDMProgressBar
    assert [type(c) for c in trainer.callbacks if isinstance(c, ModelSummary)] == [ModelSummary]
    assert not any(isinstance(c, RichModelSummary) for c in trainer.callbacks)
    quiet = Trainer(accelerator="cpu", precision="32-true", logger=False, enable_progress_bar=False,
                    enable_model_summary=False)
    assert quiet.progress_bar_callback is None and not any(isinstance(c, ModelSummary) for c in quiet.callbacks)
