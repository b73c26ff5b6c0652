"""Fine-tuning as a user runs it (issue 42): ``python -m asr.fit --model.init_from CKPT`` on data with another
vocabulary, the encoder frozen for the first steps; tests/train/test_init_from.py covers the loading rules."""

from __future__ import annotations

import sys

import torch

from asr.tokenizer import Tokenizer
from tests.e2e.test_resilience import DETERMINISTIC, SMALL, data, run, versions  # noqa: F401  (data: a fixture)
from tests.cli import CHAR_FRAMES

EVERY_STEP = '--trainer.callbacks+={"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", ' \
             '"init_args": {"dirpath": "%s", "filename": "{step}", "save_top_k": -1, "every_n_train_steps": 1}}'


def fit(*args: str):
    result = run([sys.executable, "-m", "asr.fit", *SMALL, *DETERMINISTIC, *args])
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def encoder_equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a if name.startswith("model.encoder."))


def test_a_run_from_a_checkpoint_with_a_new_vocabulary_holds_the_encoder_still_then_trains_it(data, tmp_path):
    # the new run trains characters, so both take the 40 ms front end (CHAR_FRAMES): the shapes must match
    fit(*data, *CHAR_FRAMES, "--trainer.max_epochs", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / "source"))
    source = versions(tmp_path / "source")[0] / "checkpoints" / "last.ckpt"
    steps = tmp_path / "steps"
    result = fit(*data, "--model.init_from", str(source), "--data.tokenizer.type", "char", *CHAR_FRAMES,
                 "--model.finetune.freeze_steps", "2", "--trainer.max_steps", "3", EVERY_STEP % steps,
                 "--trainer.logger.init_args.save_dir", str(tmp_path / "tuned"))
    said = result.stdout + result.stderr
    start = weights(source)
    loaded = len([name for name in start if not name.startswith("model.head.")])
    assert f"--model.init_from {source}: loaded {loaded} of this model's {len(start)} weights" in said
    assert "is not the checkpoint's" in said and "the CTC head is re-initialised" in said
    assert "held still until step 2" in said and "step 2: model.finetune.freeze's weights train from now on" in said
    after = {int(p.stem.split("=")[1]): weights(p) for p in steps.glob("step=*.ckpt")}
    assert sorted(after) == [1, 2, 3]
    assert encoder_equal(after[2], start) and not encoder_equal(after[3], start)
    assert not torch.equal(after[2]["model.norm.weight"], start["model.norm.weight"])  # the rest trained meanwhile
    tuned = torch.load(versions(tmp_path / "tuned")[0] / "checkpoints" / "last.ckpt", weights_only=True)
    pieces = Tokenizer(tuned["tokenizer"]).sp
    assert all(len(pieces.id_to_piece(i).lstrip("\u2581")) <= 1 for i in range(2, pieces.get_piece_size()))  # char
    assert tuned["hyper_parameters"]["init_from"] == str(source)


def test_the_documented_fine_tuning_command_keeps_the_checkpoints_vocabulary_and_loads_every_weight(data, tmp_path):
    """docs/training.md's command: the checkpoint's own config.yaml, then configs/recipes/finetune.yaml, the
    checkpoint as both init_from and tokenizer_model (limited to 2 steps here)."""
    fit(*data, "--trainer.max_steps", "2", "--trainer.logger.init_args.save_dir", str(tmp_path / "source"))
    folder = versions(tmp_path / "source")[0]
    source = folder / "checkpoints" / "last.ckpt"
    result = run([sys.executable, "-m", "asr.fit", "--config", str(folder / "config.yaml"), "--config",
                  "configs/recipes/finetune.yaml", "--model.init_from", str(source), "--data.tokenizer.model",
                  str(source), "--trainer.max_steps", "2", "--trainer.logger.init_args.save_dir", str(tmp_path / "tuned")])
    assert result.returncode == 0, result.stderr[-3000:]
    weights_there = len(weights(source))
    said = result.stdout + result.stderr
    assert f"loaded {weights_there} of this model's {weights_there} weights" in said and "re-initialised" not in said
    tuned = sorted((tmp_path / "tuned" / "finetune").glob("version_*"))[0]  # the recipe names the run finetune
    checkpoint = torch.load(tuned / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["tokenizer"] == torch.load(source, weights_only=True)["tokenizer"]
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["initial_lr"] == 0.0005  # the recipe's lr
