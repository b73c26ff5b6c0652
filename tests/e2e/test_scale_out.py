"""Scale-out levers chosen from config: DDP and FSDP2 on CPU (gloo, 2 processes) train like
one process with the same global batch; sharded checkpoints transcribe in one process and
resume under another strategy; impossible combinations are refused in one sentence.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from pytorch_lightning.strategies import DDPStrategy

from asr.checkpoint import merge
from asr.inference.transcriber import Transcriber
from asr.tokenizer import Tokenizer
from asr.tools.converting import convert
from asr.train.fitting import ConfigError, build, check_hardware, main
from asr.train.fsdp import ShardedStrategy
from tests import MINI, REPO
from tests.cli import NO_AUGMENTATION
from tests.decoded import own_transcripts

SECONDS = 1.3  # every utterance is padded to this, so batches hold a fixed count
DETERMINISTIC = ["--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
                 "--model.encoder.dropout", "0", "--model.encoder.attention_dropout", "0",
                 "--model.spec_augment", "null", "--model.schedule.warmup_steps", "1", "--data.speed_perturb", "[1.0]",
                 *NO_AUGMENTATION,
                 "--data.shuffle", "false", "--data.num_workers", "0", "--trainer.precision", "32-true",
                 # SGD: the update is the gradient itself. Adam would turn the ~1e-10 rounding noise of
                 # gradients that are zero in exact arithmetic (attention key biases) into full-size steps.
                 "--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.05",
                 "--model.optimizer.fused", "false"]  # the default run's fused: true carries over; FSDP2 lacks fused SGD


def padded_corpus(root: Path, count: int, keep=lambda row: True) -> Path:
    """``count`` bundled utterances of 0.9-1.3 s (those that ``keep(manifest row)``), each zero-padded
    to exactly 1.3 s: a manifest path."""
    rows = []
    for line in (MINI / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        if 0.9 <= row["duration"] <= SECONDS and len(rows) < count and keep(row):
            audio, rate = soundfile.read(MINI / row["audio_filepath"], dtype="float32")
            path = root / Path(row["audio_filepath"]).name
            soundfile.write(path, np.pad(audio, (0, int(SECONDS * rate) - len(audio))), rate)
            rows.append({"audio_filepath": path.name, "duration": SECONDS, "text": row["text"]})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "train.jsonl"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return padded_corpus(tmp_path_factory.mktemp("equal"), 16)


def fit(out: Path, manifest: Path, *args: str) -> Path:
    """python -m asr.fit in a subprocess (DDP relaunches the command per rank); the run folder."""
    command = [sys.executable, "-m", "asr.fit", "--trainer.logger.init_args.save_dir", str(out),
               "--trainer.log_every_n_steps", "1", "--test", "false",  # the default progress bar stays on
               "--data.train_manifest", str(manifest), "--data.val_manifest", str(manifest), *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return next(out.glob("default/version_*"))


def step_losses(run: Path) -> list[float]:
    with open(run / "metrics.csv") as f:
        return [float(r["train/loss_step"]) for r in csv.DictReader(f) if r.get("train/loss_step")]


def load(checkpoint: Path) -> dict:
    """A checkpoint file, or the FSDP preset's folder as asr.convert merges it."""
    return merge(checkpoint) if checkpoint.is_dir() else torch.load(checkpoint, weights_only=True)


def steps(checkpoint: Path) -> int:
    """The optimizer steps a run took, as its checkpoint records them."""
    return load(checkpoint)["global_step"]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load(checkpoint)["state_dict"]


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory) -> Path:
    """One process, 4 utterances (5.2 s) per batch, 2 epochs = 8 steps."""
    return fit(tmp_path_factory.mktemp("single"), corpus, *DETERMINISTIC, "--trainer.max_epochs", "2",
               "--data.max_batch_seconds", str(4 * SECONDS), "--data.filter.max_duration", str(SECONDS))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one_process_with_the_same_global_batch(strategy, corpus, single, tmp_path):
    """Each rank takes 2 utterances a step, so the global batch is the single run's 4.

    Tolerance: both runs do the same fp32 arithmetic except that gradients are summed across
    ranks in another order (all-reduce / reduce-scatter), a ~1e-7 relative difference per
    step; over 8 Adam steps it stays far below 1e-4 while any real mismatch (another batch,
    a wrong loss scale) moves the losses by 1e-2 or more.
    """
    run = fit(tmp_path, corpus, "--config", f"configs/strategy/{strategy}.yaml", *DETERMINISTIC,
              "--trainer.max_epochs", "2", "--data.max_batch_seconds", str(2 * SECONDS),
              "--data.filter.max_duration", str(SECONDS))
    assert step_losses(run) == pytest.approx(step_losses(single), rel=1e-4)
    ours, theirs = weights(run / "checkpoints" / "last.ckpt"), weights(single / "checkpoints" / "last.ckpt")
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("ranks", [1, 2])
def test_gradient_accumulation_equals_one_batch_of_all_the_micro_batches(ranks, tmp_path):
    """2 micro-batches of 2 utterances, accumulated, make the same SGD steps as batches of 4; under FSDP2, 2 ranks
    of 1 utterance a micro-batch (reduce-scattering on the second only: asr.train.fsdp) as 2 ranks of 2.

    The utterances hold 2 to 4 tokens: a mean of the micro-batches' per-token losses (Lightning's own) would
    differ from the per-token loss of the whole batch. Tolerance: as above, only the summation order differs.
    """
    texts = [json.loads(line)["text"] for line in (MINI / "train.jsonl").read_text().splitlines()]
    tokenizer = Tokenizer.train(texts, "unigram", 64)  # as the default run: about a piece per word
    tokenizer.save(tmp_path / "tokens.model")
    counts = iter([4, 2, 3, 2, 4, 2, 3, 2])  # the tokens of each utterance taken, in the manifest's order
    wanted = [next(counts)]
    def keep(row):
        if len(tokenizer.encode(row["text"])) != wanted[-1]:
            return False
        wanted.append(next(counts, 0))
        return True
    manifest = padded_corpus(tmp_path, 8, keep=keep)
    assert len(manifest.read_text().splitlines()) == 8
    one = ["--trainer.max_epochs", "2", "--data.filter.max_duration", str(SECONDS), "--data.tokenizer.model",
           str(tmp_path / "tokens.model"), *DETERMINISTIC]
    sharded = ["--config", "configs/strategy/fsdp.yaml"] if ranks == 2 else []
    single = fit(tmp_path / "single", manifest, *sharded, *one, "--data.max_batch_seconds", str(4 / ranks * SECONDS))
    accumulated = fit(tmp_path / "accumulated", manifest, *sharded, *one, "--data.max_batch_seconds",
                      str(2 / ranks * SECONDS), "--trainer.accumulate_grad_batches", "2")
    checkpoints = [load(run / "checkpoints" / "last.ckpt") for run in (single, accumulated)]
    assert checkpoints[0]["global_step"] == checkpoints[1]["global_step"] == 4  # optimizer steps
    for name, value in checkpoints[0]["state_dict"].items():
        torch.testing.assert_close(checkpoints[1]["state_dict"][name], value, atol=1e-4, rtol=1e-4, msg=name)


def test_fsdp_bf16_checkpointing_clipping_trains_transcribes_and_resumes_under_ddp(corpus, tmp_path):
    levers = ["--trainer.precision", "bf16-mixed", "--model.checkpoint_every", "1", "--trainer.gradient_clip_val", "1.0",
              "--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
              "--data.num_workers", "0",
              "--model.schedule.warmup_steps", "1", "--data.max_batch_seconds", str(4 * SECONDS)]
    run = fit(tmp_path / "fsdp", corpus, "--config", "configs/strategy/fsdp.yaml", *levers, "--trainer.max_epochs", "4",
              "--trainer.strategy.init_args.save_distributed_checkpoint", "false")
    losses, last = step_losses(run), run / "checkpoints" / "last.ckpt"
    # every step logged: at least 2 a rank and epoch (8 utterances; the default run's speeds fit at most 4 in a batch)
    assert len(losses) == steps(last) >= 8 and sum(losses[-2:]) < 0.8 * sum(losses[:2])
    assert last.is_file()  # save_distributed_checkpoint false: one full file, gathered by rank 0
    files = [MINI / "audio" / "test" / "000000.flac"]
    assert Transcriber.from_checkpoint(last).transcribe(files) == own_transcripts(last, files)
    resumed = fit(tmp_path / "ddp", corpus, "--config", "configs/strategy/ddp.yaml", *levers,
                  "--trainer.max_epochs", "5", "--ckpt_path", str(last))
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 4


def test_the_fsdp_preset_writes_folders_that_transcribe_average_resume_and_convert(corpus, tmp_path):
    """Each rank writes its shard into a folder named like the file, in the background, renamed into place whole;
    asr.transcribe, asr.average and --ckpt_path last read the folder as a file; asr.convert makes one file that
    resumes in one process."""
    small = ["--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
             "--data.num_workers", "0"]
    fsdp = ["--config", "configs/strategy/fsdp.yaml", *small]
    run = fit(tmp_path / "fsdp", corpus, *fsdp, "--trainer.max_epochs", "1")
    checkpoints = sorted((run / "checkpoints").iterdir())
    assert [p.name for p in checkpoints][1:] == ["last.ckpt"] and checkpoints[0].name.startswith("epoch000-")
    assert all(p.is_dir() and steps(p) == steps(checkpoints[1]) for p in checkpoints)  # no .partial nor .old left
    folder = checkpoints[1]
    audio = MINI / "audio" / "test" / "000000.flac"
    transcribed = subprocess.run([sys.executable, "-m", "asr.transcribe", "--checkpoint", str(folder), str(audio)],
                                 cwd=REPO, capture_output=True, text=True, timeout=300)
    assert transcribed.returncode == 0 and transcribed.stdout.startswith(f"{audio}\t"), transcribed.stderr[-3000:]
    averaged = subprocess.run([sys.executable, "-m", "asr.average", str(tmp_path / "avg.ckpt"), *map(str, checkpoints)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    for name, value in weights(folder).items():  # two folders of the same step: their average is either
        torch.testing.assert_close(weights(tmp_path / "avg.ckpt")[name], value, msg=name)
    fit(tmp_path / "fsdp", corpus, *fsdp, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    resumed = run.parent / "version_1"
    with open(resumed / "metrics.csv") as f:  # it went on from the folder's step, not from 0
        assert min(int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss_step")) >= steps(folder)
    assert load(resumed / "checkpoints" / "last.ckpt")["epoch"] == 1
    merged = convert(folder, tmp_path / "merged.ckpt")
    assert torch.load(merged, weights_only=True)["optimizer_states"][0]["state"]  # AdamW moments came along
    one = main(["--trainer.logger.init_args.save_dir", str(tmp_path / "one"), "--test", "false",  # one process: this one
                "--data.train_manifest", str(corpus), "--data.val_manifest", str(corpus), *small,
                "--trainer.max_epochs", "2", "--ckpt_path", str(merged)])
    assert torch.load(Path(one.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 1


@pytest.mark.parametrize("config, strategy_type", [("ddp", DDPStrategy), ("fsdp", ShardedStrategy)])
def test_strategy_presets_build_the_intended_lightning_objects(config, strategy_type):
    cli = build(["--config", f"configs/strategy/{config}.yaml"])
    assert type(cli.trainer.strategy) is strategy_type
    assert cli.trainer.num_devices == 2


def test_fsdp_preset_writes_sharded_checkpoints_in_the_background():
    cli = build(["--config", "configs/strategy/fsdp.yaml"])
    assert cli.trainer.strategy._save_distributed_checkpoint is True and cli.trainer.strategy.async_save is True


class Trainer:  # the fields check_hardware reads from the parsed trainer config
    def __init__(self, precision="bf16-mixed", strategy="auto", accelerator="auto"):
        self.precision, self.strategy, self.accelerator = precision, strategy, accelerator


@pytest.mark.parametrize("trainer, cuda, message", [
    (Trainer(precision="16-mixed"), False, "trainer.precision=16-mixed needs a CUDA GPU"),
    (Trainer(precision="16-mixed", accelerator="cpu"), True, "trainer.precision=16-mixed needs a CUDA GPU"),
    (Trainer(strategy="deepspeed_stage_2"), True, "skip of non-finite updates and its gradient clipping would do nothing"),
    (Trainer(strategy="deepspeed"), True, "configs/strategy/fsdp.yaml (FSDP2) shards parameters"),
    (Trainer(strategy="fsdp"), False, "configs/strategy/fsdp.yaml (FSDP2"),
])
def test_impossible_combinations_are_refused_in_one_sentence(trainer, cuda, message):
    with pytest.raises(ConfigError, match=None) as error:
        check_hardware(trainer, cuda=cuda)
    assert message in str(error.value) and str(error.value).count("\n") == 0


@pytest.mark.parametrize("trainer, needs_a_gpu", [(Trainer(precision="16-mixed", accelerator="gpu"), True),
                                                  (Trainer(strategy="fsdp"), True),
                                                  (Trainer(precision="bf16-true", strategy="ddp"), False)])
def test_possible_combinations_pass_on_a_gpu_machine(trainer, needs_a_gpu):
    """Each passes on a machine with a GPU; those that need one are refused on a machine without: the check asks
    the machine, so one that refused nothing (or everything) fails here."""
    check_hardware(trainer, cuda=True)
    if needs_a_gpu:
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            check_hardware(trainer, cuda=False)
    else:
        check_hardware(trainer, cuda=False)


def test_cpu_machine_rejects_fp16_from_the_command_line_without_a_traceback():
    result = subprocess.run([sys.executable, "-m", "asr.fit", "--trainer.precision", "16-mixed"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("asr.fit: error: trainer.precision=16-mixed needs")


@pytest.mark.parametrize("precision", ["bf16-true", "32-true"])
def test_other_precisions_train_and_transcribe(precision, corpus, tmp_path):
    run = fit(tmp_path, corpus, "--trainer.precision", precision, "--model.encoder.d_model", "64",
              "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2", "--model.schedule.warmup_steps", "1",
              "--data.max_batch_seconds", str(4 * SECONDS),
              "--data.num_workers", "0", "--trainer.max_epochs", "3")
    losses = step_losses(run)
    # every step logged: at least 4 an epoch (16 utterances; the default run's speeds fit at most 4 in a batch)
    assert len(losses) == steps(run / "checkpoints" / "last.ckpt") >= 12 and sum(losses[-3:]) < 0.8 * sum(losses[:3])
    files = sorted((MINI / "audio" / "test").glob("*.flac"))[:4]
    last = run / "checkpoints" / "last.ckpt"
    assert Transcriber.from_checkpoint(last).transcribe(files) == own_transcripts(last, files)
