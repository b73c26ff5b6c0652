"""asr.train.budget: ``--budget`` parsing, the probe's plan, the choice on injected curves, the refusal of a budget
too small, and a tiny budgeted run end to end (its plan.json, its test, its resume)."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

from asr.settings import ConfigError
from asr.train import budget, precision
from asr.train.budget import Candidate, Probe
from tests import MINI
from tests.e2e.test_fit import TINY, slice_manifest


def test_a_budget_is_a_wall_time_or_seconds_and_a_mistake_names_the_flag():
    assert budget.parse_budget("00:15:00") == 900
    assert budget.parse_budget("01:00:00") == 3600 and budget.parse_budget("1:02:03:04") == 93784
    assert budget.parse_budget("90") == 90
    for bad in ("15 minutes", "00:00:00", "-5"):
        with pytest.raises(ConfigError, match="--budget"):
            budget.parse_budget(bad)
    assert budget.split_args(["--budget", "00:05:00", "--seed_everything", "1"]) == (300, ["--seed_everything", "1"])
    assert budget.split_args(["--budget=60"]) == (60, [])


def test_successive_halving_keeps_half_each_round_and_doubles_the_time():
    assert budget.halving(6) == [6, 3, 2] and budget.halving(4) == [4, 2] and budget.halving(2) == [2]
    assert budget.probe_units(6) == 6 * 1 + 3 * 1 + 2 * 2  # round k takes each survivor from t0 2^(k-1) to t0 2^k


def candidates(*step_s: float) -> list[Candidate]:
    return [Candidate(64 + 32 * i, 1e-3, 1000, s) for i, s in enumerate(step_s)]


def test_the_probe_takes_its_share_and_the_winner_gets_the_rest():
    plan = budget.schedule(1000.0, candidates(0.1, 0.1, 0.2, 0.2, 0.3, 0.3))
    assert plan.probe_seconds == pytest.approx(budget.PROBE_SHARE * 1000)
    assert plan.t0 == pytest.approx(plan.probe_seconds / 13)
    assert plan.winner_seconds == pytest.approx(1000 - plan.probe_seconds + 4 * plan.t0)


def test_a_probe_round_sizes_the_candidates_next_steps_by_the_seconds_its_runs_took():
    """Planned at its timed model step (0.1 s), a candidate whose round took 0.3 s a step (data, loop, validation)
    is sized by 0.3 s afterwards: its next round's steps and, as the winner, its schedule's."""
    probe = budget.Probe(candidates(0.1)[0], steps=[62], seconds=[18.6], losses=[4.0])
    budget.calibrate(probe)
    assert probe.candidate.step_s == pytest.approx(0.3) and probe.candidate.d_model == 64
    assert budget.round_end(probe, 6.0, 1) == 62 + 20  # the second round adds its 6 s: 20 steps at 0.3 s, not 60
    assert budget.round_end(probe, 6.0, 2) == 62 + 40  # the third its 12 s
    untrained = budget.Probe(candidates(0.1)[0])
    budget.calibrate(untrained)  # no round yet: the timed step stands
    assert untrained.candidate.step_s == 0.1 and budget.round_end(untrained, 6.0, 0) == 60


def test_the_first_run_sizes_the_candidates_not_yet_run_by_what_the_loop_adds_to_a_step():
    """The first candidate's round took 0.27 s a step against its timed 0.10: each candidate not yet run is sized
    by its own timed step plus those 0.17 s (its first round's steps and its schedule); one already run keeps its
    own measured step."""
    first, *rest = [budget.Probe(c) for c in candidates(0.1, 0.15, 0.2)]
    rest[1].steps, rest[1].seconds = [10], [4.0]
    budget.calibrate(rest[1])  # as if already run: 0.4 s a step
    first.steps, first.seconds, first.losses = [60], [16.2], [4.0]
    budget.calibrate(first)
    budget.scale_untried([first, *rest], first, 0.1)
    assert first.candidate.step_s == pytest.approx(0.27)
    assert rest[0].candidate.step_s == pytest.approx(0.15 + 0.17) and rest[1].candidate.step_s == pytest.approx(0.4)
    assert budget.round_end(rest[0], 6.4, 0) == 20  # t0 of 6.4 s at 0.32 s a step, not 43 at the timed 0.15


def test_a_probe_round_stops_at_its_steps_and_the_winner_by_the_clock_alone(monkeypatch, tmp_path):
    """A round's run has a schedule of the winner's seconds in steps; the winner's run has no max_steps (its cosine
    follows the clock: a long run's steps are faster than the probes') and the budget's time left."""
    search = object.__new__(budget.Search)
    search.args, search.budget, search.build_seconds = ["--seed_everything", "1"], 900.0, 10.0
    search.save_dir, search.name, search.folder, search.tokenizer = tmp_path, "run", tmp_path / "b", tmp_path / "t"
    monkeypatch.setattr(budget, "process_seconds", lambda: 300.0)
    probe = budget.Probe(candidates(0.5)[0], steps=[100], seconds=[60.0], losses=[3.0], checkpoint="last.ckpt")
    plan = budget.Schedule(t0=20.0, winner_seconds=600.0, probe_seconds=200.0)

    def flag(args: list[str], name: str) -> str:
        return args[args.index(name) + 1]

    round_ = search.arguments(probe, plan, final=False)
    assert flag(round_, "--trainer.max_steps") == "1200" and flag(round_, "--trainer.max_time") == "00:00:10:00"
    final = search.arguments(probe, plan, final=True)
    left = 900 * (1 - budget.RESERVE_SHARE) - 300 - 10  # the budget less the reserve, time spent and a start-up
    assert flag(final, "--trainer.max_steps") == "-1" and flag(final, "--trainer.max_time") == budget.clock(60 + left)
    assert flag(final, "--ckpt_path") == "last.ckpt" and flag(final, "--trainer.logger.init_args.name") == "run"


def test_a_budget_too_small_for_the_slowest_candidate_names_the_training_time_that_would_do():
    with pytest.raises(budget.BudgetTooSmall) as refused:
        budget.schedule(10.0, candidates(0.1, 1.0))
    assert refused.value.train_seconds == pytest.approx(budget.MIN_PROBE_STEPS * 1.0 * 2 / budget.PROBE_SHARE)
    budget.schedule(refused.value.train_seconds * 1.001, candidates(0.1, 1.0))  # that much is enough


def test_a_power_law_is_recovered_and_a_worse_probe_extrapolates_flat():
    seconds = [10.0, 20.0, 40.0]
    b, c = budget.power_law(seconds, [3.0 * t ** -0.5 for t in seconds])
    assert b == pytest.approx(3.0) and c == pytest.approx(0.5)
    assert budget.power_law(seconds, [1.0, 1.1, 1.2])[1] == 0.0
    assert budget.power_law([10.0], [2.0]) == (2.0, 0.0)


def probe(name_width: int, seconds: list[float], losses: list[float]) -> Probe:
    return Probe(Candidate(name_width, 1e-3, 1000, 0.1), steps=[1] * len(seconds), seconds=seconds, losses=losses)


def test_the_choice_is_the_lowest_extrapolated_loss_not_the_lowest_loss_now():
    """A larger model starts behind but learns faster: given the time, it wins (the curves cross)."""
    fast_start = probe(64, [10, 20, 40], [1.00 * t ** -0.1 for t in (10, 20, 40)])
    fast_learner = probe(128, [10, 20, 40], [2.50 * t ** -0.3 for t in (10, 20, 40)])
    assert fast_start.losses[-1] < fast_learner.losses[-1]
    assert budget.choose([fast_start, fast_learner], more_seconds=20)[0] is fast_start  # they cross at 98 s
    winner, predicted = budget.choose([fast_start, fast_learner], more_seconds=2000)
    assert winner is fast_learner and predicted["d128-lr0.001"] < predicted["d64-lr0.001"]


def rounds_with(first_cer: float) -> tuple[list[Probe], list[Probe], bool]:
    """Search.rounds over six candidates whose runs are faked: each round reaches its planned step and adds 5 s and
    a loss (lower for wider models), and validation CER ``first_cer`` for the recipe's own (run first), 0.9 for the
    others."""
    search = object.__new__(budget.Search)
    found = candidates(0.1, 0.1, 0.1, 0.1, 0.1, 0.1)
    found[2] = replace(found[2], own=True)
    probes = [Probe(c) for c in sorted(found, key=lambda c: not c.own)]
    ran = []

    def run(probe, plan, steps):
        ran.append(probe)
        probe.steps.append(steps)
        probe.seconds.append(5.0 * len(probe.steps))
        probe.losses.append(4.0 - probe.candidate.d_model / 100 - 0.1 * len(probe.steps))
        probe.errors.append(first_cer if probe.candidate.own else 0.9)

    search.run = run
    alive, undecided = search.rounds(probes, budget.Schedule(t0=1.0, winner_seconds=100.0, probe_seconds=13.0))
    return ran, alive, undecided


def test_while_the_recipes_own_model_writes_no_character_the_search_stops_with_it():
    """In CTC's blank stage (validation CER 1.0) losses do not say which model learns more: if the recipe's own
    model, run first, writes nothing after its first round, no other candidate runs and it continues; once it
    writes, every candidate runs and successive halving decides."""
    ran, alive, undecided = rounds_with(1.0)
    assert undecided and [p.candidate.own for p in ran] == [True] and alive == ran
    ran, alive, undecided = rounds_with(0.95)
    assert not undecided and len(ran) == 6 + 3 + 2 and len(alive) == 2
    assert not any(budget.blank(p) for p in alive) and budget.blank(Probe(Candidate(64, 1e-3), errors=[1.0]))


def test_survivors_are_the_lowest_losses_in_a_stable_order():
    probes = [probe(64, [1], [0.5]), probe(96, [1], [0.4]), probe(128, [1], [0.5])]
    assert [p.candidate.d_model for p in budget.survivors(probes, 2)] == [96, 64]


def test_candidates_widen_the_recipes_model_and_raise_its_learning_rate(tmp_path):
    from asr.train.fitting import build

    cli = build(["--trainer.logger.init_args.save_dir", str(tmp_path), *TINY, "--model.encoder.d_model", "96"])
    found = budget.candidates_of(cli)
    assert sorted({c.d_model for c in found}) == [64, 96, 144]  # 2/3, 1 and 1.5 of 96, multiples of 2 x 2 heads
    assert sorted({c.lr for c in found}) == [1e-3, 2e-3]  # AdamW's own lr and twice it
    assert [(c.d_model, c.lr) for c in found if c.own] == [(96, 1e-3)]  # the recipe's own model and rate
    small, large = min(found, key=lambda c: c.params), max(found, key=lambda c: c.params)
    assert small.params < large.params and all(c.step_s > 0 for c in found)


def budget_run(tmp: Path, blank_stage: bool, seconds: str = "00:01:00", in_config: bool = False
               ) -> tuple[list[str], dict, int]:
    """``asr.fit --budget SECONDS`` of two candidates (one width, two learning rates) on a slice of data/mini, in
    ``tmp``: its arguments, its plan and the validations run outside the rounds. A few steps leave every model in
    CTC's blank stage, where the search stops after the recipe's own first round; ``blank_stage`` False makes both
    run and the losses choose, as they do once a model writes. ``in_config``: the budget from a --config file."""
    train = slice_manifest(MINI / "train.jsonl", tmp / "train.jsonl", 60)
    dev = slice_manifest(MINI / "dev.jsonl", tmp / "dev.jsonl", 10)
    args = ["--trainer.logger.init_args.save_dir", str(tmp / "runs"), "--trainer.enable_progress_bar", "false",
            "--data.num_workers", "0", *TINY, "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
            "--data.test_manifest", str(dev), "--data.max_batch_seconds", "8"]
    if in_config:
        (tmp / "budget.yaml").write_text(f'budget: "{seconds}"\n')
    given = ["--config", str(tmp / "budget.yaml")] if in_config else ["--budget", seconds]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(budget, "WIDTHS", (1.0,))
        patch.setattr(budget, "MIN_PROBE_STEPS", 3)
        if not blank_stage:
            patch.setattr(budget, "blank", lambda probe: False)
        patch.setattr(budget, "process_seconds", lambda: 0.0)  # the test's own process has run for minutes
        patch.setattr(precision, "measured_steps", lambda *a: {"32-true": 1.0, "bf16-mixed": math.inf})  # any CPU
        validations, validate = [], pl.Trainer.validate
        patch.setattr(pl.Trainer, "validate", lambda *a, **k: validations.append(1) or validate(*a, **k))
        from asr.train.fitting import main

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            record = main([*given, *args])
    assert not [w for w in caught if "args parameter" in str(w.message)]  # the runs' args are not beside sys.argv
    return args, record, len(validations)


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budget")
    return tmp, *budget_run(tmp, blank_stage=False)


def test_a_budgeted_run_in_the_blank_stage_trains_the_recipes_own_model_on(tmp_path):
    """The default path of a short budget: the recipe's own model runs its first round, writes nothing yet, and
    continues with the rest of the time; the other candidate never runs. The budget is a --config file's (`budget:`),
    which its own runs do not start again."""
    _, record, _ = budget_run(tmp_path, blank_stage=True, seconds="00:00:40", in_config=True)  # shorter: CI time
    own, other = record["candidates"]
    assert own["own"] and record["chosen"] == own["name"] and "writes no character" in record["why"]
    assert own["val_cers"] == [1.0] and other["steps"] == [] and other["val_losses"] == []
    folder = Path(record["run_folder"])
    assert "test/wer" in (folder / "metrics.csv").read_text() and (folder / "checkpoints" / "last.ckpt").is_file()
    assert str(own["lr"]) in (folder / "config.yaml").read_text()


def test_a_budgeted_run_probes_chooses_continues_and_tests(budgeted):
    tmp, _, record, validations = budgeted
    assert validations == 0  # each round's loss is the validation Lightning runs where the round stops, not a second
    folder = Path(record["run_folder"])
    assert folder.parent == tmp / "runs" / "default"  # the winner's run is the run folder's next version
    assert json.loads((folder / "plan.json").read_text())["chosen"] == record["chosen"]
    assert len(record["candidates"]) == 2 and record["chosen"] in {c["name"] for c in record["candidates"]}
    for c in record["candidates"]:
        assert len(c["val_losses"]) == 1 and math.isfinite(c["val_losses"][0]) and c["steps"][0] >= 3
        assert len(c["val_cers"]) == 1 and 0.0 <= c["val_cers"][0] <= 1.0
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    metrics = (folder / "metrics.csv").read_text()
    assert "test/wer" in metrics  # scored on the test split as any run
    chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    config = (folder / "config.yaml").read_text()
    assert f"lr: {chosen['lr']}" in config.replace("0.001", "0.001") or str(chosen["lr"]) in config


def test_a_budgeted_run_resumes_the_chosen_run_not_the_search(budgeted, capsys):
    tmp, args, record, _ = budgeted
    from asr.train.fitting import main

    main(["--budget", "00:01:00", *args, "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert f"continuing the chosen run, {record['chosen']}" in out
    assert f"from {Path(record['run_folder']) / 'checkpoints'}" in out  # the winner's own, not a probe's
    assert not (tmp / "runs" / "default" / "budget" / "d64-lr0.001" / "version_1").exists()  # no probe ran again


def test_a_budget_too_small_is_refused_with_the_smallest_that_would_do(tmp_path):
    from asr.train.fitting import main

    with pytest.raises(ConfigError, match=r"too small .* smallest budget that would do is about \d\d:\d\d:\d\d"):
        main(["--budget", "00:00:02", "--trainer.logger.init_args.save_dir", str(tmp_path), *TINY])


def test_a_smaller_budget_probes_fewer_candidates_the_cheaper_ones_first():
    found = [Candidate(d, lr, 1000, 0.1) for d in (64, 96, 144) for lr in (1e-3, 2e-3)]
    sets = budget.fewer(found, 96)
    assert [len(s) for s in sets] == [6, 4, 2]
    assert {c.d_model for c in sets[1]} == {64, 96} and {c.d_model for c in sets[2]} == {96}


def test_flags_the_budget_sets_for_each_run_are_refused_by_name():
    from asr.train.fitting import main

    for flag in ("--trainer.max_time", "--trainer.max_steps", "--trainer.max_epochs"):
        with pytest.raises(ConfigError, match=f"drop {flag}"):
            main(["--budget", "00:05:00", flag, "10"])
    with pytest.raises(ConfigError, match="drop --trainer.max_steps"):
        main(["--budget=300", "--trainer.max_steps=10"])


def test_a_budget_without_a_run_folder_or_from_another_models_weights_is_refused(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="--trainer.logger false"):
        budget.budget_folder(SimpleNamespace(trainer=SimpleNamespace(logger=None)))
    from asr.train import fitting

    built = SimpleNamespace(trainer=SimpleNamespace(logger=SimpleNamespace(save_dir=str(tmp_path), name="run")),
                            model=SimpleNamespace(hparams=SimpleNamespace(init_from="base.ckpt")))
    monkeypatch.setattr(fitting, "build", lambda args: built)
    with pytest.raises(ConfigError, match="--model.init_from base.ckpt"):
        budget.Search([], 300.0)


def test_the_smallest_budget_named_is_enough(monkeypatch):
    """The budget a refusal names affords the probe: the reserve is a share of the budget, not of what was asked."""
    monkeypatch.setattr(budget, "process_seconds", lambda: 20.0)
    monkeypatch.setattr(budget, "candidates_of", lambda base: candidates(0.5, 0.5))
    search = object.__new__(budget.Search)
    search.build_seconds, search.budget = 5.0, 30.0
    search.base = SimpleNamespace(model=SimpleNamespace(hparams=SimpleNamespace(encoder={"d_model": 64})))
    with pytest.raises(ConfigError, match="smallest budget") as refused:
        search.plan()
    search.budget = budget.parse_budget(str(refused.value).rsplit("about ", 1)[1].split()[0])
    _, plan = search.plan()  # no refusal: the first round has its steps
    assert plan.t0 >= budget.MIN_PROBE_STEPS * 0.5


def resume_in(tmp: Path, monkeypatch, plan: dict | None) -> list[str]:
    """budget.main (the resume) of ``--ckpt_path last`` in a run folder ``tmp/run`` holding ``plan`` (None: no plan.json):
    the arguments of the run it continues (asr.fit's main faked), or ["search"] if the search starts again."""
    from asr.train import fitting

    built = SimpleNamespace(trainer=SimpleNamespace(logger=SimpleNamespace(save_dir=str(tmp), name="run")))
    monkeypatch.setattr(fitting, "build", lambda args: built)
    ran = []
    monkeypatch.setattr(fitting, "main", lambda args, callbacks=(), within_budget=False: ran.extend(args))
    monkeypatch.setattr(budget, "Search", lambda args, seconds: SimpleNamespace(search=lambda: ran.append("search")))
    (tmp / "run" / "budget").mkdir(parents=True)
    if plan is not None:
        budget.write_plan(tmp / "run" / "budget" / budget.PLAN, plan)
    budget.main(300.0, ["--seed_everything", "1", "--ckpt_path", "last"])
    return ran


def test_a_resume_before_the_winner_wrote_a_checkpoint_starts_from_its_probe_not_another_run(monkeypatch, tmp_path):
    """Stopped before the choice, the search starts again; stopped after it but before the winner's first checkpoint,
    the winner starts from the probe's weights it was chosen with, not from another run's last.ckpt in the folder;
    once it wrote one, from its own."""
    assert resume_in(tmp_path / "a", monkeypatch, None) == ["search"]
    other = tmp_path / "b" / "run" / "version_0" / "checkpoints"
    other.mkdir(parents=True)
    (other / "last.ckpt").write_bytes(b"an earlier run of the folder")
    winner = tmp_path / "b" / "run" / "version_1"
    plan = {"chosen": "d64-lr0.001", "continue": ["--model.encoder.d_model", "64", "--ckpt_path", "probe/last.ckpt"],
            "run_folders": [str(winner)]}
    ran = resume_in(tmp_path / "b", monkeypatch, plan)
    assert ran[ran.index("--ckpt_path") + 1] == "probe/last.ckpt" and ran.count("--ckpt_path") == 1
    assert ran[:2] == ["--seed_everything", "1"] and "--model.encoder.d_model" in ran
    (winner / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}}, winner / "checkpoints" / "last.ckpt")
    ran = resume_in(tmp_path / "c", monkeypatch, plan)
    assert ran[ran.index("--ckpt_path") + 1] == str(winner / "checkpoints" / "last.ckpt")
