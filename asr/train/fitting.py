"""Train: ``python -m asr.fit`` (LightningCLI).

    python -m asr.fit                                   # the default run: tiny Conformer, bundled corpus, CPU
    python -m asr.fit --config configs/recipes/real-1h-cpu.yaml --trainer.max_time 00:01:00:00
    python -m asr.fit --config configs/model/small.yaml --config configs/data/8khz.yaml
    python -m asr.fit --trainer.max_epochs 3 --model.encoder.d_model 256 --data.max_batch_seconds 120
    python -m asr.fit --ckpt_path runs/default/version_0/checkpoints/last.ckpt   # resume
    python -m asr.fit --ckpt_path last                  # resume the newest last.ckpt of runs/default/*
    python -m asr.fit --print_config                    # the resolved config, as YAML

One layer of defaults: the signature defaults of model and data (and of their groups of settings), the
Trainer's in configs/trainer.yaml, and seed 0. They are the default run, what ``--help`` prints, and what runs
without a ``--config``; each ``--config`` (a recipe or preset names only what differs from them) is stacked on
them in order, then the dotted overrides. The resolved config is saved as ``config.yaml`` in the run folder
(``runs/<name>/version_<n>/``) beside ``metrics.csv`` and ``checkpoints/``.
The data's tokenizer and sample rate are linked to the model, and the model's
subsampling to the data, so none of them is typed twice. After fitting, the best
checkpoint is evaluated on ``data.test_manifest`` (``--test false`` skips that).

Exit status: 0 when training finished or was preempted (SIGTERM / SIGUSR1: a checkpoint was written,
see asr.train.resilience); 130 after Ctrl-C (SIGINT), which writes the same checkpoint; otherwise non-zero
with one line saying why, e.g. a collective that timed out after ``--collective_timeout`` minutes,
named by rank and hook.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path
from typing import Literal, Sequence

import pytorch_lightning as pl
import torch
import yaml
from lightning_fabric.plugins.precision.precision import _PRECISION_INPUT
from pytorch_lightning.callbacks import ModelSummary, ProgressBar, TQDMProgressBar
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.strategies import ModelParallelStrategy
from pytorch_lightning.utilities import rank_zero_info
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from asr.audio import AudioError
from asr.checkpoint import load_file, outline
from asr.configs import CONFIGS, map_configs, resolve
from asr.data.manifest import ManifestError
from asr.data.datamodule import ASRDataModule
from asr.data.shard_run import check_by_steps
from asr.data.shards import ShardsError
from asr.hardware import AUTO, Auto, resolve_precision, resolve_threads, uses_cuda
from asr.settings import ConfigError
from asr.train import budget, fsdp, precision
from asr.train.init_from import initialize, settings_changed
from asr.train.legacy import FLAT_FLAGS, WRITTEN_BY_A_RUN, complete_config, current_flags, group_config
from asr.train.module import ASRModule, NonFiniteLossError
from asr.train.resilience import (COLLECTIVE_TIMEOUT_MINUTES, CheckpointWriteError, FitLoop, Preempted, describe_failure,
                            is_collective_timeout, last_checkpoints, set_collective_timeout)
from asr.tokenizer import Tokenizer

TRAINER_DEFAULTS = CONFIGS / "trainer.yaml"  # the Trainer's defaults in asr, read into the parser's defaults


class Trainer(pl.Trainer):
    """Lightning's Trainer, whose ``precision`` may also be "auto": the choice for this machine (asr.hardware),
    whose fit loop resumes at an epoch's end with max_steps set too (asr.train.resilience.FitLoop), and whose
    progress bar and model summary are Lightning's plain ones whether or not ``rich`` is installed (Lightning
    switches to rich's where it is, whose bar writes only its last state to a log file)."""

    def __init__(self, *args, precision: _PRECISION_INPUT | Auto | None = AUTO, **kwargs):
        """
        Args:
            precision: "auto" (bf16-mixed where this device computes bf16 fast, else 32-true on a CPU and
                16-mixed on a GPU without bf16; said in one line), or any of Lightning's: 32-true, bf16-mixed,
                bf16-true, 16-mixed (a CUDA GPU only; under FSDP2 with a sharded loss scaler), 64-true.
        """
        accelerator = kwargs.get("accelerator", "auto")
        precision = resolve_precision(precision, accelerator, rank_zero_info)
        precision, kwargs["plugins"] = fsdp.sharded_fp16(precision, kwargs.get("strategy"), kwargs.get("plugins"))
        kwargs["callbacks"] = plain_bar_and_summary(kwargs.get("callbacks"), kwargs.get("enable_progress_bar", True),
                                                    kwargs.get("enable_model_summary", True))
        super().__init__(*args, precision=precision, **kwargs)
        FitLoop.replace(self)


def plain_bar_and_summary(callbacks, bar: bool | None, summary: bool | None) -> list:
    """``callbacks`` with TQDMProgressBar and ModelSummary added where they are on and none of their kind is given."""
    callbacks = list(callbacks or []) if not isinstance(callbacks, pl.Callback) else [callbacks]
    if bar is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks.append(TQDMProgressBar())
    if summary is not False and not any(isinstance(c, ModelSummary) for c in callbacks):
        callbacks.append(ModelSummary())
    return callbacks


class ASRCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({f"trainer.{key}": value for key, value in yaml.safe_load(TRAINER_DEFAULTS.read_text()).items()})
        parser.link_arguments("data.tokenizer", "model.tokenizer", apply_on="instantiate")
        parser.link_arguments("data.sample_rate", "model.features.sample_rate")
        parser.link_arguments("model.encoder.subsampling", "data.subsampling")
        parser.link_arguments("model.objective", "data.objective")
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="checkpoint to resume training from; 'last': the run folder's newest last.ckpt")
        parser.add_argument("--collective_timeout", type=float, default=COLLECTIVE_TIMEOUT_MINUTES,
                            help="minutes a rank waits in a collective (or, at start, for the other ranks to connect) "
                                 "before the job stops with an error")
        parser.add_argument("--threads", type=int | Auto, default=AUTO,
                            help="torch threads of the training step; 'auto': this process's share of the cores, "
                                 "less the data workers' on 4 cores and up (asr.hardware)")
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="train into a run folder that already holds a run (a logger version given "
                                 "explicitly), replacing its files; without it such a run is refused")
        parser.add_argument("--budget", type=str | None, default=None,
                            help="train to this wall time (HH:MM:SS, start-up and test included), choosing the model "
                                 "size and learning rate that learn the most in it on this data and machine "
                                 "(asr.train.budget); given on the command line")
        parser.add_argument("--budget_gpu_hours", type=float | None, default=None,
                            help="with --plan_only: plan a GPU run to this many GPU-hours without training: preset, "
                                 "batch, steps, workers (asr.study.plan; python -m asr.fit --budget_gpu_hours H "
                                 "--plan_only --help for its own flags)")
        parser.add_argument("--plan_only", type=bool, default=False, help="with --budget_gpu_hours: print the plan")
        parser.add_argument("--test", type=bool, default=True, help="after fitting, score the test set (with the weights --test_checkpoint names)")
        parser.add_argument("--test_checkpoint", type=Literal["best", "last"], default="best",
                            help="what --test scores: the best checkpoint by the first ModelCheckpoint's monitor "
                                 "(val/wer), or the weights training ended with (for char models, whose WER is noisy)")

    def before_instantiate_classes(self) -> None:
        """Threads, resolved into the config config.yaml records (the precision is timed with them)."""
        trainer, on_gpu = self.config.trainer, uses_cuda(self.config.trainer.accelerator)
        try:
            self.config.threads = resolve_threads(self.config.threads, on_gpu, self.config.data.num_workers,
                                                  rank_zero_info)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        check_hardware(trainer)  # ("auto" passes; it is checked again once resolved)

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        """The Trainer, with ``precision: auto`` decided first on the model and data built by now (asr.hardware,
        asr.train.precision) and recorded in the config that config.yaml saves."""
        trainer = self.config.trainer
        if trainer.precision == AUTO:
            trainer.precision = auto_precision(self.model, self.datamodule, trainer.accelerator)
            self.config_init.trainer.precision = trainer.precision
            check_hardware(trainer)
        return super().instantiate_trainer(**kwargs)


def auto_precision(module: ASRModule, datamodule: ASRDataModule, accelerator: str) -> str:
    """``precision: auto`` for this run: what the process that started this one chose (a rank Lightning started),
    else asr.hardware's choice, timing ``module``'s steps on a CPU, said in one line and handed down to the ranks."""
    batch = precision.probe_batch(module, datamodule)
    choice = precision.inherited(module, batch)
    if choice is None:
        check_optimizer(module)  # a CPU's timed steps build it: its own refusal first, naming the flag
        steps = partial(precision.measured_steps, module, batch, rank_zero_info)
        choice = resolve_precision(AUTO, accelerator, rank_zero_info, cpu_steps=steps)
        precision.hand_down(module, batch, choice)
    return choice


def strategy_name(strategy) -> str:
    """'ddp', 'fsdp', or the class path of a strategy given as class_path/init_args."""
    return strategy if isinstance(strategy, str) else getattr(strategy, "class_path", type(strategy).__name__)


def check_hardware(trainer, cuda: bool | None = None) -> None:
    """Refuse what Lightning would fail at deep inside, or silently change, with one clear sentence.

    ``cuda`` defaults to what this machine has (tests pass it explicitly).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
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
    if "deepspeed" in strategy:
        raise ConfigError(
            f"trainer.strategy={strategy}: DeepSpeed is not supported: under ZeRO the gradients are not in p.grad, "
            "so asr's skip of non-finite updates and its gradient clipping would do nothing. configs/strategy/"
            "fsdp.yaml (FSDP2) shards parameters, gradients and optimizer state as ZeRO-3 does.")
    if strategy.split(".")[-1] in ("fsdp", "fsdpstrategy") and not on_gpu:
        raise ConfigError(
            "Lightning's FSDPStrategy needs a CUDA GPU; configs/strategy/fsdp.yaml (FSDP2 under "
            "ModelParallelStrategy) runs on a CPU too."
        )


def read_checkpoint(path: str) -> dict:
    """A checkpoint file's contents (tensors memory-mapped), or a sharded folder's outline (no tensor read:
    asr.checkpoint.outline); ConfigError naming --ckpt_path if unreadable."""
    if Path(path).is_dir():
        try:
            return outline(path)
        except ValueError as err:
            raise ConfigError(f"--ckpt_path {err}") from err
    return load_file(path, "--ckpt_path")


def check_resumable(path: str | None, module: ASRModule | None = None, strategy=None) -> dict:
    """Refuse a --ckpt_path that is unreadable, holds weights only (asr.average's output: Lightning's own
    error blames save_weights_only), (given this run's ``module``) another model: see ``same_model``, or (given
    its ``strategy``) a sharded folder that only FSDP's strategy reads.
    Returns how far the checkpoint's run got: {"steps": optimizer steps, "epochs": epochs finished}
    ({} for no checkpoint)."""
    if path is None:
        return {}
    if Path(path).is_dir() and strategy is not None and not isinstance(strategy, ModelParallelStrategy):
        raise ConfigError(f"--ckpt_path {path} is a sharded checkpoint folder, which only configs/strategy/fsdp.yaml "
                          f"resumes from; make it one file for this strategy: python -m asr.convert {path} full.ckpt")
    checkpoint = read_checkpoint(path)
    if "optimizer_states" not in checkpoint:
        made_by = " (an average of checkpoints, by asr.average)" if "averaged_from" in checkpoint else ""
        raise ConfigError(f"--ckpt_path {path} holds model weights only{made_by}, no optimizer or loop state: "
                          "it transcribes, but cannot resume training.")
    differs = same_model(checkpoint, module) if module is not None else ""
    if differs:
        raise ConfigError(f"--ckpt_path {path} is not this run's model: {differs}. Resume with the settings "
                          "it was trained with (its run folder's config.yaml).")
    epochs = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    return {"steps": checkpoint.get("global_step", 0), "epochs": epochs.get("processed", 0)}


def check_fresh_folder(trainer: pl.Trainer) -> None:
    """Refuse to start a new run in a folder that holds one (its checkpoints, metrics.csv): given a logger
    version of a finished run, Lightning would replace them without a word."""
    folder = Path(trainer.log_dir) if trainer.log_dir else None
    held = [p for p in (*folder.glob("checkpoints/*.ckpt"), folder / "metrics.csv") if p.exists()] if folder else []
    if held:
        raise ConfigError(f"run folder {folder} already holds a run ({', '.join(p.name for p in held[:3])}"
                          f"{' ...' if len(held) > 3 else ''}): continue it with --ckpt_path last, replace it with "
                          "--overwrite true, or leave trainer.logger.init_args.version unset for a new version")


def check_room(trainer: pl.Trainer, module: ASRModule) -> None:
    """The run folder can be written, and has room for two checkpoints of this model (one being written
    beside the last: weights and AdamW's two moments in fp32, 12 bytes a parameter, and 10% more)."""
    folder = Path(trainer.log_dir or trainer.default_root_dir)
    existing = next(p for p in (folder, *folder.parents) if p.exists())  # what the run will create its folder in
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(f"run folder {folder} cannot be written ({err.strerror or err}): choose another with "
                          "--trainer.logger.init_args.save_dir") from err
    needed = 2 * 1.1 * 12 * sum(p.numel() for p in module.parameters())
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise ConfigError(f"run folder {folder} has {free / 2**20:.1f} MiB free, and two checkpoints of this model "
                          f"need {needed / 2**20:.1f} MiB: free some space or choose another save_dir")


def check_training(cli: ASRCLI) -> None:
    """Settings that no constructor checks but that would fail in the first step, or train nothing."""
    trainer = cli.trainer
    if trainer.max_epochs == 0 or trainer.max_steps == 0:
        flag = "max_epochs" if trainer.max_epochs == 0 else "max_steps"
        raise ConfigError(f"trainer.{flag} 0 trains nothing; to score a checkpoint, use python -m asr.transcribe "
                          "--checkpoint CKPT data/mini/test.jsonl")
    if trainer.accumulate_grad_batches < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches must be at least 1, got {trainer.accumulate_grad_batches}")
    data = cli.datamodule.hparams
    if data.train_shards:
        try:
            check_by_steps(trainer, validates=bool(data.val_manifest))
        except ShardsError as err:
            raise ConfigError(str(err)) from err
    check_optimizer(cli.model)


def check_optimizer(module: ASRModule) -> None:
    """The optimizer's own checks (a negative lr, betas outside [0, 1), ...) before any step, naming the flag."""
    try:
        module.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model.optimizer: {err}") from err


INPUT_SETTINGS = ("features",)  # same shapes, other input


def same_model(checkpoint: dict, module: ASRModule) -> str:
    """What differs between a checkpoint and this run's model ("" if nothing): the tokenizer (same size
    but other pieces would silently give every token id another meaning), the input features, or the
    shape of any weight (with the settings that differ)."""
    if checkpoint.get("tokenizer") is not None and checkpoint["tokenizer"] != module.tokenizer.serialized:
        return (f"its tokenizer is another ({Tokenizer(checkpoint['tokenizer']).vocab_size} pieces, this run's "
                f"{module.tokenizer.vocab_size}; give the run's own with --data.tokenizer.model)")
    changed = settings_changed(checkpoint.get("hyper_parameters", {}), module)
    inputs = [c for c in changed if c.split()[0].split(".")[0] in INPUT_SETTINGS]
    if inputs:
        return "its input features differ (" + ", ".join(inputs) + ")"
    own = module.state_dict()
    shapes = [f"{name} {tuple(t.shape)} -> {tuple(own[name].shape) if name in own else 'none'}"
              for name, t in checkpoint.get("state_dict", {}).items() if name not in own or own[name].shape != t.shape]
    shapes += [f"{name} none -> {tuple(t.shape)}" for name, t in own.items() if name not in checkpoint.get("state_dict", {})]
    if shapes:
        return f"{len(shapes)} weights differ in shape, e.g. {shapes[0]} (settings: {', '.join(changed) or 'none'})"
    return ""


def nothing_left(trainer: pl.Trainer, reached: dict) -> str | None:
    """Why a run resumed at ``reached`` (check_resumable's) has nothing left to train, or None."""
    if reached and 0 <= trainer.max_steps <= reached["steps"]:
        return f"already at max_steps {trainer.max_steps} (the checkpoint holds step {reached['steps']})"
    if reached and trainer.max_epochs is not None and 0 <= trainer.max_epochs <= reached["epochs"]:
        return f"already at max_epochs {trainer.max_epochs} (the checkpoint finished epoch {reached['epochs'] - 1})"
    return None


def build(args: list[str] | None = None) -> ASRCLI:
    """Parse ``args`` (default: the command line) and build model, data and trainer: the --config files, if any,
    on the signature defaults and TRAINER_DEFAULTS; the old flat flags of the schedule's and the data's grouped
    settings (asr.train.legacy.FLAT_FLAGS) read as the grouped ones, said once."""
    given = map_configs(sys.argv[1:] if args is None else args, read_config)
    old = [arg.partition("=")[0] for arg in given if arg.partition("=")[0] in FLAT_FLAGS]
    if old:
        rank_zero_info(f"{', '.join(old)}: read as {', '.join(FLAT_FLAGS[flag] for flag in old)} (grouped now)")
        given = current_flags(given)
    argv = sys.argv
    if args is None:  # from the command line: LightningCLI warns when given args beside sys.argv
        sys.argv[1:], given = given, None
    else:  # args in place of the command line (a budget's runs): not beside it, or LightningCLI warns each time
        sys.argv = argv[:1]
    try:
        return ASRCLI(
            ASRModule,
            ASRDataModule,
            trainer_class=Trainer,
            run=False,
            args=given,
            auto_configure_optimizers=False,  # ASRModule.configure_optimizers owns optimizer and schedule
            trainer_defaults={"use_distributed_sampler": False},  # the bucket sampler splits batches across ranks
            seed_everything_default=0,  # the measured default run's; LightningCLI would draw a random seed
            save_config_kwargs={"overwrite": True},
        )
    finally:
        sys.argv = argv


def read_config(path: str) -> str:
    """A --config value as jsonargparse is to read it: the shipped file it names (asr.configs.resolve); an older
    run's config.yaml as it ran: flat settings as grouped ones (asr.train.legacy.group_config), and settings added
    or whose default changed since at what it had (asr.train.legacy.complete_config), each said once; a file
    that is missing or not YAML a ConfigError naming it and the line (jsonargparse's own message names neither)."""
    path = resolve(path)
    if not Path(path).is_file():
        if ":" in path:  # jsonargparse also takes the YAML itself
            return path
        raise ConfigError(f"--config {path}: no such file")
    text = Path(path).read_text()
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"--config {path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from err
    if not isinstance(content, dict):
        return path
    grouped = group_config(content)
    if grouped is not None:
        rank_zero_info(f"--config {path}: flat settings of an older asr, read as grouped ones "
                       "(model.encoder.*, model.features.*, model.spec_augment.*, model.schedule.*, "
                       "data.augmentation.*, data.tokenizer.*, data.filter.*, data.shards.*)")
    lacked = []
    if WRITTEN_BY_A_RUN.match(text):  # every setting of its time: one it lacks had the value of before
        grouped, lacked = complete_config(grouped or content)
    if lacked:
        rank_zero_info(f"--config {path}: a run's config.yaml from before {', '.join(lacked)} were settings or had "
                       "today's defaults: read with the values that run had (asr.train.legacy.BEFORE_THEIR_TIME)")
    return path if grouped is None or grouped is content else yaml.safe_dump(grouped, sort_keys=False)


def resolve_ckpt_path(cli: ASRCLI) -> str | None:
    """--ckpt_path, with 'last' resolved to the newest readable last*.ckpt of <save_dir>/<name> (any version):
    one cut short (a copy interrupted) is passed over for the one before, and said so."""
    path, logger = cli.config.ckpt_path, cli.trainer.logger
    if path != "last":
        return path
    run_folder = Path(logger.save_dir) / logger.name if logger else Path(cli.trainer.default_root_dir)
    found = newest_readable(last_checkpoints(run_folder), cli.trainer.print)
    if found is None:
        cli.trainer.print(f"--ckpt_path last: no readable last.ckpt under {run_folder}, starting anew")
    return found


def newest_readable(checkpoints: Sequence[Path], say=print) -> str | None:
    """The first of ``checkpoints`` (newest first) that reads, said so; each one that does not is passed over, said
    so (one cut short: a copy interrupted)."""
    for candidate in checkpoints:
        try:
            read_checkpoint(str(candidate))
        except ConfigError as err:
            say(f"--ckpt_path last: passing over {candidate}: {str(err).split(': ', 1)[1]}")
            continue
        say(f"--ckpt_path last: resuming from {candidate}")
        return str(candidate)
    return None


def main(args: list[str] | None = None, callbacks: Sequence[pl.Callback] = (), within_budget: bool = False
         ) -> ASRCLI | dict:
    """Build from ``args``, fit, then test the best checkpoint. Returns the CLI (its trainer, model, data), or with
    ``--budget`` the plan (asr.train.budget). ``callbacks`` join the trainer's. ``within_budget``: a run of a
    budget's (a probe's round, the winner), which a ``budget:`` in its --config does not start again."""
    seconds, rest = budget.split_args(sys.argv[1:] if args is None else args)
    if seconds is not None:
        return budget.main(seconds, rest)
    try:
        cli = build(args)
    except (ValueError, MisconfigurationException) as err:  # a constructor (ours or Lightning's) refused a setting
        raise err if isinstance(err, ConfigError) else ConfigError(str(err)) from err
    if cli.config.budget_gpu_hours or cli.config.plan_only:
        raise ConfigError("--budget_gpu_hours and --plan_only plan a GPU run: python -m asr.fit --budget_gpu_hours H "
                          "--plan_only --data.train_shards S (on the command line, not in a config)")
    if cli.config.budget and not within_budget:  # from a --config file: the command line's path
        return budget.main(budget.parse_budget(cli.config.budget), [a for a in (args or sys.argv[1:])])
    cli.trainer.callbacks.extend(callbacks)
    check_training(cli)
    ckpt_path = resolve_ckpt_path(cli)
    if cli.trainer.global_rank == 0:  # the folder rank 0 writes
        if ckpt_path is None and not cli.config.overwrite:
            check_fresh_folder(cli.trainer)
        check_room(cli.trainer, cli.model)
    done = nothing_left(cli.trainer, check_resumable(ckpt_path, cli.model, cli.trainer.strategy))
    if done:  # no fit, and no test of weights this run did not train
        cli.trainer.print(f"asr.fit: {done}: nothing to train; raise the limit to continue {ckpt_path}")
        return cli
    init_from = cli.model.hparams.init_from
    if init_from and ckpt_path is None:  # weights only: new optimizer and schedule (asr.train.init_from)
        for line in initialize(cli.model, init_from, cli.model.finetune):
            cli.trainer.print(line)
    elif init_from:
        cli.trainer.print(f"--model.init_from {init_from}: not read, the run resumes with {ckpt_path}'s weights")
    test_manifest = cli.config.test and cli.datamodule.hparams.test_manifest
    if test_manifest:  # a mistyped path is named now, not after training
        cli.datamodule.source("test").parse()
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


# Every value asr logs is summed over ranks before it is logged (see asr.train.module), so Lightning's advice
# to log epoch values with sync_dist=True, which would deadlock, does not apply.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('(train|val|test|cost)/")


def run(args: list[str] | None = None) -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__): ``args`` or sys.argv's."""
    try:
        main(args)
    except Preempted as stop:  # a checkpoint was written: a clean exit that a requeued job resumes from
        print(f"asr.fit: {stop}", file=sys.stderr)
        if stop.signal == "SIGINT":
            sys.exit(130)  # as any command Ctrl-C ended, so that `asr.fit && next` stops there
    except (ConfigError, ManifestError, ShardsError, AudioError, NonFiniteLossError, CollectiveTimeout,
            CheckpointWriteError) as err:
        sys.exit(f"asr.fit: error: {err}")  # the message, no traceback


if __name__ == "__main__":
    run()
