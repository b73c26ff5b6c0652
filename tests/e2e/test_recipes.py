"""configs/recipes/: each recipe parses, states its commands, builds its model and data; real-1h-cpu trains
end to end on the bundled corpus; and a run bounded by --trainer.max_time anneals its lr by the clock.

The runs are the documented command lines (default callbacks, progress bar and logger): in a subprocess, or, for
the run bounded by time, in this process on a clock that each training step moves by a second, so that what it
checks does not depend on this CPU's speed.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytorch_lightning.callbacks.timer as lightning_timer

import pytest
import torch
import yaml

from asr.configs import CONFIGS
from asr.train import cost
from asr.train.fitting import ConfigError, build, check_hardware, main
from asr.tokenizer import TokenizerConfig
from asr.train.module import ASRModule
from tests import REPO
from tests.cli import CHAR_FRAMES, refused

RECIPES = CONFIGS / "recipes"
MINI = ["--data.train_manifest", "data/mini/train.jsonl", "--data.val_manifest", "data/mini/dev.jsonl",
        "--data.test_manifest", "data/mini/test.jsonl"]
# A GPU recipe built on this CPU: its precision "auto" would time steps of a 100M-parameter model here (minutes, and
# not what these tests check); the recipe's own trainer settings are checked from --print_config.
ON_CPU = ["--trainer.accelerator", "cpu", "--trainer.strategy", "auto", "--trainer.devices", "1",
          "--trainer.precision", "32-true"]


def printed_config(*args: str) -> dict:
    """``python -m asr.fit ARGS --print_config``, parsed (--print_config last: before a --config it prints less)."""
    with pytest.raises(SystemExit) as exit_info, redirect_stdout(io.StringIO()) as out:
        main([*args, "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(out.getvalue())


def fit(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asr.fit", *args, "--trainer.logger.init_args.save_dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_the_recipes_are_there():
    assert {p.stem for p in RECIPES.glob("*.yaml")} >= {"demo-streaming", "real-1h-cpu", "gpu-100h"}


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_recipe_parses_and_its_header_says_what_it_is_and_the_commands(recipe):
    text = (RECIPES / recipe).read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert text.startswith(f'# Recipe "{Path(recipe).stem}": ')
    for command in ("python -m asr.fit --config ", f"--config configs/recipes/{recipe}", "python -m asr.transcribe"):
        assert command in header, command  # (finetune.yaml goes after the checkpoint's own config)
    # the recipe picks its averaging: checkpoints to average, or the last weights (test_checkpoint: last)
    assert "python -m asr.average" in header or yaml.safe_load(text).get("test_checkpoint") == "last"
    config = printed_config("--config", f"configs/recipes/{recipe}")
    assert config["trainer"]["logger"]["init_args"]["name"] == Path(recipe).stem  # runs/<recipe>/version_<n>


def test_real_1h_cpu_recipe_builds_a_small_char_conformer_bounded_by_time(monkeypatch):
    monkeypatch.setattr(cost, "cpu_peak_flops", {"fp32": 86e9, "bf16": 0.9e9}.get)  # a CPU without bf16 units
    cli = build(["--config", "configs/recipes/real-1h-cpu.yaml", *MINI])
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    assert model.hparams.encoder["block"] == "conformer" and model.hparams.spec_augment is not None
    assert 2e6 < sum(p.numel() for p in model.parameters()) < 6e6  # about half the 10M small preset or less
    assert data.tokenizer_settings.type == "char" and data.tokenizer.vocab_size < 64
    augmentation = data.augmentation
    assert min(augmentation.noise_prob, augmentation.reverb_prob, augmentation.gain_prob) > 0
    assert len(data.hparams.speed_perturb) > 1
    assert str(trainer.precision) == "32-true" and trainer.max_epochs == -1 and trainer.check_val_every_n_epoch == 1
    (timer,) = [c for c in trainer.callbacks if type(c).__name__ == "Timer"]
    assert timer.time_remaining() == 15 * 60


def test_a_preset_alone_is_the_default_run_with_what_it_names():
    """One layer of defaults: `--config configs/model/small.yaml` keeps everything of the default run (its
    intermediate CTC, augmentation, epochs, seed and run name) that small.yaml does not name, as with no --config."""
    alone, default = printed_config("--config", "configs/model/small.yaml"), printed_config()
    assert alone["model"]["encoder"]["block"] == "transformer" != default["model"]["encoder"]["block"]
    assert alone["model"]["inter_ctc"] == default["model"]["inter_ctc"] > 0
    assert alone["data"]["augmentation"] == default["data"]["augmentation"] and default["data"]["augmentation"]["noise_prob"] > 0
    assert alone["trainer"]["max_epochs"] == default["trainer"]["max_epochs"] == 50
    assert alone["seed_everything"] == default["seed_everything"] == 0
    assert alone["trainer"]["logger"]["init_args"]["name"] == default["trainer"]["logger"]["init_args"]["name"] == "default"


def test_gpu_recipe_builds_a_bpe_conformer_base_and_needs_a_gpu():
    cli = build(["--config", "configs/recipes/gpu-100h.yaml", *ON_CPU, *MINI])
    assert cli.model.hparams.encoder["block"] == "conformer" and cli.model.hparams.encoder["n_layers"] == 19
    assert cli.datamodule.tokenizer_settings == TokenizerConfig(type="bpe", vocab_size=1024)
    trainer = printed_config("--config", "configs/recipes/gpu-100h.yaml")["trainer"]
    assert (trainer["accelerator"], trainer["strategy"], trainer["precision"]) == ("gpu", "ddp", "auto")
    parsed = SimpleNamespace(**trainer)
    check_hardware(parsed, cuda=True)
    with pytest.raises(ConfigError, match="trainer.accelerator=gpu needs a CUDA GPU") as error:
        check_hardware(parsed, cuda=False)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("recipe, preset, strategy", [("gpu-1000h", "conformer-large", "ddp"),
                                                    ("gpu-10000h", "conformer-1b", "asr.train.fsdp.ShardedStrategy")])
def test_gpu_scale_recipes_train_their_size_preset_from_shards_by_steps(recipe, preset, strategy):
    """The recipe carries its preset's shape as the preset says it (one shape, however often written down)."""
    config = printed_config("--config", f"configs/recipes/{recipe}.yaml")
    shape = yaml.safe_load((CONFIGS / "model" / f"{preset}.yaml").read_text())["model"]["encoder"]
    assert {key: config["model"]["encoder"][key] for key in shape} == shape
    trainer = config["trainer"]
    assert (trainer["accelerator"], trainer["precision"]) == ("gpu", "auto")
    assert strategy in (trainer["strategy"] if isinstance(trainer["strategy"], str) else trainer["strategy"]["class_path"])
    assert trainer["max_steps"] > 0 and isinstance(trainer["val_check_interval"], int)
    assert config["data"]["train_shards"] and config["data"]["tokenizer"]["model"] is None  # the shards' own tokenizer


def test_gpu_recipe_on_a_cpu_machine_stops_with_one_sentence_not_a_traceback(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    message = refused("--config", str(RECIPES / "gpu-100h.yaml"), "--trainer.logger.init_args.save_dir", str(tmp_path))
    assert message.startswith("asr.fit: error: trainer.accelerator=gpu needs a CUDA GPU")


def test_real_1h_cpu_recipe_trains_end_to_end_on_the_bundled_corpus(tmp_path):
    """Two short epochs of the recipe as written (its model, augmentation, precision auto), validated and tested.
    data/mini's fastest utterances are too short for char CTC at 4x subsampling: skipped, as the error advises."""
    result = fit(tmp_path, "--config", "configs/recipes/real-1h-cpu.yaml", *MINI, "--data.filter.on_bad_line", "skip",
                 "--trainer.max_steps", "6",
                 "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
                 "--trainer.limit_test_batches", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "real-1h-cpu" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    rows = metrics(run)
    assert [r["epoch"] for r in rows if r.get("val/cer")] == ["0", "1"]  # validation each epoch
    assert any(r.get("test/cer") for r in rows)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["encoder"]["block"] == "conformer" and checkpoint["global_step"] == 6


def test_a_run_bounded_by_max_time_anneals_its_lr_to_near_the_floor_by_the_end(tmp_path, monkeypatch):
    """A run of endless epochs bounded by 40 s, on a clock each training step moves by 1 s (Lightning's Timer reads
    it, and the schedule reads the Timer): it stops after 40 steps, whatever this CPU's speed, and its logged lr
    rises over a short warm-up, then only falls, to near the floor (lr * schedule.min_lr_ratio) by the last step.
    max_steps 200 only stops a run whose time bound broke."""
    clock = [0.0]
    monkeypatch.setattr(lightning_timer, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    step = ASRModule.on_train_batch_start

    def one_second_a_step(module, batch, batch_idx):
        clock[0] += 1.0
        return step(module, batch, batch_idx)

    monkeypatch.setattr(ASRModule, "on_train_batch_start", one_second_a_step)
    cli = main(["--trainer.max_time", "00:00:00:40", "--trainer.max_epochs", "-1", "--trainer.max_steps", "200",
                "--trainer.log_every_n_steps", "1", "--model.encoder.d_model", "64", "--model.encoder.n_heads", "2",
                "--model.encoder.n_layers", "2", "--model.schedule.warmup_steps", "10", "--data.tokenizer.type", "char",
                *CHAR_FRAMES, "--test", "false", "--data.num_workers", "0", "--trainer.precision", "32-true",
                "--trainer.limit_val_batches", "2",  # validation is not what this run checks
                "--data.filter.on_bad_line", "skip",  # two of data/mini's fastest lines are too short for char CTC
                "--trainer.logger.init_args.save_dir", str(tmp_path)])
    run = Path(cli.trainer.log_dir)
    lrs = [float(r["lr-AdamW"]) for r in metrics(run) if r.get("lr-AdamW")]
    model = yaml.safe_load((run / "config.yaml").read_text())["model"]  # the run's resolved peak lr and floor
    peak = model["optimizer"]["init_args"]["lr"]
    floor = peak * model["schedule"]["min_lr_ratio"]
    assert cli.trainer.global_step == len(lrs) == 40
    assert max(lrs) > 0.8 * peak
    after_warmup = lrs[10:]
    assert all(later <= earlier for earlier, later in zip(after_warmup, after_warmup[1:]))
    assert lrs[-1] < floor + 0.1 * (peak - floor)
