"""A transducer through asr.fit end to end: a tiny RNN-T trains on a slice of data/mini, scores validation with
greedy search, resumes where its checkpoint ended; its checkpoint transcribes (greedy and beam search, word times,
long files), exports with parity and averages. One short fit is shared by the tests of this module. A hybrid with
intermediate CTC trains on 2 processes under DDP and resumes under FSDP2 (subprocesses, as test_resilience's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.checkpoint import merge
from asr.inference.transcriber import Transcriber
from asr.train.fitting import main
from asr.train.module import ASRModule
from tests import MINI
from tests.cli import CHAR_FRAMES
from tests.decoded import own_transcripts
from tests.e2e import test_resilience as resilience
from tests.e2e.test_fit import epoch_losses, fit, slice_manifest
from tests.e2e.test_resilience import data  # noqa: F401  (a fixture)

TRANSDUCER = ["--model.objective", "transducer", "--model.inter_ctc", "0", "--model.transducer.pred_dim", "32",
              "--model.transducer.joint_dim", "32", "--trainer.max_epochs", "2", "--data.max_batch_seconds", "8",
              "--data.filter.max_duration", "8", "--trainer.precision", "32-true"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-epoch fit of a tiny transducer on 24 utterances of data/mini; the run folder."""
    tmp = tmp_path_factory.mktemp("transducer")
    train = slice_manifest(MINI / "train.jsonl", tmp / "train.jsonl", 24)
    dev = slice_manifest(MINI / "dev.jsonl", tmp / "dev.jsonl", 4)
    cli = fit(tmp, *TRANSDUCER, "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
              "--data.test_manifest", str(dev))
    return Path(cli.trainer.log_dir)


def test_a_transducer_trains_validates_and_tests_with_asr_fit(run):
    metrics = (run / "metrics.csv").read_text()
    assert "val/wer" in metrics and "test/wer" in metrics
    losses = epoch_losses(run)
    assert len(losses) == 2 and losses[-1] < losses[0]
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["objective"] == "transducer"
    assert any(name.startswith("model.joiner.") for name in checkpoint["state_dict"])


def test_resuming_a_transducer_continues_from_its_checkpoint(run, tmp_path, monkeypatch):
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    at_start = {}
    on_train_start = ASRModule.on_train_start

    def record(module):
        on_train_start(module)
        at_start.update(step=module.trainer.global_step, weights={k: v.clone() for k, v in module.state_dict().items()})

    monkeypatch.setattr(ASRModule, "on_train_start", record)
    cli = main(["--config", str(run / "config.yaml"), "--ckpt_path", str(last), "--trainer.max_epochs", "3",
                "--trainer.logger.init_args.save_dir", str(tmp_path), "--test", "false"])
    steps = checkpoint["global_step"]
    assert at_start["step"] == steps > 0
    assert all(torch.equal(at_start["weights"][k], v) for k, v in checkpoint["state_dict"].items())
    assert cli.trainer.current_epoch == 3 and cli.trainer.global_step == steps + steps // 2


def test_the_checkpoint_transcribes_as_it_decodes_itself_with_word_times(run):
    last = run / "checkpoints" / "last.ckpt"
    paths = [MINI / "audio" / "test" / f"00000{i}.flac" for i in range(3)]
    results = Transcriber.from_checkpoint(last, second_pass=0).transcribe_results(paths)
    assert [r.text for r in results] == own_transcripts(last, paths)
    for result in results:
        times = [t for w in result.words for t in (w.start, w.end)]
        assert times == sorted(times) and all(0 <= t <= result.duration for t in times)
        assert all(0 < w.confidence <= 1 for w in result.words) and 0 <= result.blank_share <= 1


@pytest.mark.parametrize("base", ["real-1h-cpu", "gpu-100h"])
def test_a_transducer_recipe_changes_only_the_objective_of_the_recipe_it_goes_after(base):
    from tests.e2e.test_recipes import printed_config

    plain = printed_config("--config", f"configs/recipes/{base}.yaml")
    hybrid = printed_config("--config", f"configs/recipes/{base}.yaml", "--config",
                            f"configs/recipes/{base}-transducer.yaml")
    assert hybrid["model"]["objective"] == "hybrid" and hybrid["trainer"]["logger"]["init_args"]["name"] == \
        f"{base}-transducer"
    assert hybrid["model"]["encoder"] == plain["model"]["encoder"] and hybrid["data"] == plain["data"]
    changed = {key for key in plain["model"] if plain["model"][key] != hybrid["model"][key]}
    assert changed <= {"objective", "transducer"}


def test_a_hybrid_with_intermediate_ctc_trains_on_2_ranks_under_ddp_resumes_under_fsdp2_and_transcribes(data,
                                                                                                      tmp_path):
    """Every head has a loss (RNN-T, the hybrid's CTC, intermediate CTC: DDP fails on a parameter without a
    gradient); FSDP2 shards the prediction network, joiner and head with the root, resumes DDP's file with
    ``--ckpt_path last`` and writes its checkpoint as a folder of shards, which transcribes as its module decodes."""
    hybrid = [*data, *resilience.SMALL, *resilience.DETERMINISTIC, *CHAR_FRAMES, "--data.tokenizer.type", "char",
              "--model.objective", "hybrid", "--model.inter_ctc", "0.3", "--model.transducer.pred_dim", "32",
              "--model.transducer.joint_dim", "32", "--data.num_workers", "0", "--trainer.precision", "32-true"]
    resilience.fit(tmp_path, "--config", "configs/strategy/ddp.yaml", *hybrid, "--trainer.max_epochs", "1")
    first = resilience.versions(tmp_path)[0] / "checkpoints" / "last.ckpt"
    steps = torch.load(first, weights_only=True)["global_step"]  # a file: DDP's
    resilience.fit(tmp_path, "--config", "configs/strategy/fsdp.yaml", *hybrid, "--trainer.max_epochs", "2",
                   "--ckpt_path", "last")
    last = resilience.versions(tmp_path)[1] / "checkpoints" / "last.ckpt"
    checkpoint = merge(last)
    assert last.is_dir() and checkpoint["global_step"] == 2 * steps == 8  # 28 utterances, 2 ranks: 4 steps an epoch
    settings = checkpoint["hyper_parameters"]
    assert (settings["objective"], settings["inter_ctc"]) == ("hybrid", 0.3)
    assert {name.split(".")[1] for name in checkpoint["state_dict"]} >= {"head", "predictor", "joiner"}
    losses = resilience.step_losses(tmp_path)
    assert sorted(losses) == list(range(8)) and sum(losses[s] for s in (6, 7)) < sum(losses[s] for s in (0, 1))
    paths = [MINI / "audio" / "test" / f"00000{i}.flac" for i in range(2)]
    assert Transcriber.from_checkpoint(last, second_pass=0).transcribe(paths) == own_transcripts(last, paths)
