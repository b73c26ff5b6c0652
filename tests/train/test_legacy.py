"""Checkpoints and config.yaml files written before the settings were grouped (issue 40) still load, transcribe
and train as they did: tests/fixtures/flat-settings was written by that code (a tiny char Conformer, its output
on a bundled test file, and the config.yaml of a run with flat flags)."""

from pathlib import Path

import torch
import yaml

from asr.audio import load_audio
from asr.train import fit
from asr.train.legacy import group_config, group_settings
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
    cli = fit.build(["--config", str(FIXTURE / "config.yaml"), "--trainer.logger", "false"])
    assert cli.model.model.encoder.cfg.d_model == 32 and cli.model.model.encoder.cfg.block == "conformer"
    assert cli.datamodule.augmentation.noise_prob == 0.1
    assert cli.model.model.features.config.var_floor == flat["model"]["feature_var_floor"]
    assert group_config(yaml.safe_load(yaml.safe_dump(cli.config.as_dict()))) is None  # what it resolves to is grouped


def test_old_module_names_of_saved_class_paths_import_the_moved_modules():
    import asr.cost
    import asr.resilience
    import asr.train.cost
    import asr.train.resilience

    assert asr.resilience is asr.train.resilience and asr.cost is asr.train.cost
    assert asr.resilience.AtomicCheckpointIO is asr.train.resilience.AtomicCheckpointIO
