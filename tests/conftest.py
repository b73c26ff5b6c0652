"""Shared fixtures: synthetic audio on disk, a tiny manifest corpus, a char tokenizer, tiny models,
tone audio for ToneModel (tests/tones.py) and a tiny checkpoint.

Everything is generated into ``tmp_path`` (no bundled data, no downloads) and sized so the
whole unit suite runs in well under a minute on a 2-core CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

# Measurements asr caches (CPU peaks, precision step times) go to a folder of this test session, not the user's
# ~/.cache/asr: before asr is imported, which reads it once; the processes tests start inherit it.
if "ASR_CACHE_DIR" not in os.environ:  # made once (xdist workers and subprocesses inherit it), removed at its exit
    os.environ["ASR_CACHE_DIR"] = tempfile.mkdtemp(prefix="asr-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ASR_CACHE_DIR"], ignore_errors=True)

from asr.data.augment import Augmentation
from asr.hardware import usable_cores
from asr.models.config import EncoderConfig
from asr.models.ctc import CTCModel
from asr.models.features import FeatureConfig
from asr.tokenizer import Tokenizer, TokenizerConfig
from tests.tones import RATE, tones

TEXTS = ["call five two nine", "spell c a t", "nine four", "two five", "call nine", "four two one"]


def sine(seconds: float, rate: int, channels: int = 1, freq: float = 220.0, seed: int = 0) -> np.ndarray:
    """(n,) or (n, channels) float32: a sine plus a little noise, different per channel."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    columns = [0.5 * np.sin(2 * np.pi * freq * (c + 1) * t) + 0.05 * rng.standard_normal(t.size)
               for c in range(channels)]
    data = np.stack(columns, axis=1).astype(np.float32)
    return data[:, 0] if channels == 1 else data


@pytest.fixture
def write_audio(tmp_path):
    """write_audio(name, seconds, rate=16000, channels=1) -> path of a FLAC file under tmp_path/audio."""

    def write(name: str, seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0) -> Path:
        path = tmp_path / "audio" / name
        path.parent.mkdir(exist_ok=True)
        soundfile.write(path, sine(seconds, rate, channels, seed=seed), rate)
        return path

    return write


def row(audio: str, text: str, duration: float = 1.0, **extra) -> dict:
    """One manifest line as a dict."""
    return {"audio_filepath": audio, "duration": duration, "text": text, **extra}


@dataclass
class Corpus:
    """A tiny corpus under ``root``: audio/*.flac, train.jsonl and dev.jsonl with relative paths."""

    root: Path
    train_rows: list[dict] = field(default_factory=list)
    dev_rows: list[dict] = field(default_factory=list)

    @property
    def train(self) -> Path:
        return self.root / "train.jsonl"

    @property
    def dev(self) -> Path:
        return self.root / "dev.jsonl"

    row = staticmethod(row)

    def manifest(self, name: str, lines: list[dict | str]) -> Path:
        """Write ``root/name``: one JSON line per dict; strings as they are (to make malformed lines)."""
        path = self.root / name
        path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
        return path

    def write(self, train_extra: tuple = (), dev_extra: tuple = ()) -> "Corpus":
        """(Re)write train.jsonl and dev.jsonl, each followed by extra lines; returns self."""
        self.manifest("train.jsonl", [*self.train_rows, *train_extra])
        self.manifest("dev.jsonl", [*self.dev_rows, *dev_extra])
        return self


@pytest.fixture
def corpus(tmp_path, write_audio) -> Corpus:
    """Train: four 16 kHz mono files and one 16 kHz stereo file; dev: two 16 kHz files.

    Also on disk but in no manifest: an 8 kHz file (eight_khz.flac), a 0.3 s file (short.flac),
    a 3 s file (long.flac) and garbage bytes (broken.flac), for tests that add lines of their own.
    """
    train = [("a.flac", 1.0, 1), ("b.flac", 1.2, 1), ("c.flac", 0.9, 1), ("d.flac", 1.1, 1), ("stereo.flac", 1.0, 2)]
    for seed, (name, seconds, channels) in enumerate(train):
        write_audio(name, seconds, channels=channels, seed=seed)
    for seed, name in enumerate(["dev1.flac", "dev2.flac"]):
        write_audio(name, 1.0, seed=10 + seed)
    write_audio("eight_khz.flac", 1.0, rate=8000)
    write_audio("short.flac", 0.3)
    write_audio("long.flac", 3.0)
    (tmp_path / "audio" / "broken.flac").write_bytes(b"not audio" * 100)
    return Corpus(
        tmp_path,
        train_rows=[row(f"audio/{name}", text, seconds) for (name, seconds, _), text in zip(train, TEXTS)],
        dev_rows=[row("audio/dev1.flac", "four two one"), row("audio/dev2.flac", "call five")],
    ).write()


@pytest.fixture(scope="session")
def char_tokenizer() -> Tokenizer:
    return Tokenizer.train(TEXTS, model_type="char")


# A tiny Transformer at 4x subsampling of d_model channels, global attention, no attention dropout: what these tests
# were written for, whatever the default run's encoder (EncoderConfig's defaults) is.
TINY_ENCODER = {"d_model": 32, "n_heads": 4, "n_layers": 2, "block": "transformer", "subsampling": 4,
                "conv_channels": 0, "attention_window": 0, "attention_dropout": 0.0, "conv_kernel": 31}


# Data as these tests were written for, whatever the default run's (ASRDataModule's defaults): characters, each
# utterance at its own speed, no augmentation, nothing cached, 4x subsampling's frames (as TINY_ENCODER's).
PLAIN_DATA = {"tokenizer": TokenizerConfig(type="char"), "max_batch_seconds": 60.0, "speed_perturb": [1.0],
              "cache_audio_mb": 0.0, "subsampling": 4, "augmentation": Augmentation.off()}


def encoder(**overrides) -> EncoderConfig:
    """A tiny EncoderConfig (TINY_ENCODER) with ``overrides``."""
    return EncoderConfig(**{**TINY_ENCODER, **overrides})


def make_model(sample_rate: int = 16000, subsampling: int = 4, checkpoint_every: int = 0, dropout: float = 0.0,
               vocab_size: int = 12, seed: int = 0, attention_window: int = 0, block: str = "transformer",
               conv_norm: str = "layer", n_layers: int = 2, subsampling_conv: str = "full") -> CTCModel:
    """A ~40k-parameter CTCModel (d_model 32, n_layers blocks, 4 heads; conformer: kernel 5), weights fixed by ``seed``."""
    features = FeatureConfig(sample_rate, norm="bin", var_floor=0.0, quiet_db=0.0)
    cfg = encoder(n_layers=n_layers, ff_mult=2, dropout=dropout, subsampling=subsampling,
                  attention_window=attention_window, block=block, conv_kernel=5, conv_norm=conv_norm,
                  subsampling_conv=subsampling_conv)
    torch.manual_seed(seed)
    return CTCModel(features, cfg, vocab_size, checkpoint_every=checkpoint_every)


@pytest.fixture
def tiny_model():
    """tiny_model(**kwargs) -> make_model(**kwargs); see make_model for the arguments."""
    return make_model


@pytest.fixture
def waveforms():
    """waveforms(seconds..., rate=16000) -> (padded (B, n) float32 batch, lengths (B,)) of random noise."""

    def make(*seconds: float, rate: int = 16000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        audio = [torch.randn(int(s * rate), generator=generator) * 0.1 for s in seconds]
        lengths = torch.tensor([len(a) for a in audio])
        return torch.nn.utils.rnn.pad_sequence(audio, batch_first=True), lengths

    return make


@pytest.fixture
def keep_threads():
    """Torch's thread count as it was before the test (asr.fit's --threads sets it for the whole process)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def info_messages(monkeypatch) -> list[str]:
    """The messages asr.data.manifest logs with rank_zero_info during the test (Lightning's logger does not propagate)."""
    messages: list[str] = []
    monkeypatch.setattr("asr.data.manifest.rank_zero_info", lambda message, *args, **kwargs: messages.append(message))
    return messages


@pytest.fixture
def tone_file(tmp_path, char_tokenizer):
    """tone_file(name, texts) -> (path, words, spans): the texts one after another as a FLAC file."""

    def make(name: str, texts: list[str]):
        audio, words, spans, offset = [], [], [], 0.0
        for text in texts:
            samples, text_spans = tones(char_tokenizer, text)
            audio.append(samples)
            words += text.split()
            spans += [(a + offset, b + offset) for a, b in text_spans]
            offset += len(samples) / RATE
        path = tmp_path / name
        soundfile.write(path, np.concatenate(audio), RATE)
        return path, words, spans

    return make


def save_checkpoint(module, path: Path, **entries) -> Path:
    """Write ``module`` (an ASRModule) as a checkpoint that asr.fit could have written: weights, hyper-parameters
    and tokenizer; ``entries`` add keys or replace these."""
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "tokenizer": module.tokenizer.serialized} | entries, path)
    return path


# Checkpoints written before the settings were grouped (issue 40) hold them flat, each under its field's name or,
# where the field was renamed, under its old one; their encoder's weights are model.subsampling.* and model.blocks.*.
OLD_NAMES = {("features", "kind"): "features", ("features", "norm"): "feature_norm",
             ("features", "var_floor"): "feature_var_floor", ("features", "stats_db"): "feature_stats_db"}


def flat_hyper_parameters(hyper_parameters: dict) -> dict:
    """Grouped hyper-parameters (``{"encoder": {"d_model": 32, ...}, ...}``) as the code before issue 40 wrote
    them: ``{"d_model": 32, ..., "spec_augment": True, "freq_masks": 2, ...}``."""
    flat = {}
    for name, value in hyper_parameters.items():
        if name in ("features", "encoder", "spec_augment"):
            for field, setting in (value or {}).items():
                flat[OLD_NAMES.get((name, field), field)] = setting
            if name == "spec_augment":
                flat["spec_augment"] = value is not None
        else:
            flat[name] = value
    return flat


def old_weight_names(state_dict: dict) -> dict:
    """An ASRModule's state_dict with its encoder's weights named as before issue 40 (model.blocks.0..., not
    model.encoder.blocks.0...)."""
    return {key.replace("model.encoder.", "model.", 1) if key.startswith("model.encoder.") else key: value
            for key, value in state_dict.items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny untrained ASRModule checkpoint (char tokenizer, local attention), as asr.fit writes it."""
    from asr.train.module import ASRModule  # here: the tests that need no checkpoint need no Lightning

    tokenizer = Tokenizer.train(TEXTS, model_type="char")
    torch.manual_seed(0)
    module = ASRModule(tokenizer=tokenizer, encoder=encoder(n_heads=2, n_layers=1, ff_mult=2, dropout=0.0,
                                                            attention_window=4),
                       features=FeatureConfig(norm="bin", quiet_db=0.0), inter_ctc=0.0)
    return save_checkpoint(module, tmp_path_factory.mktemp("ckpt") / "tiny.ckpt")


@pytest.fixture
def tokenizer_arg(tmp_path) -> str:
    """``--data.tokenizer.model=...`` of a small BPE tokenizer trained on two lines, for asr.bench.steps.build."""
    Tokenizer.train(["call five two nine", "go left erase three"]).save(tmp_path / "tokenizer.model")
    return f"--data.tokenizer.model={tmp_path / 'tokenizer.model'}"


def pytest_collection_modifyitems(config, items):
    """The end-to-end tests first, the longest files (pytest-xdist hands out whole files in this order, and a long
    one last would run alone at the end); skip the tests marked ``gpu`` (pyproject.toml's markers) where torch
    sees no CUDA device."""
    items.sort(key=lambda item: "e2e" not in item.path.parts)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs the gpu tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_auto_num_workers(config) -> int:
    """``pytest`` runs the suite in one pytest-xdist worker a core (pyproject.toml's addopts): the cores this
    process may use, hyper-threads included (xdist's own count would take physical cores where psutil is present)."""
    return usable_cores()


def pytest_configure(config):
    """Hold each pytest-xdist worker, and every process its tests start, to its own share of the cores.

    Most of the suite's time is processes importing torch and Lightning on one core. Two workers that each ran
    OpenMP on all the cores slowed each other's training several-fold (docs/benchmarks.md 2026-11-27); a worker
    on its own core sees one core, and asr.fit's ``auto`` threads and data workers choose for that, as on a
    one-core machine."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw"))
    mine = cores[index::workers] or [cores[index % len(cores)]]
    for thread in os.listdir("/proc/self/task"):  # every thread of the worker: affinity is a thread's own
        os.sched_setaffinity(int(thread), mine)
    torch.set_num_threads(len(mine))
