"""End to end on the bundled corpus: python -m asr.fit trains, its run folder is complete,
its checkpoint alone transcribes, and config mistakes are reported by name.

One short fit (tiny model, a slice of data/mini) is shared by the tests of this module.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jiwer
import pytest
import torch

from asr.bench.nonspeech import write_clips
from asr.configs import CONFIGS
from asr.inference.transcriber import Transcriber
from asr.train.fitting import main
from asr.train.module import ASRModule
from tests import MINI, REPO
from tests.cli import CHAR_FRAMES, one_line_refusal, refused
from tests.decoded import own_transcripts

# A small char model: it leaves the all-blank stage within a few hundred steps, so ten quick
# epochs are enough to transcribe something (the default unigram model needs more).
TINY = ["--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
        "--model.schedule.warmup_steps", "20", "--data.tokenizer.type", "char", *CHAR_FRAMES]
RUN = ["--trainer.max_epochs", "10", "--data.max_batch_seconds", "8", "--data.filter.max_duration", "8"]  # the shared run


def fit(tmp: Path, *args: str):
    """Run asr.fit into ``tmp`` quietly; returns the CLI object."""
    return main([
        "--trainer.logger.init_args.save_dir", str(tmp), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--data.num_workers", "0", *TINY, *args,
    ])


def slice_manifest(src: Path, dst: Path, n: int) -> Path:
    """The first n lines of a bundled manifest, with paths made absolute so it can live anywhere."""
    lines = src.read_text().splitlines()[:n]
    rows = [dict(json.loads(line), audio_filepath=str(src.parent / json.loads(line)["audio_filepath"])) for line in lines]
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 10-epoch fit on 160 training utterances of data/mini and one bad line (under 1%); the run folder."""
    tmp = tmp_path_factory.mktemp("fit")
    train = slice_manifest(MINI / "train.jsonl", tmp / "train.jsonl", 160)
    with open(train, "a") as f:  # line 161
        f.write(json.dumps({"audio_filepath": str(tmp / "gone.flac"), "duration": 1.0, "text": "call"}) + "\n")
    dev = slice_manifest(MINI / "dev.jsonl", tmp / "dev.jsonl", 20)
    cli = fit(tmp, *RUN, "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
              "--data.test_manifest", str(dev))
    return Path(cli.trainer.log_dir)


def epoch_losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]


def test_fit_leaves_a_complete_run_folder(run):
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run / "checkpoints").glob("epoch*.ckpt"))) == 5  # the 5 best by val/wer, of 10 epochs


def test_fit_lowers_the_training_loss(run):
    losses = epoch_losses(run)
    assert len(losses) == 10
    assert losses[-1] < 0.85 * losses[0]  # with the default run's augmentation on: 0.71, and 0.82 with its non-speech too


def test_checkpoint_carries_tokenizer_and_loads_without_pickled_code(run):
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert isinstance(checkpoint["tokenizer"], bytes)
    assert checkpoint["hyper_parameters"]["encoder"]["d_model"] == 64


def test_batched_and_one_at_a_time_transcription_agree_with_the_checkpoints_own_decoding(run):
    transcriber = Transcriber.from_checkpoint(run / "checkpoints" / "last.ckpt")
    files = sorted((MINI / "audio" / "test").glob("*.flac"))[:12]
    batched = transcriber.transcribe(files)
    alone = [transcriber.transcribe([f])[0] for f in files]
    assert batched == alone == own_transcripts(run / "checkpoints" / "last.ckpt", files)
    assert any(batched)  # ten epochs are enough to say something


def test_checkpoint_alone_transcribes_from_another_folder(run, tmp_path):
    """Only the .ckpt is copied out; the run folder and the repo's configs are not needed."""
    ckpt = tmp_path / "model.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", ckpt)
    audio = tmp_path / "one.flac"
    shutil.copy(MINI / "audio" / "test" / "000000.flac", audio)
    result = subprocess.run([sys.executable, "-m", "asr.transcribe", "--checkpoint", str(ckpt), str(audio)],
                            cwd=tmp_path, capture_output=True, text=True, check=True)
    path, _, text = result.stdout.removesuffix("\n").partition("\t")  # the text as decoded, spaces and all
    assert path == str(audio)
    assert text == own_transcripts(ckpt, [audio])[0] and text
    assert "real-time factor" in result.stderr


def test_the_trained_model_writes_no_words_on_non_speech(run, tmp_path):
    """Every kind of asr.data.nonspeech at 8 and 16 kHz (the default run trains on some of them), through the CLI
    and the Python API; and the model still writes words on speech."""
    clips = write_clips(tmp_path / "clips", per_kind=1, rates=(8000, 16000), seed=7, seconds=(1.0, 6.0))
    out = tmp_path / "out.jsonl"
    result = subprocess.run([sys.executable, "-m", "asr.transcribe", "--checkpoint", str(run / "checkpoints" / "last.ckpt"),
                             str(tmp_path / "clips"), "--output", str(out)], capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.returncode == 0 and len(rows) == len(clips)
    assert [(Path(r["audio_filepath"]).name, r["text"]) for r in rows if r["text"]] == []
    assert all(r["blank_share"] > 0.9 for r in rows), sorted(r["blank_share"] for r in rows)  # ten epochs: 0.917 and up
    transcriber = Transcriber.from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert transcriber.transcribe([path for path, *_ in clips]) == [""] * len(clips)
    assert transcriber.transcribe([MINI / "audio" / "test" / "000000.flac"])[0]


def test_a_model_trained_on_speech_alone_writes_words_on_non_speech(tmp_path):
    """The failure that the test above shows fixed: the same run without the feature variance floor and
    without non-speech in training puts words on non-speech."""
    train = slice_manifest(MINI / "train.jsonl", tmp_path / "train.jsonl", 160)
    dev = slice_manifest(MINI / "dev.jsonl", tmp_path / "dev.jsonl", 20)
    cli = fit(tmp_path, *RUN, "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
              "--model.features.var_floor", "0", "--data.augmentation.nonspeech_prob", "0",
              "--data.augmentation.pause_prob", "0", "--test", "false")  # the test set's scores are not asked for
    clips = write_clips(tmp_path / "clips", per_kind=1, rates=(8000, 16000), seed=7, seconds=(1.0, 6.0))
    texts = Transcriber.from_checkpoint(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt").transcribe(
        [path for path, *_ in clips])
    assert sum(bool(text) for text in texts) >= len(clips) // 2, texts


def test_transcribing_a_manifest_reports_wer_and_cer(run, tmp_path):
    manifest = slice_manifest(MINI / "test.jsonl", tmp_path / "test.jsonl", 10)
    out = tmp_path / "hyps.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "asr.transcribe", "--checkpoint", str(run / "checkpoints" / "last.ckpt"),
         str(manifest), "--output", str(out)], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 10 and all("reference" in r and "text" in r for r in rows)
    references, hypotheses = [r["reference"] for r in rows], [r["text"] for r in rows]
    assert hypotheses == own_transcripts(run / "checkpoints" / "last.ckpt", [r["audio_filepath"] for r in rows])
    scores = f"WER {jiwer.wer(references, hypotheses):.4f}  CER {jiwer.cer(references, hypotheses):.4f}  (10 references"
    assert scores in result.stdout, result.stdout


def test_resuming_from_last_checkpoint_continues_the_run(run, tmp_path, monkeypatch):
    """The resumed run starts from the checkpoint's step, weights and learning rate, and trains the one epoch
    more that --trainer.max_epochs asks (a run that ignored --ckpt_path would start at step 0 and train them all)."""
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    epochs, steps = checkpoint["epoch"] + 1, checkpoint["global_step"]
    at_start = {}
    on_train_start = ASRModule.on_train_start

    def record(module):  # the state training starts from, after Lightning restored the checkpoint
        on_train_start(module)
        at_start.update(step=module.trainer.global_step, lr=module.trainer.optimizers[0].param_groups[0]["lr"],
                        weights={name: value.clone() for name, value in module.state_dict().items()})

    monkeypatch.setattr(ASRModule, "on_train_start", record)
    cli = main(["--config", str(run / "config.yaml"), "--ckpt_path", str(last), "--trainer.max_epochs", str(epochs + 1),
                "--trainer.logger.init_args.save_dir", str(tmp_path), "--test", "false"])
    assert at_start["step"] == steps > 0 and steps % epochs == 0  # every epoch has the same number of batches
    assert at_start["lr"] == checkpoint["optimizer_states"][0]["param_groups"][0]["lr"]
    assert at_start["weights"].keys() == checkpoint["state_dict"].keys()
    for name, value in checkpoint["state_dict"].items():
        assert torch.equal(at_start["weights"][name], value), name
    assert cli.trainer.current_epoch == epochs + 1 and cli.trainer.global_step == steps + steps // epochs


def test_8khz_run_resamples_the_16khz_corpus_and_transcribes(tmp_path, info_messages):
    train = slice_manifest(MINI / "train.jsonl", tmp_path / "train.jsonl", 30)
    cli = fit(tmp_path, "--config", str(CONFIGS / "data" / "8khz.yaml"), "--trainer.max_epochs", "1",
              "--data.train_manifest", str(train), "--data.val_manifest", str(train), "--test", "false")
    assert cli.model.model.features.config.n_feats == 81
    assert any("30 of 30 files are resampled to 8000 Hz" in m for m in info_messages)
    last = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    transcriber = Transcriber.from_checkpoint(last)
    assert transcriber.sample_rate == 8000
    files = [MINI / "audio" / "test" / "000001.flac"]  # 16 kHz, resampled to the model's rate
    assert transcriber.transcribe(files) == own_transcripts(last, files)


def test_unknown_config_key_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model.d_modle", "64"])
    assert exit_info.value.code != 0
    assert "d_modle" in capsys.readouterr().err


def test_a_setting_a_constructor_refuses_is_one_line_naming_it_and_exit_status_1():
    """As a process: the one line is the last of stderr, no traceback, exit status 1 (tests/cli.py's ``refused``
    runs the same command in the test's process, as the other refusals below and in test_fit_errors.py do)."""
    result = subprocess.run([sys.executable, "-m", "asr.fit", "--data.augmentation.noise_prob", "2",
                             "--trainer.max_epochs", "0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == refused("--data.augmentation.noise_prob", "2") == (
        "asr.fit: error: data.augmentation.noise_prob must be a probability in [0, 1], got 2.0")


@pytest.mark.parametrize("args, message", [
    (["--model.encoder.block", "conformer", "--model.encoder.conv_kernel", "4"], "model.encoder.conv_kernel must be odd"),
    (["--data.filter.max_dropped_share", "3"], "data.filter.max_dropped_share must be between 0 and 1"),
])
def test_a_setting_a_constructor_refuses_is_one_line_naming_it(args, message):
    one_line_refusal(refused(*args, "--trainer.max_epochs", "0"), message)


@pytest.mark.parametrize("args, flag, path", [
    ([], "train", "data/mini/train.jsonl"),  # the default run, started outside the checkout
    (["--data.val_manifest", "dev.jsonl"], "val", "dev.jsonl"),
    (["--data.test_manifest", "test.jsonl"], "test", "test.jsonl"),  # named before training, not after it
])
def test_a_missing_manifest_is_one_line_naming_its_flag(tmp_path, monkeypatch, args, flag, path):
    bundled = [] if flag == "train" else [arg for split, name in (("train", "train"), ("val", "dev"), ("test", "test"))
                                          for arg in (f"--data.{split}_manifest", str(MINI / f"{name}.jsonl"))]
    monkeypatch.chdir(tmp_path)
    message = refused(*bundled, *args, "--trainer.logger.init_args.save_dir", str(tmp_path))
    where = f"relative paths start from the current folder, {tmp_path}"
    assert message == f"asr.fit: error: data.{flag}_manifest: manifest {path} does not exist ({where})"
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_bad_line_under_the_share_is_skipped_and_listed_in_the_run_folder(run, tmp_path):
    listed = (run / "bad_lines.txt").read_text().splitlines()
    assert len(listed) == 1 and listed[0].endswith("train.jsonl:161: missing audio file: " + str(run.parents[1] / "gone.flac"))


def test_bad_lines_over_the_share_stop_before_training_with_one_line(tmp_path):
    train = slice_manifest(MINI / "train.jsonl", tmp_path / "train.jsonl", 50)
    with open(train, "a") as f:
        f.write("{not json\n" + json.dumps({"audio_filepath": "gone.flac", "duration": 1.0, "text": "call"}) + "\n")
    message = refused("--data.train_manifest", str(train), "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"))
    assert message.startswith("asr.fit: error: " + str(train) + ": 2 of 52 lines are unusable (1 malformed json, "
                              "1 missing audio file), more than data.filter.max_dropped_share=0.01 allows:")
    assert f"{train}:51: malformed json" in message and not list(tmp_path.rglob("*.ckpt"))


def test_print_config_shows_the_linked_resolved_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--print_config", "--model.encoder.d_model", "96"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "d_model: 96" in printed and "train_manifest: data/mini/train.jsonl" in printed


def test_resuming_from_an_averaged_checkpoint_is_refused_by_name(run, tmp_path):
    from asr.tools.averaging import average, save
    from asr.train.fitting import ConfigError

    last = run / "checkpoints" / "last.ckpt"
    averaged = tmp_path / "averaged.ckpt"
    save(average([last, last]), averaged)
    with pytest.raises(ConfigError, match="weights only .*asr.average"):
        main(["--config", str(run / "config.yaml"), "--ckpt_path", str(averaged),
              "--trainer.logger.init_args.save_dir", str(tmp_path), "--test", "false"])


@pytest.mark.parametrize("choice, scored", [("best", "best"), ("last", None)])
def test_test_checkpoint_chooses_the_weights_the_test_scores(tmp_path, monkeypatch, choice, scored):
    """--test_checkpoint last scores the weights training ended with (ckpt_path None), not the best by val/wer."""
    import pytorch_lightning as pl

    asked = []
    monkeypatch.setattr(pl.Trainer, "test", lambda self, *a, **kw: asked.append(kw["ckpt_path"]))
    train = slice_manifest(MINI / "train.jsonl", tmp_path / "train.jsonl", 8)
    fit(tmp_path, "--trainer.max_epochs", "1", "--data.train_manifest", str(train), "--data.val_manifest", str(train),
        "--data.test_manifest", str(train), "--test_checkpoint", choice)
    assert asked == [scored]
