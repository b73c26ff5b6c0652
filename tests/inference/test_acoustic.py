"""Loading the model asr.transcribe runs (asr/inference/acoustic.py): a checkpoint of asr.fit becomes an
AcousticModel with the documented shapes and units; anything else is a CheckpointError naming
the file. (Exported models: tests/tools/test_export.py; the CLI's one-line errors: test_transcribe_inputs.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.inference.acoustic import CheckpointError, load_model
from tests.conftest import TEXTS


def test_a_checkpoint_is_a_model_of_log_probs_per_frame_on_the_cpu(checkpoint, waveforms):
    model = load_model(checkpoint)
    assert model.sample_rate == 16000 and model.frame_seconds == pytest.approx(0.04)  # 10 ms hop x 4
    assert model.tokenizer.decode(model.tokenizer.encode(TEXTS[0])) == TEXTS[0]  # it travelled in the file
    audio, lengths = waveforms(1.0, 0.6)
    log_probs, out_lengths = model.log_probs(audio, lengths)
    assert log_probs.dtype == torch.float32 and log_probs.device.type == "cpu"
    assert log_probs.shape == (2, out_lengths.max(), model.tokenizer.vocab_size)
    assert out_lengths.tolist() == model.module.model.encoder_frames(lengths).tolist()  # ~1 per frame_seconds
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]))
    torch.testing.assert_close(model.log_probs(audio, lengths)[0], log_probs)  # eval mode: no dropout


def test_a_checkpoints_statistics_can_come_from_some_of_its_samples(checkpoint, waveforms):
    """The second pass of asr.inference.focus: the same frames, normalised by the statistics of the samples given."""
    model = load_model(checkpoint)
    audio, lengths = waveforms(1.0, 0.6)
    log_probs, out_lengths = model.log_probs(audio, lengths)
    every = torch.stack([torch.zeros_like(lengths), lengths], 1)
    torch.testing.assert_close(model.log_probs(audio, lengths, statistics=every)[0], log_probs)
    some, same_lengths = model.log_probs(audio, lengths, statistics=torch.tensor([[4000, 12000], [0, 9600]]))
    assert same_lengths.tolist() == out_lengths.tolist() and some.shape == log_probs.shape
    assert not torch.allclose(some[0], log_probs[0], atol=1e-3)
    torch.testing.assert_close(some[1, : out_lengths[1]], log_probs[1, : out_lengths[1]])


def test_what_is_not_a_checkpoint_is_named(checkpoint, tmp_path):
    (tmp_path / "text.ckpt").write_text("hello")
    (tmp_path / "cut.ckpt").write_bytes(Path(checkpoint).read_bytes()[:2000])
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    (tmp_path / "folder.ckpt").mkdir()
    for name, message in [("none.ckpt", "no such file"), ("folder.ckpt", "a folder, not a sharded checkpoint"),
                          ("text.ckpt", "not a checkpoint of asr.fit"), ("cut.ckpt", "not a checkpoint of asr.fit"),
                          ("other.ckpt", "no tokenizer inside")]:
        with pytest.raises(CheckpointError, match=name) as error:
            load_model(tmp_path / name)
        assert message in str(error.value) and "\n" not in str(error.value)
