import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch

from asr.data.augment import Augmentation
from asr.data.batch import Batch
from asr.data.datamodule import ASRDataModule
from asr.data.manifest import FilterConfig, ManifestError
from asr.data.sampler import split_item
from asr.tokenizer import TokenizerConfig
from tests.cli import CHAR_FRAMES
from tests.conftest import PLAIN_DATA


# ASRDataModule


def datamodule(corpus, **kwargs) -> ASRDataModule:
    """An ASRDataModule of ``corpus`` with PLAIN_DATA and ``kwargs``; FilterConfig's fields among them go to
    data.filter (max_duration 3.0 unless given)."""
    rule = {name: kwargs.pop(name) for name in list(kwargs) if name in FilterConfig.__dataclass_fields__}
    settings = {**PLAIN_DATA, "train_manifest": str(corpus.train), "val_manifest": str(corpus.dev),
                "test_manifest": None, "num_workers": 0, "max_batch_seconds": 3.0,
                "filter": FilterConfig(**{"max_duration": 3.0, **rule}), **kwargs}
    return ASRDataModule(**settings)


def test_setup_fit_builds_train_and_validation_sets(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    assert sorted(dm.datasets) == ["train", "val"]
    assert [u.text for u in dm.datasets["train"].utterances] == [r["text"] for r in corpus.train_rows]
    assert len(dm.datasets["val"]) == len(corpus.dev_rows)


def test_a_training_epoch_is_batches_with_consistent_lengths(corpus):
    dm = datamodule(corpus)
    dm.setup("fit")
    texts = []
    for batch in dm.train_dataloader():
        assert isinstance(batch, Batch)
        assert batch.audio.dtype == torch.float32 and batch.audio.ndim == 2
        assert len(batch.texts) == batch.audio.shape[0] == batch.tokens.shape[0] == len(batch.audio_lengths)
        assert batch.audio.shape[1] == batch.audio_lengths.max() and batch.tokens.shape[1] == batch.token_lengths.max()
        for i, text in enumerate(batch.texts):
            assert batch.tokens[i, : batch.token_lengths[i]].tolist() == dm.tokenizer.encode(text)
            assert batch.audio[i, batch.audio_lengths[i] :].abs().sum() == 0
        texts += batch.texts
    assert sorted(texts) == sorted(r["text"] for r in corpus.train_rows)


def test_audio_is_mono_at_the_files_lengths_and_stereo_is_said_once(corpus, info_messages):
    dm = datamodule(corpus)
    dm.setup("fit")
    dataset = dm.datasets["train"]
    batch = dataset[list(range(len(dataset)))]
    assert batch.audio_lengths.tolist() == [soundfile.info(u.audio_filepath).frames for u in dataset.utterances]
    stereo_notes = [m for m in info_messages if "mono" in m]
    assert len(stereo_notes) == 1 and "1 of 5" in stereo_notes[0]


def test_8khz_datamodule_resamples_16khz_files_to_half_the_length(corpus, info_messages):
    dm = datamodule(corpus, sample_rate=8000)
    dm.setup("fit")
    dataset = dm.datasets["train"]
    batch = dataset[list(range(len(dataset)))]
    assert batch.audio_lengths.tolist() == [soundfile.info(u.audio_filepath).frames // 2 for u in dataset.utterances]
    assert any("5 of 5 files are resampled to 8000 Hz" in m for m in info_messages)


def test_16khz_datamodule_resamples_an_8khz_file_to_twice_the_length(corpus, info_messages):
    corpus.write(train_extra=[corpus.row("audio/eight_khz.flac", "call nine")])
    dm = datamodule(corpus)
    dm.setup("fit")
    assert dm.datasets["train"].load(5).shape == (16000,)
    assert any("1 of 6 files are resampled to 16000 Hz" in m for m in info_messages)


@pytest.mark.parametrize("world_size", [2, 3])
def test_validation_gives_every_rank_the_same_number_of_batches(corpus, world_size):
    # Under FSDP every forward is a collective: a rank with an extra batch waits forever for the others.
    dm = datamodule(corpus)
    dm.setup("fit")
    per_rank = []
    for rank in range(world_size):
        dm.trainer = SimpleNamespace(world_size=world_size, global_rank=rank, num_devices=world_size,
                                     strategy=SimpleNamespace(root_device=torch.device("cpu")))
        per_rank.append(list(dm.val_dataloader()))
    assert len({len(batches) for batches in per_rank}) == 1
    texts = {text for batches in per_rank for batch in batches for text in batch.texts}
    assert sorted(texts) == sorted(r["text"] for r in corpus.dev_rows)


def test_given_tokenizer_model_is_used_instead_of_training_one(corpus, char_tokenizer, tmp_path):
    char_tokenizer.save(tmp_path / "given.model")
    dm = datamodule(corpus, tokenizer=TokenizerConfig(model=str(tmp_path / "given.model")))
    assert dm.tokenizer.serialized == char_tokenizer.serialized


def test_an_utterance_longer_than_a_batch_is_a_bad_line_naming_both_flags(corpus):
    _, line, _ = BAD_LINES["duration out of bounds"]
    corpus.write(train_extra=[line])
    dm = datamodule(corpus, max_duration=30.0, max_batch_seconds=2.0)
    with pytest.raises(ManifestError, match=r"data\.filter\.max_duration, data\.max_batch_seconds"):
        dm.setup("fit")


# Each bad line: (manifest it goes in, the line, DataModule settings that make it bad)
BAD_LINES = {
    "missing audio file": ("train", {"audio_filepath": "audio/nowhere.flac", "duration": 1.0, "text": "call"}, {}),
    "malformed json": ("train", '{"audio_filepath": "audio/a.flac", "duration": 1.0', {}),
    "empty text": ("train", {"audio_filepath": "audio/a.flac", "duration": 1.0, "text": " "}, {}),
    "unreadable audio": ("train", {"audio_filepath": "audio/broken.flac", "duration": 1.0, "text": "call"}, {}),
    "untokenisable text": ("dev", {"audio_filepath": "audio/a.flac", "duration": 1.0, "text": "xyz"}, {}),
    "too short for its transcript": (
        "train", {"audio_filepath": "audio/short.flac", "duration": 0.3, "text": "call five two nine four"}, {}),
    "wrong sample rate": (
        "train", {"audio_filepath": "audio/eight_khz.flac", "duration": 1.0, "text": "call"}, {"resample": "error"}),
    "duration out of bounds": (
        "train", {"audio_filepath": "audio/long.flac", "duration": 3.0, "text": "call"}, {"max_duration": 2.0}),
    "truncated audio": ("train", {"audio_filepath": "audio/cut.wav", "duration": 1.0, "text": "call"}, {}),
    "audio shorter than its line": ("dev", {"audio_filepath": "audio/short.flac", "duration": 1.0, "text": "call"}, {}),
}



def add_bad_line(corpus, kind: str) -> tuple[str, dict]:
    """Append the bad line of ``kind`` to its manifest; returns its "FILE:LINE" and the DataModule settings."""
    split, line, settings = BAD_LINES[kind]
    wav = corpus.root / "audio" / "cut.wav"  # a 16-bit WAV whose header promises 1 s, cut to its first 60 bytes
    soundfile.write(wav, np.full(16000, 0.1, np.float32), 16000, subtype="PCM_16")
    wav.write_bytes(wav.read_bytes()[:60])
    if split == "train":
        corpus.write(train_extra=[line])
        return f"{corpus.train}:{len(corpus.train_rows) + 1}", settings
    corpus.write(dev_extra=[line])
    return f"{corpus.dev}:{len(corpus.dev_rows) + 1}", settings


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_bad_line_stops_setup_naming_file_and_line(corpus, kind):
    source, settings = add_bad_line(corpus, kind)
    dm = datamodule(corpus, **settings)
    with pytest.raises(ManifestError, match=re.escape(f"{source}: {kind}")):
        dm.setup("fit")


@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_bad_line_is_dropped_and_the_rest_kept_under_the_share(corpus, kind):
    add_bad_line(corpus, kind)
    _, _, settings = BAD_LINES[kind]
    dm = datamodule(corpus, max_dropped_share=0.5, **settings)
    with pytest.warns(UserWarning, match=f"skipped 1 of .*1 {kind}"):
        dm.setup("fit")
    assert [u.text for u in dm.datasets["train"].utterances] == [r["text"] for r in corpus.train_rows]
    assert [u.text for u in dm.datasets["val"].utterances] == [r["text"] for r in corpus.dev_rows]


def test_all_bad_lines_are_listed_together_in_line_order(corpus):
    bad = [BAD_LINES[kind][1] for kind in ("too short for its transcript", "missing audio file", "empty text")]
    corpus.write(train_extra=bad)
    n = len(corpus.train_rows)
    with pytest.raises(ManifestError, match="3 of 8 lines") as err:
        datamodule(corpus).setup("fit")
    listed = re.findall(re.escape(str(corpus.train)) + r":(\d+)", str(err.value))
    assert listed == [str(n + 1), str(n + 2), str(n + 3)]


def counting_reads(monkeypatch) -> list[str]:
    """The names of the audio files the data sources read from now on (asr.data.sources)."""
    import asr.data.sources

    reads, read = [], asr.data.sources.load_audio
    monkeypatch.setattr(asr.data.sources, "load_audio",
                        lambda path, *args: reads.append(Path(path).name) or read(path, *args))
    return reads


def test_audio_kept_in_the_cache_is_read_once_and_what_is_over_its_size_is_read_every_time(corpus, monkeypatch):
    kept_bytes = (16000 + 19200) * 4  # a.flac (1.0 s) and b.flac (1.2 s) at 16 kHz, float32; c.flac (0.9 s) is over
    dm = datamodule(corpus, cache_audio_mb=kept_bytes / 1e6)
    dm.setup("fit")
    reads = counting_reads(monkeypatch)
    first = dm.datasets["train"][[0, 1, 2]]
    (corpus.root / "audio" / "a.flac").unlink()  # kept: no longer read, so not lost either
    again = dm.datasets["train"][[0, 1, 2]]
    assert reads == ["a.flac", "b.flac", "c.flac", "c.flac"]
    assert torch.equal(first.audio, again.audio) and again.dropped == ()
    assert dm.datasets["train"].cache.used == kept_bytes


def test_the_default_run_keeps_each_utterance_once_per_speed(corpus, monkeypatch):
    from asr.train.fitting import build

    cli = build(["--data.train_manifest", str(corpus.train), "--data.val_manifest", str(corpus.dev),
                 "--data.test_manifest", "null", "--data.tokenizer.type", "char", *CHAR_FRAMES,
                 "--data.augmentation.pause_prob", "0"])  # the one effect that lengthens an item: pauses around it
    cli.datamodule.setup("fit")
    dataset = cli.datamodule.datasets["train"]
    reads = counting_reads(monkeypatch)
    n = len(dataset)
    items = [speed * n for speed in range(3)] * 10  # utterance 0 at each speed, ten times
    lengths = [len(dataset.load(item)) for item in items]  # the other effects keep the length; the speed sets it
    assert dataset.speed_perturb == (0.9, 1.0, 1.1) and lengths[0] > lengths[1] > lengths[2] and lengths == lengths[:3] * 10
    counts = Counter(reads)  # babble noise reads other utterances, at speed 1 only
    assert counts.pop("a.flac") == 3 and set(counts.values()) <= {1}
    sampler = cli.datamodule.train_dataloader().sampler  # the loader's sampler draws from the dataset's speeds
    assert sampler.speeds == dataset.speed_perturb and len(sampler.item_seconds) == 3 * n


def test_augmentation_never_changes_the_kept_waveform(corpus):
    every_effect = {f"{effect}_prob": 1.0 for effect in ("pitch", "tempo", "noise", "reverb", "gain", "telephone")}
    dm = datamodule(corpus, cache_audio_mb=1, augmentation=Augmentation.off(**every_effect))
    dm.setup("fit")
    dataset = dm.datasets["train"]
    first = dataset.load(0)
    for _ in range(3):
        assert not torch.equal(dataset.load(0), first)  # augmented anew each time
    assert torch.equal(dataset.cache.waves[(0, 1.0)], dataset.read(0))


def test_a_negative_cache_size_is_refused_naming_the_flag(corpus):
    with pytest.raises(ValueError, match="data.cache_audio_mb must be >= 0"):
        datamodule(corpus, cache_audio_mb=-1)


# Validation while fitting


def fit_quietly(tmp_path, train, dev, *args: str):
    """python -m asr.fit with a tiny char model on the given manifests; returns the run folder."""
    from asr.train.fitting import main

    cli = main(["--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.enable_model_summary", "false",
                "--model.encoder.d_model", "32", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
                "--data.tokenizer.type", "char", *CHAR_FRAMES,
                "--data.train_manifest", str(train), "--data.val_manifest", str(dev), "--data.test_manifest", "null",
                "--data.num_workers", "0", *args])
    return cli.trainer.log_dir


def validated_epochs(run_dir) -> list[int]:
    import csv

    with open(f"{run_dir}/metrics.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f) if row.get("val/wer")]


def test_validation_runs_after_every_epoch_when_jittered_cuts_vary(corpus, write_audio, tmp_path, capsys):
    # 64 clips whose jittered greedy cuts into 6 s batches gave 12 batches in epoch 0, then 11:
    # Lightning's val_check_batch (12) was never reached again and epochs 1 and 2 had no validation.
    rng = random.Random(25)
    rows = []
    for i in range(64):
        seconds = round(rng.uniform(0.4, 1.5), 2)
        write_audio(f"clip{i}.flac", seconds, seed=i)
        rows.append(corpus.row(f"audio/clip{i}.flac", ["two", "nine", "four", "five"][i % 4], seconds))
    train, dev = corpus.manifest("clips.jsonl", rows), corpus.manifest("clips_dev.jsonl", rows[:4])
    run_dir = fit_quietly(tmp_path, train, dev, "--trainer.max_epochs", "3", "--data.max_batch_seconds", "6",
                          "--data.filter.max_duration", "6")
    assert validated_epochs(run_dir) == [0, 1, 2]
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"epoch \d+: train/loss", line)]
    assert len(lines) == 3 and all("val/wer" in line for line in lines)


def test_an_epoch_without_validation_says_so_instead_of_repeating_older_figures(corpus, tmp_path, capsys):
    run_dir = fit_quietly(tmp_path, corpus.train, corpus.dev, "--trainer.max_epochs", "3",
                          "--trainer.check_val_every_n_epoch", "2", "--data.max_batch_seconds", "3")
    assert validated_epochs(run_dir) == [1]
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"epoch \d+: train/loss", line)]
    assert ["val/wer" in line for line in lines] == [False, True, False]
    assert all("no validation in this epoch" in line for line in (lines[0], lines[2]))


def due_trainer(**overrides) -> SimpleNamespace:
    """The trainer fields warn_if_validation_was_due reads: epoch 2 ended after 11 batches of an announced 12."""
    fields = {"enable_validation": True, "check_val_every_n_epoch": 1, "current_epoch": 2, "should_stop": False,
              "max_steps": -1, "global_step": 35, "val_check_batch": 12, "num_training_batches": 12,
              "fit_loop": SimpleNamespace(epoch_loop=SimpleNamespace(batch_idx=10))}
    return SimpleNamespace(**{**fields, **overrides})


def test_a_validation_due_that_did_not_run_is_a_warning_naming_the_batch_counts():
    from asr.train.module import warn_if_validation_was_due

    with pytest.warns(UserWarning, match=r"due after epoch 2 but did not run.*batch 12 .*announced 12.*after 11"):
        warn_if_validation_was_due(due_trainer())


@pytest.mark.parametrize("overrides", [{"check_val_every_n_epoch": 2}, {"check_val_every_n_epoch": None},
                                       {"should_stop": True}, {"max_steps": 35}, {"enable_validation": False}])
def test_no_warning_when_validation_was_not_due(overrides, recwarn):
    from asr.train.module import warn_if_validation_was_due

    warn_if_validation_was_due(due_trainer(**overrides))
    assert not [w for w in recwarn if "validation was due" in str(w.message)]



def test_strict_mode_stops_at_one_bad_line_in_a_thousand(corpus):
    source, _ = add_bad_line(corpus, "missing audio file")
    with pytest.raises(ManifestError, match=re.escape(f"{source}: missing audio file")):
        datamodule(corpus, on_bad_line="error", max_dropped_share=0.5).setup("fit")


def test_an_utterance_too_fast_only_at_the_fastest_speed_is_kept_at_the_others(corpus):
    # 0.3 s: 6 encoder frames (4x subsampling) for "nine"'s 5 CTC steps at speeds 0.9 and 1.0, 4 at 1.5
    corpus.write(train_extra=[corpus.row("audio/short.flac", "nine", 0.3)])
    dm = datamodule(corpus, speed_perturb=[0.9, 1.0, 1.5])
    dm.setup("fit")
    train = dm.datasets["train"]
    assert len(train) == 6 and train.fastest[5] == 1 and 2 in train.fastest  # index into the speeds: 1.0; 1.5
    sampler = dm.train_dataloader().batch_sampler or dm.train_dataloader().sampler
    played = Counter()
    for epoch in range(30):
        sampler.set_epoch(epoch)
        played.update(split_item(item, len(train)) for batch in sampler for item in batch)
    speeds_of_short = {speed for (speed, i) in played if i == 5}
    played_fastest = [i for (speed, i) in played if speed == 2]
    assert speeds_of_short == {0, 1} and played_fastest and all(train.fastest[i] == 2 for i in played_fastest)
    with pytest.raises(ManifestError, match=r"train.jsonl:6: too short for its transcript: .* at speed 1.5"):
        datamodule(corpus, speed_perturb=[1.5]).setup("fit")
