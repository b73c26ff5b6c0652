"""asr.data.faults: audio that breaks after start-up is dropped, named once and counted, and a
share above data.filter.max_dropped_share stops the run, on every rank together under DDP."""

import subprocess
import sys

import numpy as np
import pytest
import pytorch_lightning as pl
import soundfile
import torch

from asr.data.dataset import random_voice
from asr.data.faults import DataFaultError, DataFaults
from tests import REPO
from tests.cli import CHAR_FRAMES
from tests.data.test_datamodule import datamodule, validated_epochs


BREAK = {
    "deleted": lambda path: path.unlink(),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:40]),
    # a WAV whose header says what it holds, half of what start-up found: "holds 0.500 s, 1.000 s expected ... cut short"
    "cut short": lambda path: soundfile.write(path, np.full(8000, 0.1, np.float32), 16000, format="WAV"),
}


@pytest.mark.parametrize("how", BREAK)
def test_an_utterance_whose_audio_broke_after_setup_is_dropped_from_its_batch_and_named(corpus, how):
    dm = datamodule(corpus)
    dm.setup("fit")
    BREAK[how](corpus.root / "audio" / "a.flac")
    batch = dm.datasets["train"][[0, 1, 2]]
    assert batch.texts == [r["text"] for r in corpus.train_rows[1:3]] and batch.audio.shape[0] == 2
    assert len(batch.dropped) == 1 and batch.dropped[0].startswith(f"{corpus.train}:1: ")
    assert "a.flac" in batch.dropped[0]
    if how == "cut short":
        assert "holds 0.500 s, 1.000 s expected (its line, or its header at start-up): cut short" in batch.dropped[0]


def test_a_batch_whose_every_utterance_broke_holds_the_next_readable_one_so_every_rank_still_steps(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    for name in ("b.flac", "c.flac"):
        (corpus.root / "audio" / name).unlink()
    batch = dm.datasets["train"][[1, 2]]
    assert batch.texts == [corpus.train_rows[3]["text"]] and len(batch.dropped) == 2


def test_audio_with_nan_samples_is_dropped_and_named_like_an_unreadable_file(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    nan = np.full(16000, np.nan, np.float32)  # a corrupt float WAV where a.flac was
    soundfile.write(corpus.root / "audio" / "a.flac", nan, 16000, format="WAV", subtype="FLOAT")
    batch = dm.datasets["train"][[0, 1]]
    assert batch.texts == [corpus.train_rows[1]["text"]]
    assert len(batch.dropped) == 1 and "NaN or infinite" in batch.dropped[0]
    assert batch.dropped[0].startswith(f"{corpus.train}:1: ")


def test_a_babble_source_that_no_longer_loads_is_passed_over_not_the_utterance_being_augmented(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    dataset = dm.datasets["train"]
    (corpus.root / "audio" / "a.flac").unlink()  # utterance 0
    for seed in range(20):  # some of these draws pick utterance 0
        voice = random_voice(dataset, torch.Generator().manual_seed(seed))
        assert voice.numel() > 0


def broken_epochs(dm, epochs: int) -> list[str]:
    """Iterate ``epochs`` training epochs; returns the texts seen."""
    loader, texts = dm.train_dataloader(), []
    for number in range(epochs):
        loader.sampler.set_epoch(number)
        texts += [text for batch in loader for text in batch.texts]
    return texts


def test_a_training_file_deleted_after_setup_is_named_once_and_counted_in_a_worker_process(corpus, recwarn):
    dm = datamodule(corpus, num_workers=1, max_dropped_share=0.5)
    dm.setup("fit")
    (corpus.root / "audio" / "a.flac").unlink()
    texts = broken_epochs(dm, 2)
    assert sorted(texts) == sorted(2 * [r["text"] for r in corpus.train_rows[1:]])
    named = [str(w.message) for w in recwarn if "no longer loads" in str(w.message)]
    assert len(named) == 1 and f"{corpus.train}:1: " in named[0] and "1 of 5 in this pass" in named[0]
    assert len(dm.faults["train"].in_pass) == 1 and dm.faults["train"].lost == 1  # counted again in the second pass


def test_a_share_of_broken_files_above_the_default_stops_with_the_list(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    for name in ("a.flac", "d.flac"):
        (corpus.root / "audio" / name).unlink()
    with pytest.raises(DataFaultError, match=r"failed to load in this pass.*max_dropped_share=0\.01") as err:
        broken_epochs(dm, 1)
    assert "a.flac" in str(err.value) or "d.flac" in str(err.value)


def test_a_source_that_several_ranks_meet_counts_once_as_the_most_it_stood_for(monkeypatch):
    """A stream's shard is read by rank 0 in one pass and by rank 1 in another (issue 61: one truncated shard of 20
    stopped a run saying "22 of 60", listed twice). Rank 1's failures are given; the ranks gather them only when
    their sum passes the share."""
    shard = "/s/recording.000001.tar"
    theirs = {shard: (f"{shard}: shard unreadable after 3 tries, its last 12 utterances skipped", 12)}
    gathers = []
    monkeypatch.setattr(DataFaults, "distributed", lambda faults: True)
    monkeypatch.setattr(DataFaults, "summed_over_ranks",
                        lambda faults, counts: [counts[0] + 12, counts[1]])
    monkeypatch.setattr(DataFaults, "gathered_from_ranks", lambda faults, items: gathers.append(1) or [*items, theirs])
    faults = DataFaults("train", 60, max_share=0.3, trainer=type("Trainer", (), {"global_rank": 0, "world_size": 2})())
    faults.record((f"{shard}: shard unreadable after 3 tries, its last 10 utterances skipped",), (10,), agree=True)
    faults.record((), agree=True)  # 10 + 12 summed is above 18, but it is one shard: 12, and gathered once
    assert len(gathers) == 1
    with pytest.raises(DataFaultError) as stopped:
        faults.record(("/s/recording.000002.tar: shard unreadable after 3 tries, its last 20 utterances skipped",),
                      (20,), agree=True)
    message = str(stopped.value)
    assert message.startswith("32 of 60 train utterances failed to load in this pass") and message.count(shard) == 1
    assert f"{shard}: shard unreadable after 3 tries, its last 12 utterances skipped" in message


class DeleteAfterFirstEpoch(pl.Callback):
    def __init__(self, path):
        self.path = path

    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch == 0:
            self.path.unlink()


def test_a_fit_whose_training_file_is_deleted_after_the_first_epoch_finishes_naming_it_once(corpus, tmp_path):
    from asr.train.fitting import build

    cli = build(["--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.max_epochs", "3",
                 "--model.encoder.d_model", "32", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
                 "--data.tokenizer.type", "char", *CHAR_FRAMES, "--data.train_manifest", str(corpus.train),
                 "--data.val_manifest", str(corpus.dev), "--data.test_manifest", "null",
                 "--data.max_batch_seconds", "3", "--data.filter.max_dropped_share", "0.5",
                 "--data.cache_audio_mb", "0"])  # read every epoch (kept audio is never lost: tests/data/test_datamodule.py)
    cli.trainer.callbacks.append(DeleteAfterFirstEpoch(corpus.root / "audio" / "b.flac"))
    with pytest.warns(UserWarning, match="no longer loads") as caught:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    named = [str(w.message) for w in caught if "no longer loads" in str(w.message)]
    assert len(named) == 1 and f"{corpus.train}:2: " in named[0] and "b.flac" in named[0]
    assert cli.trainer.current_epoch == 3 and validated_epochs(cli.trainer.log_dir) == [0, 1, 2]
    assert len(cli.datamodule.faults["train"].in_pass) == 1  # the last epoch's count


def ddp_fit(corpus, tmp_path, *args: str) -> subprocess.CompletedProcess:
    """python -m asr.fit on 2 CPU processes (gloo), one utterance per batch in sorted order; the training
    manifest has one more line, audio/cut.flac, which rank 1 loads: its header and its last frame pass
    setup's check, its middle is garbage."""
    data = (corpus.root / "audio" / "a.flac").read_bytes()
    middle = len(data) // 2
    (corpus.root / "audio" / "cut.flac").write_bytes(data[:middle] + b"\xff" * 2000 + data[middle + 2000:])
    corpus.write(train_extra=[corpus.row("audio/cut.flac", "call")])
    command = [sys.executable, "-m", "asr.fit", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
               "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_epochs", "2",
               "--test", "false",
               "--model.encoder.d_model", "32", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
               "--data.tokenizer.type", "char", *CHAR_FRAMES, "--data.num_workers", "0", "--data.max_batch_seconds", "1.3",
               "--data.filter.max_duration", "1.3", "--data.shuffle", "false", "--data.train_manifest", str(corpus.train),
               "--data.val_manifest", str(corpus.dev), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ddp_a_rank_whose_batch_lost_its_only_utterance_still_steps_and_the_run_finishes(corpus, tmp_path):
    result = ddp_fit(corpus, tmp_path, "--data.filter.max_dropped_share", "0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{corpus.train}:6: " in result.stderr and "cut.flac" in result.stderr
    run = next((tmp_path / "runs").glob("default/version_*"))
    assert validated_epochs(run) == [0, 1]


def test_ddp_every_rank_stops_together_listing_the_broken_file_above_the_default_share(corpus, tmp_path):
    result = ddp_fit(corpus, tmp_path)  # a hang here would end in subprocess.TimeoutExpired
    assert result.returncode != 0
    assert "Traceback" not in result.stderr  # rank 0 stops on rank 1's count, not on a broken collective
    assert "asr.fit: error: 1 of 6 train utterances failed to load in this pass" in result.stderr
    assert "cut.flac" in result.stderr.split("asr.fit: error:")[1]
