"""configs/recipes/demo.yaml: the model and data defaults are ASRModule's and ASRDataModule's signatures, with their
groups of settings (model.encoder, model.features, model.spec_augment, data.augmentation) the defaults of those
dataclasses; the file states only what the bundled demo changes, each with a comment saying why, so a default lives
in one place.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import re
from contextlib import redirect_stdout

import pytest
import yaml
from asr.configs import CONFIGS
from asr.data.module import ASRDataModule
from asr.models.config import EncoderConfig
from asr.train.fit import DEFAULT_CONFIG, Trainer, main
from asr.train.module import ASRModule

SECTIONS = {"model": ASRModule, "data": ASRDataModule, "trainer": Trainer}


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


def groups(cls) -> set[str]:
    """The arguments of ``cls`` that are groups of settings (model.encoder, data.augmentation, ...)."""
    return {name for name, value in signature_defaults(cls).items() if isinstance(value, dict)}


def plain(value):
    """YAML lists and Python tuples compare alike; a class compares as its dotted path (a YAML class_path)."""
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    return f"{value.__module__}.{value.__qualname__}" if inspect.isclass(value) else value


def restated(settings: dict, cls) -> list[str]:
    """The keys of ``settings`` whose value equals ``cls``'s default, those of a group of settings (dotted) whose value
    equals the group's default, and class_path/init_args that restate theirs."""
    defaults, found = signature_defaults(cls), []
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(defaults.get(key), dict):  # a group: model.encoder, data.augmentation
            group = defaults[key]
            found += [f"{key}.{k}" for k, v in value.items() if k in group and plain(group[k]) == plain(v)]
        elif isinstance(value, dict) and "class_path" in value:  # e.g. model.optimizer: its init_args against its class
            module, name = value["class_path"].rsplit(".", 1)
            target = getattr(importlib.import_module(module), name)
            found += [f"{key}.init_args.{k}" for k in restated(value.get("init_args") or {}, target)]
            if plain(defaults.get(key)) == value["class_path"] and not value.get("init_args"):
                found.append(key)
        elif key in defaults and plain(defaults[key]) == plain(value):
            found.append(key)
    return found


def test_restated_finds_a_default_and_ignores_a_change():
    encoder = {"d_model": EncoderConfig.d_model, "attention_window": 99}
    assert restated({"encoder": encoder, "inter_ctc": 0.0}, ASRModule) == ["encoder.d_model", "inter_ctc"]
    assert restated({"speed_perturb": [1.0], "augmentation": {"noise_kinds": ["white", "pink", "babble"]}},
                    ASRDataModule) == ["speed_perturb", "augmentation.noise_kinds"]
    assert restated({"spec_augment": None, "features": {"var_floor": 0.0}}, ASRModule) == []
    optimizer = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.001, "weight_decay": 0.5}}
    assert restated({"optimizer": optimizer}, ASRModule) == ["optimizer.init_args.lr"]


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_demo_recipe_restates_no_signature_default(section):
    settings = yaml.safe_load(DEFAULT_CONFIG.read_text()).get(section) or {}
    duplicates = restated(settings, SECTIONS[section])
    assert not duplicates, (f"configs/recipes/demo.yaml {section}: {duplicates} equal {SECTIONS[section].__name__}'s "
                            "defaults; delete them there (the signature is the one source)")


def test_each_model_and_data_setting_of_the_demo_recipe_says_why():
    """Each setting of model and data, and of their groups (model.encoder.block, data.augmentation.noise_prob, ...)."""
    section, group, silent = None, None, []
    for line in DEFAULT_CONFIG.read_text().splitlines():
        if re.match(r"\w", line):
            section, group = line.split(":")[0], None
        if section not in ("model", "data"):
            continue
        if key := re.match(r"  (\w+):(.*)", line):
            name, value = f"{section}.{key.group(1)}", key.group(2)
            group = name if key.group(1) in groups(SECTIONS[section]) else None
        elif group and (key := re.match(r"    (\w+):(.*)", line)):
            name, value = f"{group}.{key.group(1)}", key.group(2)
        else:
            continue
        if value.strip() and "#" not in line:
            silent.append(name)
    assert not silent, f"configs/recipes/demo.yaml: {silent} differ from the signature default without a comment saying why"


def test_the_default_run_is_the_signatures_with_the_demo_recipe_on_top():
    """No third source: what `python -m asr.fit` resolves to is the signature defaults plus the demo recipe."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        main(["--print_config"])
    resolved, written = yaml.safe_load(out.getvalue()), yaml.safe_load(DEFAULT_CONFIG.read_text())
    for section in ("model", "data"):
        defaults = signature_defaults(SECTIONS[section])
        expected = defaults | written[section]
        for key, value in resolved[section].items():
            if key == "optimizer":
                assert value["class_path"] == written[section][key]["class_path"]
                assert value["init_args"].items() >= written[section][key]["init_args"].items()
            elif key in groups(SECTIONS[section]) and isinstance(value, dict):  # the group's defaults, then the file's
                group = defaults[key] | (written[section].get(key) or {})
                assert value.keys() <= group.keys(), f"{section}.{key}: {sorted(value.keys() - group.keys())}"
                for name, setting in value.items():
                    assert plain(setting) == plain(group[name]), f"{section}.{key}.{name}"
            else:
                assert plain(value) == plain(expected[key]), f"{section}.{key}"


def resolved_model(*args: str) -> dict:
    """The model section ``python -m asr.fit ARGS --print_config`` resolves to (configs/recipes/demo.yaml first)."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        main([*args, "--print_config"])
    return yaml.safe_load(out.getvalue())["model"]


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")))
def test_a_size_preset_keeps_its_block_over_the_demo_recipe(preset):
    """the demo recipe's Conformer must not turn `--config configs/model/small.yaml` (the README's own-data command,
    asr.bench's presets) into a Conformer, nor give the larger Conformers its 7-frame convolution or 8x subsampling: stacked on it."""
    model = resolved_model("--config", str(DEFAULT_CONFIG), "--config", str(CONFIGS / "model" / f"{preset}.yaml"))
    assert model["encoder"]["block"] == ("conformer" if preset.startswith("conformer") else "transformer")
    if preset in ("conformer-small", "conformer-base"):
        assert model["encoder"]["conv_kernel"] == EncoderConfig.conv_kernel
    if preset != "conformer-tiny":  # the demo recipe's own model; the others keep their front end and its windows
        own = yaml.safe_load((CONFIGS / "model" / f"{preset}.yaml").read_text())["model"]["encoder"]
        assert model["encoder"]["subsampling"] == own["subsampling"]
        assert model["encoder"]["conv_channels"] == own["conv_channels"]
        assert model["encoder"]["attention_window"] == own["attention_window"]


def test_the_default_run_trains_conformer_tiny():
    """configs/model/conformer-tiny.yaml says it is the default run's model: stacking it changes nothing."""
    tiny = CONFIGS / "model" / "conformer-tiny.yaml"
    assert resolved_model("--config", str(DEFAULT_CONFIG), "--config", str(tiny)) == resolved_model()


def test_a_config_named_as_the_docs_write_it_resolves_to_the_shipped_file_from_any_folder(tmp_path, monkeypatch):
    from asr.configs import map_configs, resolve

    monkeypatch.chdir(tmp_path)  # no configs/ here: an installed asr run from elsewhere
    shipped = str(CONFIGS / "recipes" / "demo.yaml")
    assert resolve("configs/recipes/demo.yaml") == resolve("recipes/demo.yaml") == shipped
    assert resolve("configs/recipes/none.yaml") == "configs/recipes/none.yaml"  # left for asr.fit to refuse
    (tmp_path / "configs" / "recipes").mkdir(parents=True)
    (tmp_path / "configs" / "recipes" / "demo.yaml").write_text("trainer: {}\n")
    assert resolve("configs/recipes/demo.yaml") == "configs/recipes/demo.yaml"  # a file of the user's comes first
    args, count = map_configs(["-c", "a", "--x", "1", "--config=b", "--config", "c"], str.upper)
    assert args == ["-c", "A", "--x", "1", "--config=B", "--config", "C"] and count == 3


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
