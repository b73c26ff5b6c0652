"""configs/default.yaml: the model and data defaults are ASRModule's and ASRDataModule's signatures; the file
states only what the bundled demo changes, each with a comment saying why, so a default lives in one place.
"""

from __future__ import annotations

import importlib
import inspect
import io
import re
from contextlib import redirect_stdout

import pytest
import yaml
from asr.data import ASRDataModule
from asr.fit import DEFAULT_CONFIG, Trainer, main
from asr.model import EncoderConfig
from asr.module import ASRModule

SECTIONS = {"model": ASRModule, "data": ASRDataModule, "trainer": Trainer}


def signature_defaults(cls) -> dict:
    """Defaults of ``cls``'s arguments, and of its base's where it passes **kwargs on (asr.fit.Trainer)."""
    parameters = inspect.signature(cls).parameters
    inherited = signature_defaults(cls.__base__) if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) else {}
    return inherited | {name: p.default for name, p in parameters.items() if p.default is not p.empty}


def plain(value):
    """YAML lists and Python tuples compare alike; a class compares as its dotted path (a YAML class_path)."""
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    return f"{value.__module__}.{value.__qualname__}" if inspect.isclass(value) else value


def restated(settings: dict, cls) -> list[str]:
    """The keys of ``settings`` whose value equals ``cls``'s default, and class_path/init_args that restate theirs."""
    defaults, found = signature_defaults(cls), []
    for key, value in settings.items():
        if isinstance(value, dict) and "class_path" in value:  # e.g. model.optimizer: its init_args against its class
            module, name = value["class_path"].rsplit(".", 1)
            target = getattr(importlib.import_module(module), name)
            found += [f"{key}.init_args.{k}" for k in restated(value.get("init_args") or {}, target)]
            if plain(defaults.get(key)) == value["class_path"] and not value.get("init_args"):
                found.append(key)
        elif key in defaults and plain(defaults[key]) == plain(value):
            found.append(key)
    return found


def test_restated_finds_a_default_and_ignores_a_change():
    assert restated({"d_model": EncoderConfig.d_model, "attention_window": 99}, ASRModule) == ["d_model"]
    assert restated({"speed_perturb": [1.0], "noise_kinds": ["white", "pink", "babble"]}, ASRDataModule) == [
        "speed_perturb", "noise_kinds"]
    optimizer = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.001, "weight_decay": 0.5}}
    assert restated({"optimizer": optimizer}, ASRModule) == ["optimizer.init_args.lr"]


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_default_yaml_restates_no_signature_default(section):
    settings = yaml.safe_load(DEFAULT_CONFIG.read_text()).get(section) or {}
    duplicates = restated(settings, SECTIONS[section])
    assert not duplicates, (f"configs/default.yaml {section}: {duplicates} equal {SECTIONS[section].__name__}'s "
                            "defaults; delete them there (the signature is the one source)")


def test_each_model_and_data_setting_in_default_yaml_says_why():
    section, silent = None, []
    for line in DEFAULT_CONFIG.read_text().splitlines():
        if re.match(r"\w", line):
            section = line.split(":")[0]
        key = re.match(r"  (\w+):(.*)", line)
        if section in ("model", "data") and key and key.group(2).strip() and "#" not in line:
            silent.append(f"{section}.{key.group(1)}")
    assert not silent, f"configs/default.yaml: {silent} differ from the signature default without a comment saying why"


def test_the_default_run_is_the_signatures_with_default_yaml_on_top():
    """No third source: what `python -m asr.fit` resolves to is the signature defaults plus default.yaml."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        main(["--print_config"])
    resolved, written = yaml.safe_load(out.getvalue()), yaml.safe_load(DEFAULT_CONFIG.read_text())
    for section in ("model", "data"):
        expected = signature_defaults(SECTIONS[section]) | written[section]
        for key, value in resolved[section].items():
            if key == "optimizer":
                assert value["class_path"] == written[section][key]["class_path"]
                assert value["init_args"].items() >= written[section][key]["init_args"].items()
            else:
                assert plain(value) == plain(expected[key]), f"{section}.{key}"


def resolved_model(*args: str) -> dict:
    """The model section ``python -m asr.fit ARGS --print_config`` resolves to (configs/default.yaml first)."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        main([*args, "--print_config"])
    return yaml.safe_load(out.getvalue())["model"]


@pytest.mark.parametrize("preset", sorted(p.stem for p in (DEFAULT_CONFIG.parent / "model").glob("*.yaml")))
def test_a_size_preset_keeps_its_block_over_default_yaml(preset):
    """default.yaml's Conformer must not turn `--config configs/model/small.yaml` (the README's own-data command,
    asr.bench's presets) into a Conformer, nor give the larger Conformers its 15-frame convolution."""
    model = resolved_model("--config", str(DEFAULT_CONFIG.parent / "model" / f"{preset}.yaml"))
    assert model["block"] == ("conformer" if preset.startswith("conformer") else "transformer")
    if preset in ("conformer-small", "conformer-base"):
        assert model["conv_kernel"] == EncoderConfig.conv_kernel


def test_the_default_run_trains_conformer_tiny():
    """configs/model/conformer-tiny.yaml says it is the default run's model: stacking it changes nothing."""
    assert resolved_model("--config", str(DEFAULT_CONFIG.parent / "model" / "conformer-tiny.yaml")) == resolved_model()
