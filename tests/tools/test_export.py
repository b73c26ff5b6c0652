"""asr.export: the exported file transcribes as its checkpoint does, on batches of any size and
length, loads without the training code, and is refused (nothing written) when it would not."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from asr.models.features import FeatureConfig
from asr.inference.exported import METADATA_FILE, TOKENIZER_FILE, ExportedModel, ExportedModelV1, is_exported, load
from asr.models.ctc_decoding import greedy
from asr.tools import exporting
from asr.train.module import ASRModule
from tests.conftest import encoder as tiny_encoder, save_checkpoint
from tests.tools.export_cache import exported_once, one_thread  # noqa: F401  (one_thread: an autouse fixture)

# Batches unlike the traced example (2 utterances of 1.0 and 0.6 s): 1 to 5 utterances, 0.02 to 2.3 s.
BATCHES = [(0.7,), (2.3, 0.2, 1.3), (0.5, 0.5, 0.02, 1.9, 0.8)]


def write_checkpoint(path: Path, tokenizer, seed: int = 0, features: dict | None = None, encoder: dict | None = None,
                     **hparams) -> Path:
    """A tiny randomly initialised checkpoint: its transcripts are arbitrary but deterministic. ``features`` and
    ``encoder``: other FeatureConfig and EncoderConfig fields, ``hparams``: other arguments of ASRModule."""
    torch.manual_seed(seed)
    shapes = tiny_encoder(**{"ff_mult": 2, "dropout": 0.1, **(encoder or {})})
    features = FeatureConfig(**{"norm": "bin", "quiet_db": 0.0, **(features or {})})
    settings = dict(features=features, encoder=shapes, inter_ctc=0.0) | hparams
    return save_checkpoint(ASRModule(tokenizer=tokenizer, **settings), path)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, char_tokenizer):
    """exports(name) -> (checkpoint, exported file, what the CLI printed); each exported once per module.

    "mel": 16 kHz log-mel, x4, global attention. "linear": 8 kHz linear, x8, a 2-frame attention window.
    """
    settings = {"mel": dict(),
                "linear": dict(features=dict(sample_rate=8000), encoder=dict(subsampling=8, attention_window=2))}
    return exported_once(tmp_path_factory, lambda path, name: write_checkpoint(path, char_tokenizer, **settings[name]))


@pytest.mark.parametrize("name", ["mel", "linear"])
def test_exported_model_transcribes_as_the_checkpoint_on_varied_batches(exports, char_tokenizer, waveforms, name):
    checkpoint, exported_file, printed = exports(name)
    assert "parity OK" in printed
    assert is_exported(exported_file) and not is_exported(checkpoint)
    module, exported = ASRModule.from_checkpoint(checkpoint), load(exported_file)
    rate = module.hparams.features["sample_rate"]
    assert exported.sample_rate == rate
    assert exported.frame_seconds == pytest.approx(0.01 * module.hparams.encoder["subsampling"])
    assert exported.tokenizer.serialized == char_tokenizer.serialized
    for seed, seconds in enumerate(BATCHES):
        audio, lengths = waveforms(*seconds, rate=rate, seed=seed)
        want, want_lengths = module(audio, lengths)
        got, got_lengths = exported.log_probs(audio, lengths)
        assert torch.equal(got_lengths, want_lengths)
        for b, n in enumerate(want_lengths.tolist()):
            torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-5, rtol=1e-5)
        assert greedy(got, got_lengths) == greedy(want, want_lengths)
        # extra padding past the longest utterance changes no frame inside the lengths
        wider, wider_lengths = exported.log_probs(torch.nn.functional.pad(audio, (0, rate // 3)), lengths)
        assert torch.equal(wider_lengths, want_lengths)
        for b, n in enumerate(want_lengths.tolist()):
            torch.testing.assert_close(wider[b, :n], want[b, :n], atol=1e-5, rtol=1e-5)


LOAD_WITHOUT_TRAINING_CODE = """
import json, sys
for name in ("asr.models.ctc", "asr.models.features", "asr.train.module", "asr.audio", "asr.data.datamodule", "pytorch_lightning", "lightning", "torchaudio"):
    sys.modules[name] = None  # any import of these now fails
import torch
from asr.inference.exported import load
from asr.models.ctc_decoding import greedy
model = load(sys.argv[1])
audio, lengths = torch.load(sys.argv[2])
log_probs, out_lengths = model.log_probs(audio, lengths)
print(json.dumps([model.tokenizer.decode(ids) for ids in greedy(log_probs, out_lengths)]))
"""


def test_exported_file_loads_and_runs_without_the_training_code(exports, waveforms, tmp_path):
    checkpoint, exported_file, _ = exports("mel")
    audio, lengths = waveforms(1.4, 0.3, 0.9, seed=3)
    torch.save((audio, lengths), tmp_path / "batch.pt")
    result = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_TRAINING_CODE, str(exported_file),
                             str(tmp_path / "batch.pt")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = ASRModule.from_checkpoint(checkpoint).transcribe_batch(audio, lengths)
    assert json.loads(result.stdout.splitlines()[-1]) == expected


def test_export_that_disagrees_with_its_checkpoint_fails_and_writes_nothing(exports, char_tokenizer, tmp_path,
                                                                            monkeypatch):
    # the graph of another model (other weights) stands for any drift between the export and asr.models
    _, other_export, _ = exports("mel")
    with open(other_export, "rb") as f:
        other_program = torch.export.load(f)
    monkeypatch.setattr(exporting, "export_program", lambda model, sample_rate: other_program)
    write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, seed=1)
    refused = "^python -m asr.export: error: .*not written, the export disagrees with .*m.ckpt: parity FAILED"
    with pytest.raises(SystemExit, match=refused):
        exporting.main([str(tmp_path / "m.ckpt"), str(tmp_path / "m.pt2")])
    assert not list(tmp_path.glob("m.pt2*"))


def test_files_that_are_not_exports_are_told_apart(char_tokenizer, tmp_path):
    (tmp_path / "text.pt2").write_text("hello")
    assert not is_exported(tmp_path / "text.pt2") and not is_exported(tmp_path / "missing.pt2")
    with pytest.raises(ValueError, match="text.pt2 is not a file written by python -m asr.export"):
        load(tmp_path / "text.pt2")


def rewritten(exported_file: Path, copy: Path, member: str, change) -> Path:
    """A copy of an exported file whose archive member ending in ``member`` is ``change(bytes)``."""
    with zipfile.ZipFile(exported_file) as source, zipfile.ZipFile(copy, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            target.writestr(item, change(data) if item.filename.endswith(member) else data)
    return copy


def test_a_file_whose_weights_would_be_unpickled_is_refused(exports, tmp_path):
    _, exported_file, _ = exports("mel")
    crafted = rewritten(exported_file, tmp_path / "crafted.pt2", "model_weights_config.json",  # a pickled payload
                        lambda data: data.replace(b'"use_pickle": false', b'"use_pickle": true', 1))
    with pytest.raises(ValueError, match="crafted.pt2: .* would be unpickled"):
        load(crafted)


def test_asr_transcribe_runs_the_exported_file_as_the_checkpoint(exports, write_audio):
    from asr.inference.transcriber import Transcriber

    checkpoint, exported_file, _ = exports("mel")
    files = [write_audio(f"{i}.flac", seconds, seed=i) for i, seconds in enumerate((1.2, 0.4, 2.1))]
    from_export = Transcriber.from_checkpoint(exported_file)
    assert isinstance(from_export.model, ExportedModel)
    assert from_export.transcribe(files) == Transcriber.from_checkpoint(checkpoint).transcribe(files)


@pytest.mark.parametrize("name", ["mel", "linear"])
def test_exported_statistics_of_a_part_normalise_as_the_checkpoints(exports, waveforms, name):
    checkpoint, exported_file, _ = exports(name)
    module, exported = ASRModule.from_checkpoint(checkpoint).eval(), load(exported_file)
    rate = exported.sample_rate
    audio, lengths = waveforms(1.5, 0.7, 2.2, rate=rate, seed=5)
    audio[:, rate // 2: rate] *= 20  # a loud half second: statistics that hold it, or not, differ
    statistics = torch.tensor([[rate // 2, rate], [0, lengths[1]], [rate, 2 * rate]])
    with torch.no_grad():
        want, want_lengths = module.model(audio, lengths, statistics=statistics)
        whole, _ = module.model(audio, lengths)
    got, got_lengths = exported.log_probs(audio, lengths, statistics)
    assert torch.equal(got_lengths, want_lengths)
    for b, n in enumerate(want_lengths.tolist()):
        torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want[0], whole[0], atol=1e-3)  # the statistics of a part are not all samples'
    torch.testing.assert_close(want[1, :want_lengths[1]], whole[1, :want_lengths[1]])  # [0, length) is all


def test_the_second_pass_of_an_exported_file_takes_the_speechs_statistics_as_the_checkpoint(exports, write_audio,
                                                                                              monkeypatch):
    from asr.inference import transcriber as tr

    checkpoint, exported_file, _ = exports("mel")
    files = [write_audio(f"{i}.flac", seconds, seed=i) for i, seconds in enumerate((1.6, 2.4))]
    runs = []  # the statistics each second pass asked for
    monkeypatch.setattr(tr, "speech_span", lambda spans, frames, *_: (frames // 4, frames // 2))  # always again
    from_export = tr.Transcriber.from_checkpoint(exported_file)
    program = from_export.model.program
    from_export.model.program = lambda audio, lengths, statistics: runs.append(statistics) or program(audio, lengths,
                                                                                                        statistics)
    assert from_export.transcribe(files) == tr.Transcriber.from_checkpoint(checkpoint).transcribe(files)
    first, second = runs
    assert torch.equal(first[:, 0], torch.zeros(2, dtype=torch.int64))  # the first pass: every sample
    assert (second[:, 0] > 0).all() and (second[:, 1] < first[:, 1]).all()  # the second: the span's samples


def version_1_file(checkpoint: Path, path: Path) -> Path:
    """What asr.export wrote before format version 2: a graph of (audio, lengths) alone."""
    module = ASRModule.from_checkpoint(checkpoint)
    model = exporting.serving_model(module.model).model
    audio, lengths, _ = exporting.example_batch(exporting.EXAMPLE_SECONDS, model.sample_rate)
    dynamic = torch.export.Dim.DYNAMIC
    with torch.no_grad():
        program = torch.export.export(model, (audio, lengths), strict=False,
                                      dynamic_shapes=({0: dynamic, 1: dynamic}, {0: dynamic}))
    meta = exporting.metadata(module, program, checkpoint) | {"version": 1}
    with open(path, "wb") as f, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No complete tensor found")  # as asr.export does: said of CPU-only models
        torch.export.save(program, f, extra_files={METADATA_FILE: json.dumps(meta),
                                                   TOKENIZER_FILE: base64.b64encode(
                                                       module.tokenizer.serialized).decode("ascii")})
    return path


def test_a_file_of_format_version_1_still_transcribes_without_statistics(exports, write_audio, tmp_path):
    from asr.inference.transcriber import Transcriber

    checkpoint, _, _ = exports("mel")
    old = load(version_1_file(checkpoint, tmp_path / "v1.pt2"))
    assert isinstance(old, ExportedModelV1)
    files = [write_audio(f"{i}.flac", seconds, seed=i) for i, seconds in enumerate((1.2, 0.4))]
    transcriber = Transcriber(old, second_pass=0.0)
    assert not transcriber.statistics  # its second pass crops (asr.inference.focus)
    assert transcriber.transcribe(files) == Transcriber.from_checkpoint(checkpoint, second_pass=0.0).transcribe(files)


def test_a_file_of_an_unknown_format_version_is_refused_naming_both(exports, tmp_path):
    _, exported_file, _ = exports("mel")
    future = rewritten(exported_file, tmp_path / "future.pt2", f"/extra/{METADATA_FILE}",
                       lambda data: json.dumps(json.loads(data) | {"version": 99}).encode())
    with pytest.raises(ValueError, match="future.pt2: format asr-ctc-export version 99; this asr reads asr-ctc-export "
                                         "versions 1, 2 and asr-transducer-export, asr-hybrid-export version 2: "
                                         "export the checkpoint again"):
        load(future)
