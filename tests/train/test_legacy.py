"""Checkpoints and config.yaml files written before the settings were grouped (issue 40) still load, transcribe
and train as they did: tests/fixtures/flat-settings was written by that code (a tiny char Conformer, its output
on a bundled test file, and the config.yaml of a run with flat flags)."""

import io
import sys
from contextlib import redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml

from asr.audio import load_audio
from asr.train import fitting
from asr.train.legacy import current_flags, group_config, group_settings
from asr.train.module import ASRModule
from tests import MINI

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "flat-settings"


def test_a_checkpoint_of_flat_settings_loads_and_gives_the_same_output():
    module = ASRModule.from_checkpoint(FIXTURE / "model.ckpt")
    assert module.model.encoder.cfg.block == "conformer" and module.model.encoder.cfg.d_model == 32
    assert module.hparams.features["norm"] == "shared" and module.hparams.spec_augment["freq_warp"] == 0.1
    samples, _ = load_audio(MINI / "audio" / "test" / "000000.flac")
    audio = torch.from_numpy(samples)[None]
    with torch.no_grad():
        log_probs, lengths = module(audio, torch.tensor([audio.shape[1]]))
    expected = torch.load(FIXTURE / "output.pt", weights_only=True)
    assert torch.equal(lengths, expected["lengths"])
    assert torch.allclose(log_probs, expected["log_probs"], atol=1e-5)


def test_old_flat_hyper_parameters_map_to_the_groups_and_settings_added_since_keep_their_old_behaviour():
    old = torch.load(FIXTURE / "model.ckpt", weights_only=True)["hyper_parameters"]
    grouped = group_settings(old)
    assert grouped["encoder"]["d_model"] == 32 and grouped["features"]["kind"] == old["features"]
    assert "d_model" not in grouped and grouped["inter_ctc"] == 0.3
    without_floor = {k: v for k, v in old.items() if k != "feature_var_floor"}  # a run from before that setting
    assert group_settings(without_floor)["features"]["var_floor"] == 0.0
    assert group_settings({**old, "spec_augment": False})["spec_augment"] is None
    assert group_settings(grouped) == grouped  # already grouped: as it is


def test_a_config_yaml_of_flat_settings_trains_with_the_same_settings(tmp_path):
    flat = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    assert flat["model"]["d_model"] == 32 and flat["data"]["noise_prob"] == 0.1  # written flat
    cli = fitting.build(["--config", str(FIXTURE / "config.yaml"), "--trainer.logger", "false"])
    assert cli.model.model.encoder.cfg.d_model == 32 and cli.model.model.encoder.cfg.block == "conformer"
    assert cli.datamodule.augmentation.noise_prob == 0.1
    assert cli.model.model.features.config.var_floor == flat["model"]["feature_var_floor"]
    assert group_config(yaml.safe_load(yaml.safe_dump(cli.config.as_dict()))) is None  # what it resolves to is grouped


def test_a_checkpoint_without_settings_whose_default_changed_keeps_the_values_it_was_trained_with():
    """A checkpoint holds every setting there was when it was written; one it lacks had the default of then
    (BEFORE_THEIR_TIME), not today's: the default run's Conformer and features must not reshape an older model."""
    grouped = group_settings(torch.load(FIXTURE / "model.ckpt", weights_only=True)["hyper_parameters"])
    older = {**grouped, "encoder": {k: v for k, v in grouped["encoder"].items() if k not in ("conv_channels", "block")}}
    older = {k: v for k, v in older.items() if k != "inter_ctc"}
    settings = ASRModule.settings(older)
    assert settings["encoder"].conv_channels == 0 and settings["encoder"].block == "transformer"
    assert settings["features"].quiet_db == 0.0 and settings["inter_ctc"] == 0.0
    assert ASRModule.settings(grouped)["encoder"].block == "conformer"  # what it names, it keeps
    assert group_settings({**grouped, "spec_augment": None})["spec_augment"] is None


def test_a_runs_config_yaml_lacking_a_setting_reads_it_as_that_run_had_it_and_a_recipe_takes_the_default(tmp_path):
    """A config.yaml asr.fit wrote (its first line LightningCLI's) names every setting of its time; a recipe names
    what differs from the default run. data.augmentation.pause_prob and model.features.quiet_db came later."""
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    config["data"] = {k: v for k, v in config["data"].items() if k != "pause_prob"}
    body = yaml.safe_dump(config, sort_keys=False)
    (tmp_path / "run.yaml").write_text("# pytorch_lightning==2.6.6\n" + body)
    (tmp_path / "recipe.yaml").write_text(body)
    run, recipe = (printed_config("--config", str(tmp_path / name)) for name in ("run.yaml", "recipe.yaml"))
    assert run["model"]["features"]["quiet_db"] == 0.0 and run["data"]["augmentation"]["pause_prob"] == 0.0
    assert recipe["model"]["features"]["quiet_db"] == 6.0 and recipe["data"]["augmentation"]["pause_prob"] == 0.025


def printed_config(*args: str) -> dict:
    """What ``python -m asr.fit ARGS --print_config`` prints, parsed."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out, mock.patch.object(sys, "argv", ["asr.fit"]):
        fitting.main([*args, "--print_config"])
    return yaml.safe_load(out.getvalue())


def test_the_schedules_flat_settings_of_a_checkpoint_a_config_and_a_command_line_are_read_grouped(tmp_path):
    """Until the schedule was grouped, its settings were flat beside grouped ones (model.warmup_steps beside
    model.encoder): a checkpoint, a run's config.yaml and the flags written so still train and load as they did."""
    hyper_parameters = {"encoder": {"d_model": 32}, "warmup_steps": 7, "warmup_share": 0.5, "min_lr_ratio": 0.1}
    schedule = ASRModule.settings(hyper_parameters)["schedule"]
    assert (schedule.warmup_steps, schedule.warmup_share, schedule.min_lr_ratio) == (7, 0.5, 0.1)
    assert ASRModule.settings({"encoder": {"d_model": 32}})["schedule"].warmup_steps == 200  # the default then
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  encoder:\n    d_model: 64\n  warmup_steps: 9\n  min_lr_ratio: 0.2\n")
    model = printed_config("--config", str(config), "--model.warmup_share", "0.6")["model"]
    assert model["schedule"] == {"warmup_steps": 9, "warmup_share": 0.6, "min_lr_ratio": 0.2}
    assert model["encoder"]["d_model"] == 64 and "warmup_steps" not in model
    assert current_flags(["--model.warmup_steps=3", "--model.encoder.d_model", "8"]) == [
        "--model.schedule.warmup_steps=3", "--model.encoder.d_model", "8"]



def test_the_datas_flat_settings_of_a_config_and_a_command_line_are_read_grouped(tmp_path):
    """Until the data settings were grouped (data.tokenizer.*, data.filter.*, data.shards.*) they were flat
    (data.tokenizer_type, data.max_duration, data.shard_buffer, ...): a config and flags written so still run as
    they did, and asr.fit says once for each how it read them."""
    config = tmp_path / "config.yaml"
    config.write_text("data:\n  tokenizer_type: char\n  max_duration: 12.0\n  on_bad_line: error\n  shard_buffer: 50\n")
    said = []
    with mock.patch("asr.train.fitting.rank_zero_info", said.append):
        data = printed_config("--config", str(config), "--data.tokenizer_vocab_size", "40",
                              "--data.max_dropped_share=0.2")["data"]
    assert data["tokenizer"] == {"model": None, "type": "char", "vocab_size": 40} and "tokenizer_type" not in data
    assert data["filter"] == {"min_duration": 0.1, "max_duration": 12.0, "on_bad_line": "error",
                              "max_dropped_share": 0.2}
    assert data["shards"] == {"weights": None, "buffer": 50, "stall_seconds": 600.0}
    assert said.count("--data.tokenizer_vocab_size, --data.max_dropped_share: read as --data.tokenizer.vocab_size, "
                      "--data.filter.max_dropped_share (grouped now)") == 1
    assert sum("flat settings of an older asr, read as grouped ones" in line for line in said) == 1
    assert current_flags(["--data.shard_stall_seconds=5", "--data.train_shards", "x"]) == [
        "--data.shards.stall_seconds=5", "--data.train_shards", "x"]

def test_old_module_names_of_saved_class_paths_import_the_moved_modules():
    import asr.cost
    import asr.resilience
    import asr.train.cost
    import asr.train.resilience

    assert asr.resilience is asr.train.resilience and asr.cost is asr.train.cost
    assert asr.resilience.AtomicCheckpointIO is asr.train.resilience.AtomicCheckpointIO
