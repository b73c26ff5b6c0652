"""Train to a budget: ``python -m asr.fit --budget 00:15:00`` chooses the model size and learning rate that learn
the most on this data, on this machine, in that wall time (start-up and the final test included).

    python -m asr.fit --budget 00:05:00                                   # the bundled corpus, 5 minutes
    python -m asr.fit --config configs/recipes/real-1h-cpu.yaml --budget 01:00:00
    python -m asr.fit --budget 00:15:00 --ckpt_path last                  # resume the chosen run, not the search

How it chooses (each number below is a constant of this module, and plan.json records them):

1. Candidates: the run's own encoder at three widths (``WIDTHS`` x its d_model) and two peak learning rates
   (``LR_FACTORS`` x its optimizer's lr): six. Each one's training step is timed on this machine in its best
   precision (asr.train.precision: cached per CPU and model shape, so the same machine plans the same).
2. The probe: successive halving within ``PROBE_SHARE`` of the training time. Every candidate trains for t0
   seconds' worth of its own steps, the slower-learning half by validation loss is stopped, the rest continue to
   2 t0, then 4 t0 (6 -> 3 -> 2). Each candidate's learning rate follows the schedule it would have as the winner
   (warm-up and cosine over the steps it would make in the winner's time), so a probe is the start of that run.
3. The choice: each survivor's validation losses against its training seconds are fitted with a power law,
   loss = b * t^-c, and extrapolated to the time it would have in all; the lowest wins (``choose``). The recipe's
   own model and learning rate run first: if they write no character after their first round (validation CER
   1.0: CTC's blank stage, where losses do not rank what the models learn later; ``blank``), the search stops
   there and they continue with all the time left, so a budget too short to tell costs one round, not the probe.
4. The winner continues from its own weights, optimizer and schedule (nothing it learned is thrown away) for the
   time left, stopped by ``--trainer.max_time``, and the test split scores it as in any run.

The run folder of the winner holds plan.json (candidates, each probe's steps, seconds and losses, the fits, the
choice and why) and, where matplotlib is installed, plan.png; the same table is printed. The probes' own folders
are beside it (``<save_dir>/<name>/budget/``). A budget too small for six candidates to make ``MIN_PROBE_STEPS``
steps each in the first round probes fewer (``fewer``: the recipe's width and the smaller one, then the recipe's
width at both rates); one too small for two is refused, naming the smallest that would do. The budget sets each
run's max_time, max_steps and max_epochs itself: given on the command line they are refused (SET_BY_THE_BUDGET).

Resume (``--ckpt_path last``) continues the winner from its newest readable last checkpoint (plan.json lists the
folders it ran in), or, stopped before it wrote one, from the probe's it started with; a search stopped before it
chose (no plan.json: each search removes an earlier one) starts again.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pytorch_lightning as pl
import torch

from asr.atomic import write_atomically
from asr.settings import ConfigError
from asr.train.resilience import last_checkpoints

WIDTHS = (2 / 3, 1.0, 1.5)  # of the recipe's d_model: a smaller and a larger model than it, at its depth
LR_FACTORS = (1.0, 2.0)  # of the recipe's peak lr: a shorter run learns more at a higher rate
PROBE_SHARE = 0.3  # at most this share of the training time goes to the candidates that lose
MIN_PROBE_STEPS = 30  # a candidate's first round: fewer steps than this say nothing of how it learns
RESERVE_SHARE = 0.03  # of the budget, kept back for the final test and the run's own start-up beyond the probes'
PLAN = "plan.json"
SET_BY_THE_BUDGET = ("--trainer.max_time", "--trainer.max_steps", "--trainer.max_epochs")  # each run's, sized by it


@dataclass(frozen=True)
class Candidate:
    """One model size and learning rate; ``step_s``: seconds of one training step on this machine."""

    d_model: int
    lr: float
    params: int = 0
    step_s: float = 0.0
    own: bool = False  # the recipe's own width and learning rate

    @property
    def name(self) -> str:
        return f"d{self.d_model}-lr{self.lr:g}"

    def overrides(self, total_steps: int, max_seconds: float) -> list[str]:
        """The asr.fit flags of this candidate's run, its schedule sized to ``total_steps`` (-1: none, the cosine
        by the clock alone, asr.train.schedule) in ``max_seconds``."""
        return ["--model.encoder.d_model", str(self.d_model), "--model.optimizer.init_args.lr", f"{self.lr:g}",
                "--trainer.max_steps", str(total_steps), "--trainer.max_epochs", "-1",
                "--trainer.max_time", clock(max_seconds)]


@dataclass
class Probe:
    """What one candidate learned: cumulative steps, estimated training seconds and validation losses."""

    candidate: Candidate
    steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)  # validation CER after each round
    checkpoint: str | None = None
    wall: float = 0.0  # seconds the probe's runs took, start-up and validation included


def parse_budget(text: str) -> float:
    """Seconds of ``HH:MM:SS``, ``DD:HH:MM:SS`` or a plain number of seconds; ConfigError naming --budget else."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif re.fullmatch(r"(\d+:){1,3}\d+", text):
        parts = [int(p) for p in text.split(":")]
        seconds = sum(p * u for p, u in zip(reversed(parts), (1, 60, 3600, 86400)))
    else:
        raise ConfigError(f"--budget {text!r}: give a wall time as HH:MM:SS (e.g. 00:15:00) or seconds")
    if seconds <= 0:
        raise ConfigError(f"--budget {text!r} must be more than no time")
    return seconds


def clock(seconds: float) -> str:
    """``DD:HH:MM:SS`` for Lightning's max_time (whole seconds, at least one)."""
    s = max(1, int(seconds))
    return f"{s // 86400:02d}:{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def halving(n: int) -> list[int]:
    """Candidates alive in each round of successive halving, down to two: 6 -> [6, 3, 2]; 4 -> [4, 2]."""
    alive = [n]
    while alive[-1] > 2:
        alive.append(math.ceil(alive[-1] / 2))
    return alive


def probe_units(n: int) -> float:
    """The probe's length in units of t0: round k takes each of its candidates from t0 2^(k-1) to t0 2^k."""
    return sum(alive * (2 ** k - (2 ** (k - 1) if k else 0)) for k, alive in enumerate(halving(n)))


@dataclass(frozen=True)
class Schedule:
    """The probe's plan in seconds: t0, the training time a winner gets in all, and the probe's total."""

    t0: float
    winner_seconds: float
    probe_seconds: float


def schedule(train_seconds: float, candidates: list[Candidate]) -> Schedule:
    """t0 such that the probe takes PROBE_SHARE of ``train_seconds``; ConfigError if a candidate would make fewer
    than MIN_PROBE_STEPS steps in t0, naming the smallest training time that would do."""
    units = probe_units(len(candidates))
    t0 = PROBE_SHARE * train_seconds / units
    slowest = max(c.step_s for c in candidates)
    if t0 < MIN_PROBE_STEPS * slowest:
        needed = MIN_PROBE_STEPS * slowest * units / PROBE_SHARE
        raise BudgetTooSmall(needed, f"{len(candidates)} candidates each need {MIN_PROBE_STEPS} steps in the probe's "
                             f"first round (the slowest {slowest:.3f} s a step here)")
    last = 2 ** (len(halving(len(candidates))) - 1) * t0  # a survivor's own training in the probe
    probe = units * t0
    return Schedule(t0, train_seconds - probe + last, probe)


class BudgetTooSmall(ConfigError):
    def __init__(self, train_seconds: float, why: str):
        self.train_seconds = train_seconds
        super().__init__(why)


def power_law(seconds: list[float], losses: list[float]) -> tuple[float, float]:
    """(b, c) of loss = b * t^-c fitted by least squares in log-log; c >= 0 (a probe that got worse is flat)."""
    if len(seconds) < 2:
        return losses[-1], 0.0
    x, y = torch.tensor(seconds, dtype=torch.float64).log(), torch.tensor(losses, dtype=torch.float64).log()
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum().clamp(min=1e-12))
    c = max(0.0, -slope)
    b = float((y + c * x).mean().exp())
    return b, c


def extrapolate(probe: Probe, seconds: float) -> float:
    """The probe's validation loss at ``seconds`` of training, by its power law."""
    b, c = power_law(probe.seconds, probe.losses)
    return b * seconds ** -c


def choose(probes: list[Probe], more_seconds: float) -> tuple[Probe, dict[str, float]]:
    """The survivor whose loss extrapolated to its own seconds plus ``more_seconds`` is lowest (ties: the first),
    and each survivor's extrapolation by name."""
    predicted = {p.candidate.name: extrapolate(p, p.seconds[-1] + more_seconds) for p in probes}
    return min(probes, key=lambda p: predicted[p.candidate.name]), predicted


def blank(probe: Probe) -> bool:
    """Whether ``probe``'s model writes no character yet (its last validation CER 1.0): CTC's blank stage, where
    every candidate's loss falls as its blank probability settles and their ranking is not that of what they learn
    after. On the bundled corpus in 5 minutes the search chose d64-lr0.001 by such losses (test WER 0.695) where
    the recipe's own model for the same 5 minutes scored 0.268 (docs/benchmarks.md, 2026-11-28 late night). On the
    Czech hour no figure tried (the loss, the cross-entropy of the characters at the frames CTC aligns them to, CERs
    with the blank lowered) ranked four candidates before one wrote, and comparing them once the recipe's model
    wrote (a scout, 2026-11-29 noon) chose one ahead for minutes and behind by the hour: the rule stays."""
    return bool(probe.errors) and probe.errors[-1] >= 1.0


def survivors(probes: list[Probe], keep: int) -> list[Probe]:
    """The ``keep`` probes with the lowest last validation loss (stable: ties keep the earlier candidate)."""
    return sorted(probes, key=lambda p: p.losses[-1])[:keep]


def candidates_of(cli) -> list[Candidate]:
    """The candidates around ``cli``'s model (WIDTHS x d_model, rounded to a multiple of 2 x heads; LR_FACTORS x
    its lr), each with its parameters and its step time on this machine (asr.train.precision)."""
    from asr.train import precision  # here: its imports build nothing the plan does not need
    from asr.train.module import ASRModule

    module = cli.model
    settings = ASRModule.settings(dict(module.hparams))
    encoder, heads = settings["encoder"], settings["encoder"].n_heads
    lr = module.optimizer_factory([torch.nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"]
    batch = precision.probe_batch(module, cli.datamodule)
    found = []
    def rounded(width: float) -> int:  # a multiple of 2 x heads: heads of an even size (rotary pairs)
        return max(2 * heads, round(width / (2 * heads)) * 2 * heads)

    for width in sorted({rounded(encoder.d_model * w) for w in WIDTHS}):
        sized = ASRModule(tokenizer=module.tokenizer, optimizer=module.optimizer_factory,
                          **{**settings, "encoder": replace(encoder, d_model=width)})
        times = precision.measured_steps(sized, batch)
        step_s = min(t for k, t in times.items() if k != "cached")
        params = sum(p.numel() for p in sized.parameters())
        found += [Candidate(width, lr * f, params, step_s, width == rounded(encoder.d_model) and f == 1.0)
                  for f in LR_FACTORS]
    return sorted(found, key=lambda c: not c.own)  # the recipe's own first (Search.rounds), the rest as they were


def fewer(candidates: list[Candidate], d_model: int) -> list[list[Candidate]]:
    """The sets a budget may afford, largest first: every candidate; the recipe's width and the smaller ones
    (cheaper steps); the recipe's width alone at each learning rate."""
    sets = [candidates, [c for c in candidates if c.d_model <= d_model], [c for c in candidates if c.d_model == d_model]]
    return [s for i, s in enumerate(sets) if s and s not in sets[:i]]


def process_seconds() -> float:
    """Seconds since this process started (its start-up is part of the budget)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux: since this module was imported
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


class StopAtStep(pl.Callback):
    """Stop training after optimizer step ``step`` (a probe's round); the epoch's end writes last.ckpt as ever.
    Lightning validates where a run is stopped: ``validated_at`` is the step of the last validation, so the round's
    loss is read from it instead of validating a second time."""

    def __init__(self, step: int):
        self.step, self.validated_at = step, -1

    def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, *args) -> None:
        if not trainer.sanity_checking:
            self.validated_at = trainer.global_step


def round_end(probe: Probe, t0: float, k: int) -> int:
    """The step round ``k`` of the probe stops ``probe`` at: its steps so far and the round's own seconds (t0 in the
    first, then t0 2^(k-1): the rounds double what each survivor has trained) at its seconds a step."""
    done = probe.steps[-1] if probe.steps else 0
    return done + max(1, round(t0 * (2 ** k - (2 ** (k - 1) if k else 0)) / probe.candidate.step_s))


def calibrate(probe: Probe) -> None:
    """After a round: the candidate's seconds a step as its runs took them (data, the loop and its validation
    included), which its next rounds and the schedule its probe follows are sized with. The timed model step
    it was planned with leaves those out: on the 2-core EPYC the default run's candidates took 0.29-0.33 s a step
    against 0.10-0.18 timed, so a winner sized by the timed step kept its peak learning rate to the end
    (docs/benchmarks.md, 2026-11-28 night)."""
    if probe.steps and probe.steps[-1] > 0 and probe.seconds[-1] > 0:
        probe.candidate = replace(probe.candidate, step_s=probe.seconds[-1] / probe.steps[-1])


def scale_untried(probes: list[Probe], tried: Probe, timed_s: float) -> None:
    """After the probe's first run: every candidate not yet run is sized by its timed model step plus what the
    loop added to ``tried``'s a step (data, optimizer, validation: its seconds a step less its timed ``timed_s``),
    so that the first round gives each candidate its t0 seconds and its schedule the steps it will make. Sized by
    the timed step alone, the first round of the 5-minute budget on the 2-core EPYC took 12-18 s a candidate for a
    t0 of 6.3 s (0.27-0.38 s a step against 0.10-0.18 timed: the loop adds about the same seconds to each width),
    and the warm-up and cosine of the others were sized for 2-3x the steps they made (docs/benchmarks.md)."""
    extra = max(0.0, tried.candidate.step_s - timed_s)
    for probe in probes:
        if not probe.steps:
            probe.candidate = replace(probe.candidate, step_s=probe.candidate.step_s + extra)


def train_seconds(trainer: pl.Trainer) -> float:
    """Seconds of training so far by trainer.max_time's Timer (resumed runs included)."""
    timer = next(c for c in trainer.callbacks if isinstance(c, pl.callbacks.Timer))
    return timer.time_elapsed("train")


class Search:
    """The probe and the choice, run in this process through asr.train.fitting.main (one run per candidate and round).

    ``args``: the asr.fit arguments without the budget's own; ``budget``: seconds, counted from this process'
    start."""

    def __init__(self, args: list[str], budget: float, say=print):
        from asr.train import fitting  # here: asr.train.fitting imports this module

        self.fit, self.args, self.budget, self.say = fitting, args, budget, say
        began = time.monotonic()
        self.base = fitting.build(args)
        self.build_seconds = time.monotonic() - began  # what each probe run pays again before its first step
        self.folder = budget_folder(self.base)
        self.save_dir, self.name = self.folder.parent.parent, self.folder.parent.name
        self.tokenizer = self.folder / "tokenizer.model"
        if self.base.model.hparams.init_from:
            raise ConfigError(f"--budget tries widths other than --model.init_from {self.base.model.hparams.init_from}'s:"
                              " to fine-tune that model, train it with --trainer.max_time instead of --budget")

    def left(self) -> float:
        """Seconds of the budget not yet spent, less the reserve for the final test."""
        return self.budget * (1 - RESERVE_SHARE) - process_seconds()

    def plan(self) -> tuple[list[Candidate], Schedule]:
        """The candidates and the probe's schedule: all six where the budget allows, else fewer (``fewer``)."""
        every = candidates_of(self.base)
        for candidates in fewer(every, self.base.model.hparams.encoder["d_model"]):
            rounds = sum(halving(len(candidates))) + 1  # each a run of its own with its start-up; +1: the winner's
            train = self.left() - rounds * self.build_seconds
            try:
                return candidates, schedule(train, candidates)
            except BudgetTooSmall as small:  # each second more of training needs 1 / (1 - reserve) of budget
                needed, why = self.budget + (small.train_seconds - train) / (1 - RESERVE_SHARE), str(small)
        raise ConfigError(f"--budget {clock(self.budget)[3:]} is too small to choose a model in: {why}; the "
                          f"smallest budget that would do is about {clock(math.ceil(needed))[3:]} on this machine "
                          "(or train one model: --trainer.max_time)")

    def arguments(self, probe: Probe, plan: Schedule, final: bool) -> list[str]:
        """asr.fit's arguments for ``probe``'s next run: a round of the probe into the budget folder, its schedule
        sized to the winner's seconds at the candidate's seconds a step, or (``final``) the winner's run into the run
        folder to the end of the time left, its cosine by the clock (no max_steps): the probes' seconds a step (a
        run each, a validation each) overstate a long run's, and winners stopped by steps ended 5- and 15-minute
        budgets at 4:32 and 13:11 (docs/benchmarks.md, 2026-11-28 late night)."""
        candidate = probe.candidate
        total = -1 if final else max(1, int(plan.winner_seconds / candidate.step_s))
        if final:
            limit = (probe.seconds[-1] if probe.seconds else 0.0) + self.left() - self.build_seconds
            where = [str(self.save_dir), self.name]
        else:
            limit, where = plan.winner_seconds, [str(self.folder), candidate.name]
        return [*self.args, "--data.tokenizer.model", str(self.tokenizer), *candidate.overrides(total, limit),
                "--trainer.logger.init_args.save_dir", where[0], "--trainer.logger.init_args.name", where[1],
                *([] if final else ["--test", "false"]), *(["--ckpt_path", probe.checkpoint] if probe.checkpoint else [])]

    def run(self, probe: Probe, plan: Schedule, steps: int | None) -> None:
        """Train ``probe``'s candidate on, from its last checkpoint, to ``steps`` and record its validation loss;
        None: the winner's run, to the end of the time left."""
        began = time.monotonic()
        stop = StopAtStep(steps) if steps else None
        callbacks = [stop] if stop else [RunFolders(self.folder / PLAN)]
        cli = self.fit.main(self.arguments(probe, plan, steps is None), callbacks, within_budget=True)
        if stop:
            metrics = cli.trainer.callback_metrics
            if stop.validated_at != cli.trainer.global_step or "val/loss" not in metrics:  # not validated at the stop
                (metrics,) = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
            probe.steps.append(cli.trainer.global_step)
            probe.seconds.append(train_seconds(cli.trainer))
            probe.losses.append(float(metrics["val/loss"]))
            probe.errors.append(float(metrics["val/cer"]))
            probe.checkpoint = str(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt")
            calibrate(probe)
        probe.wall += time.monotonic() - began
        self.final = cli

    def search(self) -> dict:
        """The probe (successive halving), the choice and the winner's run; returns the plan as plan.json holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / PLAN).unlink(missing_ok=True)  # an earlier search's: a resume follows this search's or none
        with write_atomically(self.tokenizer) as partial:
            self.base.datamodule.tokenizer.save(partial)
        candidates, plan = self.plan()
        probes = [Probe(c) for c in candidates]
        alive, undecided = self.rounds(probes, plan)
        if undecided:
            winner, predicted = alive[0], {}
            why = (f"the recipe's own model writes no character after its first round ({plan.t0:.0f} s; validation "
                   "CER 1.0, CTC's blank stage, whose losses do not rank what the models learn later): it continues")
        else:
            winner, predicted = choose(alive, plan.winner_seconds - plan.t0 * 2 ** (len(halving(len(candidates))) - 1))
            why = (f"lowest validation loss extrapolated to {plan.winner_seconds:.0f} s of training "
                   f"(loss = b t^-c fitted to each survivor's probe)")
        record = self.record(candidates, plan, probes, winner, predicted, why)
        record["continue"] = self.arguments(winner, plan, final=True)[len(self.args):]  # what a resume runs again
        write_plan(self.folder / PLAN, record)
        self.say(table(record))
        self.run(winner, plan, None)
        record = read_plan(self.folder / PLAN)  # with the winner's run folder (RunFolders)
        record["run_folder"] = self.final.trainer.log_dir
        record["spent_seconds"] = process_seconds()
        for folder in (self.folder, Path(self.final.trainer.log_dir)):
            write_plan(folder / PLAN, record)
        plot(record, Path(self.final.trainer.log_dir) / "plan.png")
        return record

    def rounds(self, probes: list[Probe], plan: Schedule) -> tuple[list[Probe], bool]:
        """Successive halving over ``probes`` (the recipe's own first): the survivors of the last round, False; or
        the recipe's own alone, True, when it is still ``blank`` after its first round (the others are not run)."""
        alive = probes
        for k, keep in enumerate(halving(len(probes))):
            alive = survivors(alive, keep) if k else alive
            for probe in alive:
                timed = probe.candidate.step_s
                self.run(probe, plan, round_end(probe, plan.t0, k))
                if probe is probes[0] and k == 0:
                    if probe.candidate.own and blank(probe):
                        return [probe], True
                    scale_untried(probes, probe, timed)
        return alive, False

    def record(self, candidates, plan, probes, winner, predicted, why: str) -> dict:
        return {
            "budget_seconds": self.budget, "probe_share": PROBE_SHARE, "widths": WIDTHS, "lr_factors": LR_FACTORS,
            "min_probe_steps": MIN_PROBE_STEPS, "reserve_share": RESERVE_SHARE,
            "t0_seconds": plan.t0, "probe_seconds": plan.probe_seconds, "winner_seconds": plan.winner_seconds,
            "probe_wall_seconds": sum(p.wall for p in probes),
            "candidates": [{**asdict(p.candidate), "name": p.candidate.name, "steps": p.steps, "seconds": p.seconds,
                            "val_losses": p.losses, "val_cers": p.errors, "wall_seconds": p.wall,
                            "timed_step_s": timed.step_s,
                            "fit_b_c": power_law(p.seconds, p.losses) if p.candidate.name in predicted else None,
                            "predicted_loss": predicted.get(p.candidate.name)} for p, timed in zip(probes, candidates)],
            "chosen": winner.candidate.name,
            "why": why,
        }


def table(record: dict) -> str:
    """The plan as the run prints it: one line per candidate."""
    lines = [f"budget {record['budget_seconds']:.0f} s: probe {record['probe_seconds']:.0f} s "
             f"({record['probe_share']:.0%} of the training time at most), winner trains {record['winner_seconds']:.0f} s",
             f"{'candidate':<16} {'params':>9} {'s/step':>7} {'steps':>14} {'val loss':>22} {'val CER':>16} "
             f"{'predicted':>9}"]
    for c in record["candidates"]:
        predicted = (f"{c['predicted_loss']:.3f}" if c["predicted_loss"] is not None
                     else "-" if c["name"] == record["chosen"] else "stopped" if c["steps"] else "not run")
        lines.append(f"{c['name']:<16} {c['params']:>9,} {c['step_s']:>7.3f} {'/'.join(map(str, c['steps'])):>14} "
                     f"{'/'.join(f'{x:.3f}' for x in c['val_losses']):>22} "
                     f"{'/'.join(f'{x:.2f}' for x in c['val_cers']):>16} {predicted:>9}")
    lines.append(f"chosen: {record['chosen']}: {record['why']}")
    return "\n".join(lines)


def plot(record: dict, path: Path) -> None:
    """Each candidate's validation loss against its training seconds (where matplotlib is installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(figsize=(6, 4))
    for c in record["candidates"]:
        axes.plot(c["seconds"], c["val_losses"], marker="o", label=c["name"] + (" (chosen)" if c["name"] == record["chosen"] else ""))
    axes.set(xlabel="training seconds", ylabel="validation loss", xscale="log", yscale="log")
    axes.legend(fontsize=7)
    figure.tight_layout()
    with write_atomically(path) as partial:
        figure.savefig(partial, format="png")
    plt.close(figure)


def budget_folder(cli) -> Path:
    """``<save_dir>/<name>/budget``: the probes' runs, the shared tokenizer and plan.json; ConfigError without a
    logger (its folder is the run's)."""
    logger = cli.trainer.logger
    if logger is None:
        raise ConfigError("--budget writes its probes and plan.json into the logger's folder: drop "
                          "--trainer.logger false (or set trainer.logger.init_args.save_dir)")
    return Path(logger.save_dir) / logger.name / "budget"


def write_plan(path: Path, record: dict) -> None:
    with write_atomically(path) as partial:
        partial.write_text(json.dumps(record, indent=1))


def read_plan(path: Path) -> dict:
    """plan.json's record; ConfigError naming the file if it does not read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a budget's plan ({err}); remove the folder's budget/ to search again") from err


class RunFolders(pl.Callback):
    """Adds the winner's run folder to plan.json's ``run_folders`` as its training starts (each resume's version
    too), so that a resume finds the winner's own last checkpoint, or knows it has none yet."""

    def __init__(self, plan: Path):
        self.plan = plan

    def on_fit_start(self, trainer: pl.Trainer, *args) -> None:
        if trainer.is_global_zero:
            record = read_plan(self.plan)
            record["run_folders"] = [*record.get("run_folders", []), trainer.log_dir]
            write_plan(self.plan, record)


def resume(args: list[str], given: str, budget: float) -> dict:
    """``--budget ... --ckpt_path last`` (``given``; ``args`` without it): continue the chosen run of the plan in the
    run folder, not the search: from the winner's newest readable last checkpoint, or, if it wrote none yet, from the
    probe's it started with. With no plan (the search did not finish) the search starts again."""
    from asr.train import fitting

    folder = budget_folder(fitting.build(args))
    if not (folder / PLAN).is_file():
        print(f"--budget with --ckpt_path: no model was chosen yet (no {folder / PLAN}: the search did not finish); "
              "the search starts again")
        return Search(args, budget).search()
    record = read_plan(folder / PLAN)
    again = list(record["continue"])  # with --ckpt_path of the probe's checkpoint the winner started from
    if given == "last":
        found = fitting.newest_readable(last_checkpoints(*map(Path, record.get("run_folders", []))))
        given = found or (again[again.index("--ckpt_path") + 1] if "--ckpt_path" in again else None)
    if "--ckpt_path" in again:
        del again[again.index("--ckpt_path"):again.index("--ckpt_path") + 2]
    print(f"--budget: continuing the chosen run, {record['chosen']} (plan: {folder / PLAN}), from {given}")
    fitting.main([*args, *again, *(["--ckpt_path", given] if given else [])], [RunFolders(folder / PLAN)],
                 within_budget=True)
    return record


def take_flag(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """(the value of ``name`` in ``args``, given as ``name V`` or ``name=V``, or None; the other arguments)."""
    rest, value, it = [], None, iter(args)
    for arg in it:
        if arg == name or arg.startswith(name + "="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, "")
        else:
            rest.append(arg)
    return value, rest


def split_args(args: list[str]) -> tuple[float | None, list[str]]:
    """(--budget's seconds or None, the other arguments): the budget is this module's, not LightningCLI's."""
    text, rest = take_flag(args, "--budget")
    return (None if text is None else parse_budget(text)), rest


def main(budget: float, args: list[str]) -> dict:
    """Train to ``budget`` seconds with asr.fit ``args``: the search, or with --ckpt_path the chosen run's resume.
    ConfigError for a flag the budget sets for each of its runs itself (SET_BY_THE_BUDGET)."""
    given = [a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in SET_BY_THE_BUDGET]
    if given:
        raise ConfigError(f"--budget sizes each of its runs' {', '.join(SET_BY_THE_BUDGET)} itself: drop {given[0]} "
                          "(or train one model for a time with --trainer.max_time instead of --budget)")
    ckpt_path, rest = take_flag(args, "--ckpt_path")
    if ckpt_path is not None:
        return resume(rest, ckpt_path, budget)
    return Search(args, budget).search()
