"""Train: ``python -m asr.fit`` (LightningCLI).

    python -m asr.fit                                   # configs/default.yaml: tiny model, bundled corpus
    python -m asr.fit --config configs/model/small.yaml --config configs/data/8khz.yaml
    python -m asr.fit --trainer.max_epochs 3 --model.d_model 256 --data.max_batch_seconds 120
    python -m asr.fit --ckpt_path runs/default/version_0/checkpoints/last.ckpt   # resume
    python -m asr.fit --ckpt_path last                  # resume the newest last.ckpt of runs/default/*
    python -m asr.fit --print_config                    # the resolved config, as YAML

``configs/default.yaml`` is always read first; each ``--config`` is stacked on top of it,
then the dotted overrides. The resolved config is saved as ``config.yaml`` in the run
folder (``runs/<name>/version_<n>/``) beside ``metrics.csv`` and ``checkpoints/``.
The data's tokenizer and sample rate are linked to the model, and the model's
subsampling to the data, so none of them is typed twice. After fitting, the best
checkpoint is evaluated on ``data.test_manifest`` (``--test false`` skips that).

Exit status: 0 when training finished or was preempted (SIGTERM / SIGUSR1: a checkpoint was written,
see asr.resilience); otherwise non-zero with one line saying why, e.g. a collective that timed
out after ``--collective_timeout`` minutes, named by rank and hook.
"""

from __future__ import annotations

import signal
import sys
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.precision.precision import _PRECISION_INPUT
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.utilities import rank_zero_info

from asr.audio import AudioError
from asr.data import ASRDataModule, parse_split
from asr.hardware import AUTO, Auto, resolve_precision, resolve_threads, uses_cuda
from asr.manifest import ManifestError
from asr.module import ASRModule, NonFiniteLossError
from asr.resilience import (COLLECTIVE_TIMEOUT_MINUTES, FitLoop, Preempted, describe_failure, is_collective_timeout,
                            newest_checkpoint, set_collective_timeout)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIGS / "default.yaml"


class Trainer(pl.Trainer):
    """Lightning's Trainer, whose ``precision`` may also be "auto": the choice for this machine (asr.hardware),
    and whose fit loop resumes at an epoch's end with max_steps set too (asr.resilience.FitLoop)."""

    def __init__(self, *args, precision: _PRECISION_INPUT | Auto | None = AUTO, **kwargs):
        """
        Args:
            precision: "auto" (bf16-mixed where this device computes bf16 fast, else 32-true on a CPU and
                16-mixed on a GPU without bf16; said in one line), or any of Lightning's: 32-true, bf16-mixed,
                bf16-true, 16-mixed (a CUDA GPU only), 64-true.
        """
        accelerator = kwargs.get("accelerator", "auto")
        super().__init__(*args, precision=resolve_precision(precision, accelerator, rank_zero_info), **kwargs)
        FitLoop.replace(self)


class ASRCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.tokenizer", "model.tokenizer", apply_on="instantiate")
        parser.link_arguments("data.sample_rate", "model.sample_rate")
        parser.link_arguments("model.subsampling", "data.subsampling")
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="checkpoint to resume training from; 'last': the run folder's newest last.ckpt")
        parser.add_argument("--collective_timeout", type=float, default=COLLECTIVE_TIMEOUT_MINUTES,
                            help="minutes a rank waits in a collective (or, at start, for the other ranks to connect) "
                                 "before the job stops with an error")
        parser.add_argument("--threads", type=int | Auto, default=AUTO,
                            help="torch threads of the training step; 'auto': this process's share of the cores, "
                                 "less the data workers' on 4 cores and up (asr.hardware)")
        parser.add_argument("--test", type=bool, default=True, help="after fitting, score the test set (with the weights --test_checkpoint names)")
        parser.add_argument("--test_checkpoint", type=Literal["best", "last"], default="best",
                            help="what --test scores: the best checkpoint by the first ModelCheckpoint's monitor "
                                 "(val/wer), or the weights training ended with (for char models, whose WER is noisy)")

    def before_instantiate_classes(self) -> None:
        """Threads, then precision (measured with those threads), resolved into the config config.yaml records."""
        trainer, on_gpu = self.config.trainer, uses_cuda(self.config.trainer.accelerator)
        try:
            self.config.threads = resolve_threads(self.config.threads, on_gpu, self.config.data.num_workers,
                                                  rank_zero_info)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        trainer.precision = resolve_precision(trainer.precision, trainer.accelerator, rank_zero_info)
        check_hardware(trainer)


class ConfigError(ValueError):
    """A run this machine cannot do; one sentence that names the setting."""


def strategy_name(strategy) -> str:
    """'ddp', 'deepspeed_stage_2', or the class path of a strategy given as class_path/init_args."""
    return strategy if isinstance(strategy, str) else getattr(strategy, "class_path", type(strategy).__name__)


def check_hardware(trainer, cuda: bool | None = None, deepspeed: bool | None = None) -> None:
    """Refuse what Lightning would fail at deep inside, or silently change, with one clear sentence.

    ``cuda`` and ``deepspeed`` default to what this machine has (tests pass them explicitly).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    deepspeed = find_spec("deepspeed") is not None if deepspeed is None else deepspeed
    on_gpu = uses_cuda(trainer.accelerator, cuda)
    precision, strategy = str(trainer.precision), strategy_name(trainer.strategy).lower()
    if str(trainer.accelerator) in ("gpu", "cuda") and not cuda:
        raise ConfigError(f"trainer.accelerator={trainer.accelerator} needs a CUDA GPU and this machine has none; "
                          "on a CPU ask for --trainer.accelerator cpu (configs/recipes/real-1h-cpu.yaml is a CPU recipe).")
    if precision in ("16", "16-mixed", "16-true") and not on_gpu:
        raise ConfigError(
            f"trainer.precision={precision} needs a CUDA GPU: on a CPU Lightning would quietly train in bf16 "
            "instead; ask for bf16-mixed (or 32-true)."
        )
    if "deepspeed" in strategy and not deepspeed:
        raise ConfigError(f"trainer.strategy={strategy} needs DeepSpeed: pip install -e \".[deepspeed]\".")
    if "deepspeed" in strategy and not on_gpu:
        raise ConfigError(f"trainer.strategy={strategy} needs a CUDA GPU; on a CPU use configs/strategy/fsdp.yaml.")
    if strategy.split(".")[-1] in ("fsdp", "fsdpstrategy") and not on_gpu:
        raise ConfigError(
            "Lightning's FSDPStrategy needs a CUDA GPU; configs/strategy/fsdp.yaml (FSDP2 under "
            "ModelParallelStrategy) runs on a CPU too."
        )


def check_resumable(path: str | None) -> dict:
    """Refuse a --ckpt_path that holds weights only (asr.average's output): Lightning's own error blames
    save_weights_only. Returns how far the checkpoint's run got: {"steps": optimizer steps, "epochs": epochs
    finished} ({} for a sharded folder, which is Lightning's to read, or no checkpoint)."""
    if path is None or Path(path).is_dir():
        return {}
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if "optimizer_states" not in checkpoint:
        made_by = " (an average of checkpoints, by asr.average)" if "averaged_from" in checkpoint else ""
        raise ConfigError(f"--ckpt_path {path} holds model weights only{made_by}, no optimizer or loop state: "
                          "it transcribes, but cannot resume training.")
    epochs = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    return {"steps": checkpoint.get("global_step", 0), "epochs": epochs.get("processed", 0)}


def nothing_left(trainer: pl.Trainer, reached: dict) -> str | None:
    """Why a run resumed at ``reached`` (check_resumable's) has nothing left to train, or None."""
    if reached and 0 <= trainer.max_steps <= reached["steps"]:
        return f"already at max_steps {trainer.max_steps} (the checkpoint holds step {reached['steps']})"
    if reached and trainer.max_epochs is not None and 0 <= trainer.max_epochs <= reached["epochs"]:
        return f"already at max_epochs {trainer.max_epochs} (the checkpoint finished epoch {reached['epochs'] - 1})"
    return None


def build(args: list[str] | None = None) -> ASRCLI:
    """Parse ``args`` (default: the command line) over configs/default.yaml and build model, data and trainer."""
    if not DEFAULT_CONFIG.is_file():
        raise FileNotFoundError(f"{DEFAULT_CONFIG} is missing: install asr from a source checkout (pip install -e .)")
    # Read as a first --config rather than as parser default_config_files: jsonargparse drops
    # the class_path of callable arguments (model.optimizer) given in a default config file.
    if args is None:  # from the command line: LightningCLI warns when given args beside sys.argv
        sys.argv[1:] = ["--config", str(DEFAULT_CONFIG), *sys.argv[1:]]
    else:
        args = ["--config", str(DEFAULT_CONFIG), *args]
    return ASRCLI(
        ASRModule,
        ASRDataModule,
        trainer_class=Trainer,
        run=False,
        args=args,
        auto_configure_optimizers=False,  # ASRModule.configure_optimizers owns optimizer and schedule
        trainer_defaults={"use_distributed_sampler": False},  # the bucket sampler splits batches across ranks itself
        save_config_kwargs={"overwrite": True},
    )


def resolve_ckpt_path(cli: ASRCLI) -> str | None:
    """--ckpt_path, with 'last' resolved to the newest last*.ckpt of <save_dir>/<name> (any version)."""
    path, logger = cli.config.ckpt_path, cli.trainer.logger
    if path != "last":
        return path
    run_folder = Path(logger.save_dir) / logger.name if logger else Path(cli.trainer.default_root_dir)
    newest = newest_checkpoint(run_folder)
    cli.trainer.print(f"--ckpt_path last: {f'resuming from {newest}' if newest else f'none under {run_folder}, starting anew'}")
    return str(newest) if newest else None


def main(args: list[str] | None = None) -> ASRCLI:
    """Build from ``args``, fit, then test the best checkpoint. Returns the CLI (its trainer, model, data)."""
    try:
        cli = build(args)
    except ValueError as err:  # a constructor refused a setting; its message names the flag
        raise err if isinstance(err, ConfigError) else ConfigError(str(err)) from err
    ckpt_path = resolve_ckpt_path(cli)
    done = nothing_left(cli.trainer, check_resumable(ckpt_path))
    if done:  # no fit, and no test of weights this run did not train
        cli.trainer.print(f"asr.fit: {done}: nothing to train; raise the limit to continue {ckpt_path}")
        return cli
    test_manifest = cli.config.test and cli.datamodule.hparams.test_manifest
    if test_manifest:  # a mistyped path is named now, not after training
        parse_split(test_manifest, "test")
    trainer = cli.trainer
    set_collective_timeout(trainer.strategy, cli.config.collective_timeout)
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    except RuntimeError as err:
        if is_collective_timeout(err):
            if trainer.strategy.launcher is not None:  # ranks this process started would wait out their own timeout
                trainer.strategy.launcher.kill(signal.SIGKILL)
            raise CollectiveTimeout(describe_failure(err, trainer.global_rank, cli.config.collective_timeout)) from err
        raise
    for callback in trainer.checkpoint_callbacks:  # with the default config: the best, then the last
        if callback.best_model_path:
            trainer.print(f"{'best' if callback.monitor else 'last'} checkpoint: {callback.best_model_path}")
    if test_manifest:
        best = trainer.checkpoint_callback  # none yet when max_steps ends the run before any validation
        best = best and best.monitor and best.best_model_path and cli.config.test_checkpoint == "best"
        trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best" if best else None, weights_only=True)
    return cli


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within --collective_timeout minutes (the message names rank and hook)."""


# Every value asr logs is summed over ranks before it is logged (see asr.module), so Lightning's advice
# to log epoch values with sync_dist=True, which would deadlock, does not apply.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('(train|val|test|cost)/")


if __name__ == "__main__":
    try:
        main()
    except Preempted as stop:  # a checkpoint was written: a clean exit that a requeued job resumes from
        print(f"asr.fit: {stop}", file=sys.stderr)
    except (ConfigError, ManifestError, AudioError, NonFiniteLossError, CollectiveTimeout) as err:
        sys.exit(f"asr.fit: error: {err}")  # the message, no traceback
