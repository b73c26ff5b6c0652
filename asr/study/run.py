"""Which model size trains fastest? ``python -m asr.study``: a scaling study over ordinary asr.fit runs.

    python -m asr.study --quick --out runs/study-quick          # 2 widths x 2 data fractions of data/mini
    python -m asr.study --config configs/study/grid.yaml --out runs/study
    python -m asr.study --config configs/study/grid.yaml --out runs/study --print_commands   # for a job array
    python -m asr.study --collect runs/study                    # analyse whatever trials have finished

Every trial (a width x depth x data fraction) is one ``python -m asr.fit`` run in its own folder
``OUT/runs/<trial>/version_0``, stacked on the same base config: the same learning rate, batch and
schedule for every size, a fixed ``max_steps``, validation every ``val_every`` batches and early
stopping at the minimum validation loss. Data fractions are nested random subsets of the training
manifest (one seed), and every trial uses one tokenizer, trained on the whole manifest. Locally the
trials run one after another, each as a subprocess with a timeout; a finished trial (its test pass
is in metrics.csv) is never rerun, an unfinished one is rerun from the start. The analysis
(asr/study/analysis.py) reads each trial's metrics.csv and writes OUT/study.md, study.json,
trials.csv and PNG plots (asr/study/report.py); asr/study/data.py draws the subsets and the tokenizer.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from asr.atomic import write_atomically
from asr.data.manifest import ManifestError
from asr.study.analysis import Target, check_window, projections, smoothed, steps_to_converge, stopped_early
from asr.study.data import draw_subsets, subset_path, tokenizer_path
from asr.train.fitting import CONFIGS
from asr.train.fitting import run as fit_command

QUICK_CONFIG = CONFIGS / "study" / "quick.yaml"
PLAN, BASE = "study.yaml", "base_config.yaml"  # in --out: the study's settings, the trials' shared asr.fit config
SAME_TRIALS = ("fit_configs", "fit_args", "fractions", "seed", "val_every", "patience", "max_steps")


class StudyError(ValueError):
    """A study that cannot run as configured; one sentence naming the setting or file."""


@dataclass(frozen=True)
class Study:
    """A grid of asr.fit trials (sizes x nested data fractions) under one training protocol.

    Args:
        out: the study's folder: subsets, trial runs, logs and the analysis.
        fit_configs: asr.fit configs stacked for every trial; none: the default run, as asr.fit without --config.
        fit_args: further asr.fit arguments for every trial, e.g. ["--model.schedule.warmup_steps", "50"].
        widths: model.encoder.d_model of each size; [] = the base config's.
        depths: model.encoder.n_layers (every width at every depth); [] = the base config's.
        fractions: nested random subsets of data.train_manifest, as fractions of its lines, in (0, 1].
        seed: the draw of the subsets, the same for every trial.
        val_every: validate every this many training batches, so step counts have this resolution.
        patience: validations without a new minimum of val/loss before a trial stops early.
        smooth: steps to converge are measured on the centred moving average of val/loss over this many
            (odd) validations, where the whole window fits; 1 = the raw curve, the paper's definition. At a
            constant lr the validation loss jitters by more than 1%, and a lucky dip then decides a trial's
            steps; 5 averages it out. An analysis setting: change it and --collect, no trial reruns.
        max_steps: every trial's step budget; it is also the length of every trial's lr schedule.
        timeout: seconds one trial may run before it is stopped and counted as failed.
        price_per_device_hour: price of one device of this machine for one hour; 0 = no cost.
        gpu: the GPU to project the grid onto.
    """

    out: str = "runs/study"
    fit_configs: list[str] = field(default_factory=list)
    fit_args: list[str] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    fractions: list[float] = field(default_factory=lambda: [1.0])
    seed: int = 0
    val_every: int = 50
    patience: int = 5
    smooth: int = 1
    max_steps: int = 2000
    timeout: float = 7200.0
    price_per_device_hour: float = 0.0
    gpu: Target = field(default_factory=Target)


class Trial(NamedTuple):
    width: int
    depth: int
    fraction: float

    @property
    def name(self) -> str:
        return f"w{self.width}-l{self.depth}-f{self.fraction:g}"


def parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m asr.study", description=__doc__.split("\n")[0])
    parser.add_argument("--config", action=ActionConfigFile, help="a study YAML (configs/study/*.yaml); stackable")
    parser.add_class_arguments(Study, None, as_group=False)
    parser.add_argument("--quick", action="store_true", help=f"read {QUICK_CONFIG.relative_to(CONFIGS.parent)} first")
    parser.add_argument("--print_commands", action="store_true", help="write and print one asr.fit line per trial")
    parser.add_argument("--collect", type=str | None, default=None, help="analyse the finished trials of this folder")
    return parser


def parse(args: list[str]) -> tuple[Study, str]:
    """(study, mode): mode is "run", "print_commands" or "collect". --collect DIR reads DIR/study.yaml first."""
    args = list(args)
    if "--quick" in args:  # the quick grid is a config like any other, read before the rest
        args = ["--config", str(QUICK_CONFIG), *args]
    collect = next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--collect"), None)
    if collect is not None:
        if not (Path(collect) / PLAN).is_file():
            raise StudyError(f"--collect {collect}: no {PLAN} there; it is written when a study starts")
        args = ["--config", str(Path(collect) / PLAN), *args, "--out", collect]
    cfg = parser().parse_args(args)
    values = {f.name: cfg[f.name] for f in fields(Study)}
    study = Study(**values | {"gpu": Target(**cfg["gpu"].as_dict())})
    mode = "collect" if collect else "print_commands" if cfg.print_commands else "run"
    return study, mode


def check(study: Study) -> None:
    """Refuse a grid that cannot be measured, naming the setting."""
    if not study.fractions or any(not 0 < f <= 1 for f in study.fractions):
        raise StudyError(f"fractions must be a non-empty list of numbers in (0, 1], got {study.fractions}")
    for name in ("val_every", "patience", "max_steps"):
        if getattr(study, name) < 1:
            raise StudyError(f"{name} must be at least 1, got {getattr(study, name)}")
    try:
        check_window(study.smooth)
    except ValueError as err:
        raise StudyError(f"smooth: {err}") from err
    if study.max_steps < 2 * study.val_every:
        raise StudyError(f"max_steps {study.max_steps} leaves fewer than 2 validations at val_every {study.val_every}")
    if not 0 < study.gpu.mfu <= 1 or study.gpu.devices < 1:
        raise StudyError(f"gpu.mfu must be in (0, 1] and gpu.devices at least 1, got {study.gpu}")


def config_args(study: Study) -> list[str]:
    return [arg for path in study.fit_configs for arg in ("--config", str(Path(path).resolve()))]


def resolve_base(study: Study) -> dict:
    """The trials' shared asr.fit config, resolved by asr.fit itself (``--print_config``), in this process: it has
    imported what asr.fit needs already, and a process of its own would spend 5-6 s on the same imports."""
    out, err = io.StringIO(), io.StringIO()
    try:  # the arguments replace the command line (the study's own) as asr.train.fitting.build is given them
        with redirect_stdout(out), redirect_stderr(err):
            fit_command([*config_args(study), *study.fit_args, "--print_config"])
        stop = "asr.fit --print_config printed no config"
    except SystemExit as exit_:
        stop = exit_.code
    if stop:  # a message of asr.fit's, or the parser's exit status after its own lines
        said = stop if isinstance(stop, str) else err.getvalue().strip()
        raise StudyError(f"fit_configs / fit_args do not make an asr.fit config:\n{said}")
    base = yaml.safe_load(out.getvalue())
    if not base["data"].get("test_manifest"):
        raise StudyError("the base config has no data.test_manifest: a trial is finished when its test pass is logged")
    return base


def sizes(study: Study, base: dict) -> list[tuple[int, int]]:
    """(width, depth) of every size, smallest first; widths must divide into model.encoder.n_heads heads."""
    encoder = base["model"]["encoder"]
    widths, depths = study.widths or [encoder["d_model"]], study.depths or [encoder["n_layers"]]
    heads = encoder["n_heads"]
    if any(w % heads for w in widths):
        raise StudyError(f"widths {widths}: each must be a multiple of model.encoder.n_heads = {heads}")
    return sorted((w, d) for w in set(widths) for d in set(depths))


def trials(study: Study, base: dict) -> list[Trial]:
    return [Trial(w, d, f) for f in sorted(set(study.fractions)) for w, d in sizes(study, base)]


def prepare(study: Study, out: Path) -> dict:
    """Write OUT/study.yaml, base_config.yaml, the subsets and the tokenizer; return the base config."""
    plan = out / PLAN
    if plan.is_file():
        earlier = yaml.safe_load(plan.read_text())
        changed = [key for key in SAME_TRIALS if earlier.get(key) != asdict(study)[key]]
        if changed:
            raise StudyError(f"{out} holds a study with other {', '.join(changed)} ({plan}); use another --out")
    base = resolve_base(study)
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, content in ((PLAN, asdict(study)), (BASE, base)):
        with write_atomically(out / name) as partial:
            partial.write_text(yaml.safe_dump(content, sort_keys=False))
    try:
        draw_subsets(base["data"]["train_manifest"], study.fractions, study.seed, out)
    except ManifestError as err:  # a corpus not made yet: the config's header says how to make it
        raise StudyError(str(err)) from err
    except OSError as err:
        raise StudyError(f"data.train_manifest: {err}") from err
    tokenizer_path(base, out)
    return base


def fit_arguments(study: Study, base: dict, trial: Trial, out: Path) -> list[str]:
    """The asr.fit arguments of one trial: the base config, its size and subset, and the study's protocol."""
    data = base["data"]
    return [
        *config_args(study), *study.fit_args,
        "--model.encoder.d_model", str(trial.width), "--model.encoder.n_layers", str(trial.depth),
        "--data.train_manifest", str(subset_path(out, trial.fraction).resolve()),
        "--data.val_manifest", str(Path(data["val_manifest"]).resolve()),
        "--data.test_manifest", str(Path(data["test_manifest"]).resolve()),
        "--data.tokenizer.model", str(tokenizer_path(base, out).resolve()),
        "--trainer.max_steps", str(study.max_steps), "--trainer.max_epochs", "-1",
        # counted in batches across epochs, so validation is due whatever an epoch's length
        "--trainer.val_check_interval", str(study.val_every), "--trainer.check_val_every_n_epoch", "null",
        "--trainer.callbacks+=pytorch_lightning.callbacks.EarlyStopping",
        "--trainer.callbacks.monitor", "val/loss", "--trainer.callbacks.patience", str(study.patience),
        "--trainer.logger.init_args.save_dir", str((out / "runs").resolve()),
        "--trainer.logger.init_args.name", trial.name, "--trainer.logger.init_args.version", "0",
        "--test", "true",
    ]


def run_dir(out: Path, trial: Trial) -> Path:
    return out / "runs" / trial.name / "version_0"


def read_metrics(run: Path) -> list[dict]:
    """The rows of a trial's metrics.csv (CSVLogger), [] if there is none yet."""
    path = run / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def steps_done(row: dict) -> int:
    """Optimizer steps done when a metrics.csv row was logged: Lightning's step column is that count less 1."""
    return int(row["step"]) + 1


def finished(run: Path) -> bool:
    """A trial is finished when asr.fit's test pass, which follows the fit, is in its metrics.csv."""
    return any(row.get("test/loss") for row in read_metrics(run))


def run_fit(arguments: list[str], log: Path, timeout: float) -> int:
    """``python -m asr.fit ARGUMENTS`` with its output in ``log``; its exit code, or -1 after ``timeout`` s."""
    with log.open("w") as stream:
        process = subprocess.Popen([sys.executable, "-m", "asr.fit", *arguments], stdout=stream,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # its own group: workers too
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stream.write(f"\nasr.study: stopped after the timeout of {timeout:g} s\n")
            return -1
        finally:
            if process.poll() is None:  # timed out, or the study itself was interrupted
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def run_trials(study: Study, base: dict, out: Path) -> list[str]:
    """Run every unfinished trial in turn; returns the names of those that failed."""
    failed, plan = [], trials(study, base)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for number, trial in enumerate(plan, start=1):
        run, log = run_dir(out, trial), out / "logs" / f"{trial.name}.log"
        if finished(run):
            print(f"[{number}/{len(plan)}] {trial.name}: finished earlier, not rerun", flush=True)
            continue
        if run.parent.exists():  # an interrupted or failed run of it: start again
            shutil.rmtree(run.parent)
        print(f"[{number}/{len(plan)}] {trial.name}: training (log: {log})", flush=True)
        start = time.perf_counter()
        code = run_fit(fit_arguments(study, base, trial, out), log, study.timeout)
        seconds = time.perf_counter() - start
        with write_atomically(out / "logs" / f"{trial.name}.json") as partial:
            partial.write_text(json.dumps({"exit_code": code, "wall_seconds": seconds}))
        if code != 0 or not finished(run):
            failed.append(trial.name)
            print(f"    failed (exit code {code}) after {seconds:.0f} s: see {log}", flush=True)
        else:
            print(f"    done in {seconds:.0f} s", flush=True)
    return failed


def print_commands(study: Study, base: dict, out: Path) -> Path:
    """OUT/commands.txt: one ``python -m asr.fit ...`` line per trial, for a job array or any scheduler."""
    lines = [shlex.join(["python", "-m", "asr.fit", *fit_arguments(study, base, t, out)]) for t in trials(study, base)]
    with write_atomically(out / "commands.txt") as partial:
        partial.write_text("".join(line + "\n" for line in lines))
    print("\n".join(lines))
    return out / "commands.txt"


def count_parameters(run: Path) -> int:
    """Parameters of the trial's model, from any checkpoint in its run folder."""
    from asr.train.module import ASRModule

    checkpoint = next(iter(sorted((run / "checkpoints").glob("*.ckpt"))), None)
    if checkpoint is None:
        raise StudyError(f"{run / 'checkpoints'}: no checkpoint to count the parameters of")
    return sum(p.numel() for p in ASRModule.from_checkpoint(checkpoint).parameters())


def median(rows: list[dict], *keys: str) -> float:
    """Median over ``rows`` of the product of the ``keys`` columns; NaN when no row has them all."""
    values = [math.prod(float(row[k]) for k in keys) for row in rows if all(row.get(k) for k in keys)]
    return statistics.median(values) if values else float("nan")


def summarise(run: Path, trial: Trial, hours: float, study: Study) -> dict:
    """One finished trial's figures: steps to converge, minimum val/loss with its WER/CER, test WER/CER,
    parameters, model FLOPs and seconds per step (CostMonitor's cost/* columns), audio hours seen."""
    rows = read_metrics(run)
    val = [row for row in rows if row.get("val/loss")]
    losses = [float(r["val/loss"]) for r in val]
    steps = steps_to_converge(*smoothed([steps_done(r) for r in val], losses, study.smooth))
    best = val[losses.index(min(losses))]
    test = next(r for r in reversed(rows) if r.get("test/loss"))
    audio_seconds_per_step = median(rows, "cost/x_real_time", "cost/step_seconds")
    return {
        "trial": trial.name, "width": trial.width, "depth": trial.depth, "fraction": trial.fraction,
        "train_hours": hours, "params": count_parameters(run), "steps": steps,
        "last_step": max(steps_done(r) for r in rows if r.get("step")), "validations": len(val),
        "min_val_loss": float(best["val/loss"]), "min_val_step": steps_done(best),
        "converged": stopped_early(losses, study.patience),
        "val_wer": float(best.get("val/wer") or "nan"), "val_cer": float(best.get("val/cer") or "nan"),
        "test_wer": float(test.get("test/wer") or "nan"), "test_cer": float(test.get("test/cer") or "nan"),
        "flops_per_step": median(rows, "cost/model_flops_per_s", "cost/step_seconds"),
        "seconds_per_step": median(rows, "cost/step_seconds"),
        "audio_hours_seen": steps * audio_seconds_per_step / 3600,
    }


def collect(study: Study, out: Path) -> tuple[list[dict], list[str]]:
    """(a row per finished trial with its projections, names of trials not finished)."""
    base = yaml.safe_load((out / BASE).read_text())
    subsets = json.loads((out / "data" / "subsets.json").read_text())
    trainer = base["trainer"]
    devices = trainer["devices"] if isinstance(trainer["devices"], int) else 1
    rows, missing = [], []
    for trial in trials(study, base):
        run = run_dir(out, trial)
        if not finished(run):
            missing.append(trial.name)
            continue
        row = summarise(run, trial, subsets[f"{trial.fraction:g}"]["hours"], study)
        try:
            rows.append(row | projections(row, study.gpu, str(trainer["precision"]), devices * trainer["num_nodes"],
                                          study.price_per_device_hour))
        except ValueError as err:  # a GPU the table does not know, or not in this precision
            raise StudyError(str(err)) from err
    return rows, missing


def main(args: list[str] | None = None) -> int:
    """The CLI: prepare, run the trials (or print their commands), analyse. Returns the exit code."""
    from asr.study.report import write_report

    study, mode = parse(sys.argv[1:] if args is None else args)
    check(study)
    out = Path(study.out)
    if mode == "print_commands":
        print_commands(study, prepare(study, out), out)
        return 0
    failed = run_trials(study, prepare(study, out), out) if mode == "run" else []
    rows, missing = collect(study, out)
    write_report(study, rows, missing, out)
    if failed:
        print(f"asr.study: {len(failed)} trials failed: {', '.join(failed)}; rerun to retry them", file=sys.stderr)
    return 1 if failed else 0


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    try:
        sys.exit(main())
    except StudyError as err:
        sys.exit(f"asr.study: error: {err}")


if __name__ == "__main__":
    run()
