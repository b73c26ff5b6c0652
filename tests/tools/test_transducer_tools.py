"""asr.export and asr.average with transducers: the .pt2 holds the network, the prediction network and the joiner,
its format names the objective, it transcribes as its checkpoint (greedy and beam search) and loads without the
training code; an export that disagrees writes nothing; averaging mixes the new layers too, and refuses a CTC
checkpoint beside a transducer's."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
import torch

from asr.inference.exported import load
from asr.inference.transcriber import Transcriber
from asr.tokenizer import BLANK_ID
from asr.tools import exporting
from asr.tools.averaging import AverageError, average, main as average_main
from asr.train.module import ASRModule
from tests.models.test_transducer import CONFIG
from tests.tools.test_average import weights, write_checkpoint as fit_checkpoint
from tests.tools.export_cache import exported_once, one_thread  # noqa: F401  (one_thread: an autouse fixture)
from tests.tools.test_export import BATCHES, write_checkpoint

SPARING = 0.8  # added to the blank's logit of a random joiner


def transducer_checkpoint(path, tokenizer, objective: str = "transducer", seed: int = 0):
    """A tiny random transducer whose joiner prefers the blank a little, as a trained one does (an untrained one
    emits its most tokens on every frame): a few tokens per utterance."""
    write_checkpoint(path, tokenizer, seed=seed, encoder=dict(n_layers=1), objective=objective, transducer=CONFIG)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["state_dict"]["model.joiner.output.bias"][BLANK_ID] += SPARING
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory, char_tokenizer):
    """exports(objective) -> (checkpoint, exported file, what the CLI printed), each exported once per module."""
    return exported_once(tmp_path_factory, lambda path, objective: transducer_checkpoint(path, char_tokenizer,
                                                                                        objective))


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_an_exported_transducer_decodes_as_its_checkpoint(exports, waveforms, write_audio, objective):
    checkpoint, exported_file, printed = exports(objective)
    assert "parity OK" in printed and "prediction network and joiner max |diff|" in printed
    with zipfile.ZipFile(exported_file) as archive:
        meta = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("/extra/asr.json"))))
    vocab = ASRModule.from_checkpoint(checkpoint).tokenizer.vocab_size
    assert meta["format"] == f"asr-{objective}-export" and meta["decoder"]["ctc_width"] == (
        vocab if objective == "hybrid" else 0)
    exported, module, texts = load(exported_file), ASRModule.from_checkpoint(checkpoint), []
    for seconds in BATCHES:
        audio, lengths = waveforms(*seconds, seed=len(seconds))
        frames, out_lengths = exported.log_probs(audio, lengths)
        texts += [exported.tokenizer.decode(ids) for ids in exported.objective.decode(frames, out_lengths)]
        assert texts[-len(seconds):] == module.transcribe_batch(audio, lengths)
    assert any(texts)
    files = [write_audio(f"{i}.flac", seconds, seed=i) for i, seconds in enumerate((1.2, 0.4))]
    for beam in (1, 4):
        from_export, from_checkpoint = (Transcriber(model, decoder=model.objective.decoder(model.tokenizer, beam))
                                        for model in (exported, Transcriber.from_checkpoint(checkpoint).model))
        assert from_export.transcribe_results(files) == from_checkpoint.transcribe_results(files)


LOAD_WITHOUT_TRAINING_CODE = """
import json, sys
for name in ("asr.train", "asr.audio", "asr.data", "pytorch_lightning", "lightning", "torchaudio"):
    sys.modules[name] = None  # any import of these now fails
import torch
from asr.inference.exported import load
model = load(sys.argv[1])
audio, lengths = torch.load(sys.argv[2])
frames, out_lengths = model.log_probs(audio, lengths)
texts = [model.tokenizer.decode(ids) for ids in model.objective.decode(frames, out_lengths)]
networks = [name for name in sys.modules if name.startswith("asr.models.") and not name.endswith("_decoding")]
print(json.dumps([texts, networks]))  # no network of asr.models: only its decoding of frames
"""


def test_an_exported_transducer_loads_and_decodes_without_the_training_code(exports, waveforms, tmp_path):
    checkpoint, exported_file, _ = exports("transducer")
    audio, lengths = waveforms(1.4, 0.3, seed=3)
    torch.save((audio, lengths), tmp_path / "batch.pt")
    result = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_TRAINING_CODE, str(exported_file),
                             str(tmp_path / "batch.pt")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    texts, networks = json.loads(result.stdout.splitlines()[-1])
    assert texts == ASRModule.from_checkpoint(checkpoint).transcribe_batch(audio, lengths) and networks == []


def test_an_export_whose_prediction_network_disagrees_fails_and_writes_nothing(exports, char_tokenizer, tmp_path,
                                                                                monkeypatch):
    other_checkpoint, _, _ = exports("transducer")  # another model's decoder graphs stand for any drift
    other = exporting.decoder_programs(exporting.serving_model(ASRModule.from_checkpoint(other_checkpoint).model).model)
    monkeypatch.setattr(exporting, "decoder_programs", lambda model: other)
    transducer_checkpoint(tmp_path / "m.ckpt", char_tokenizer, seed=1)
    with pytest.raises(SystemExit, match="not written, the export disagrees with .*m.ckpt: parity FAILED"):
        exporting.main([str(tmp_path / "m.ckpt"), str(tmp_path / "m.pt2")])
    assert not list(tmp_path.glob("m.pt2*"))


def test_transducer_checkpoints_average_and_a_ctc_one_is_refused_beside_them(char_tokenizer, waveforms, tmp_path):
    a, b = (fit_checkpoint(tmp_path / f"{name}.ckpt", char_tokenizer, seed=seed, step=seed, objective="hybrid",
                           transducer=CONFIG) for name, seed in (("a", 1), ("b", 2)))
    average_main([str(tmp_path / "avg.ckpt"), str(a), str(b)])
    mean = weights(tmp_path / "avg.ckpt")
    for name in ("model.predictor.lstm.weight_ih_l0", "model.joiner.output.weight", "model.head.weight"):
        torch.testing.assert_close(mean[name], (weights(a)[name] + weights(b)[name]) / 2)
    averaged = ASRModule.from_checkpoint(tmp_path / "avg.ckpt")
    assert averaged.hparams.objective == "hybrid" and averaged.transcribe_batch(*waveforms(0.8))
    ctc = fit_checkpoint(tmp_path / "ctc.ckpt", char_tokenizer, seed=3)
    with pytest.raises(AverageError, match="ctc.ckpt"):
        average([a, ctc])
