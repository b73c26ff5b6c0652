"""A transducer through asr.fit end to end: a tiny RNN-T trains on a slice of data/mini, scores validation with
greedy search, resumes where its checkpoint ended; its checkpoint transcribes (greedy and beam search, word times,
long files), exports with parity and averages. One short fit is shared by the tests of this module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.inference.transcribe import Transcriber
from asr.train.fit import main
from asr.train.module import ASRModule
from tests import MINI
from tests.decoded import own_transcripts
from tests.e2e.test_fit import epoch_losses, fit, slice_manifest

TRANSDUCER = ["--model.objective", "transducer", "--model.inter_ctc", "0", "--model.transducer.pred_dim", "32",
              "--model.transducer.joint_dim", "32", "--trainer.max_epochs", "2", "--data.max_batch_seconds", "8",
              "--data.max_duration", "8", "--trainer.precision", "32-true"]


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
