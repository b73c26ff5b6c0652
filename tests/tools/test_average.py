"""asr.average: the mean of floating weights, selection by --best/--last, refusal of mismatched files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.tokenizer import Tokenizer
from asr.tools.averaging import AverageError, average, main
from asr.train.module import ASRModule
from tests.conftest import encoder as tiny_encoder, save_checkpoint


def write_checkpoint(path: Path, tokenizer: Tokenizer, seed: int = 0, step: int = 0, extra_state: dict | None = None,
                     encoder: dict | None = None, **hparams) -> Path:
    """A checkpoint as asr.fit writes it (tiny model, weights fixed by ``seed``), with optimizer state; ``encoder``:
    other EncoderConfig fields, ``hparams``: other arguments of ASRModule."""
    torch.manual_seed(seed)
    shapes = tiny_encoder(**{"dropout": 0.0, **(encoder or {})})
    settings = dict(encoder=shapes, spec_augment=None, inter_ctc=0.0) | hparams
    module = ASRModule(tokenizer=tokenizer, **settings)
    return save_checkpoint(module, path, state_dict=module.state_dict() | (extra_state or {}), epoch=step,
                           global_step=step, optimizer_states=[{"state": {}, "param_groups": []}], lr_schedulers=[{}])


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def test_two_identical_checkpoints_average_to_the_same_model(char_tokenizer, waveforms, tmp_path):
    a = write_checkpoint(tmp_path / "a.ckpt", char_tokenizer, seed=1)
    b = write_checkpoint(tmp_path / "b.ckpt", char_tokenizer, seed=1, step=5)
    main([str(tmp_path / "avg.ckpt"), str(a), str(b)])
    for name, tensor in weights(a).items():
        torch.testing.assert_close(weights(tmp_path / "avg.ckpt")[name], tensor, rtol=0, atol=1e-7)
    original, averaged = ASRModule.from_checkpoint(a), ASRModule.from_checkpoint(tmp_path / "avg.ckpt")
    audio, lengths = waveforms(1.0, 0.6)
    assert averaged.transcribe_batch(audio, lengths) == original.transcribe_batch(audio, lengths)


def test_two_different_checkpoints_average_to_their_mean_with_integers_from_the_last(char_tokenizer, tmp_path):
    a = write_checkpoint(tmp_path / "a.ckpt", char_tokenizer, seed=1, extra_state={"model.steps": torch.tensor(3)})
    b = write_checkpoint(tmp_path / "b.ckpt", char_tokenizer, seed=2, step=7, extra_state={"model.steps": torch.tensor(9)})
    averaged = average([a, b])
    for name, tensor in weights(a).items():
        if tensor.is_floating_point():
            torch.testing.assert_close(averaged["state_dict"][name], (tensor + weights(b)[name]) / 2)
            assert averaged["state_dict"][name].dtype == tensor.dtype
    assert averaged["state_dict"]["model.steps"].item() == 9
    assert averaged["global_step"] == 7 and averaged["averaged_from"] == [str(a), str(b)]
    assert "optimizer_states" not in averaged and "lr_schedulers" not in averaged  # weights only: not resumable


@pytest.mark.parametrize("change, message", [
    (dict(encoder=dict(d_model=48)), r"hyper-parameters differ.*encoder\.d_model=48 vs 32"),
    (dict(encoder=dict(ff_mult=2)), r"encoder\.ff_mult=2 vs 4"),
    (dict(tokenizer="other"), "tokenizer differs"),
])
def test_mismatched_checkpoints_are_refused_naming_the_file(char_tokenizer, tmp_path, change, message):
    a = write_checkpoint(tmp_path / "a.ckpt", char_tokenizer)
    tokenizer = Tokenizer.train(["other words entirely"], model_type="char") if change.pop("tokenizer", None) \
        else char_tokenizer
    b = write_checkpoint(tmp_path / "b.ckpt", tokenizer, **change)
    with pytest.raises(AverageError, match=f"b.ckpt: .*{message}"):
        average([a, b])
    with pytest.raises(SystemExit, match="^python -m asr.average: error: .*b.ckpt"):
        main([str(tmp_path / "avg.ckpt"), str(a), str(b)])
    assert not list(tmp_path.glob("avg.ckpt*"))  # nothing written, not even a partial file


def test_different_weight_shapes_are_refused_naming_the_weight(char_tokenizer, tmp_path):
    a = write_checkpoint(tmp_path / "a.ckpt", char_tokenizer)
    b = write_checkpoint(tmp_path / "b.ckpt", char_tokenizer)
    checkpoint = torch.load(b, weights_only=True)
    checkpoint["state_dict"]["model.head.bias"] = torch.zeros(3)
    torch.save(checkpoint, b)
    with pytest.raises(AverageError, match=r"b.ckpt: model.head.bias is torch.float32 \(3,\)"):
        average([a, b])


def test_a_file_that_is_no_checkpoint_is_named(char_tokenizer, tmp_path):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(AverageError, match="notes.ckpt: cannot read"):
        average([write_checkpoint(tmp_path / "a.ckpt", char_tokenizer), tmp_path / "notes.ckpt"])


@pytest.fixture
def run_folder(char_tokenizer, tmp_path) -> Path:
    """Checkpoints as the default run leaves them, with save_top_k 3; last.ckpt is epoch 3's step again."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step, wer in [(10, 0.5), (20, 0.3), (30, 0.4)]:
        write_checkpoint(folder / f"epoch{step // 10:03d}-wer{wer:.4f}.ckpt", char_tokenizer, seed=step, step=step)
    write_checkpoint(folder / "last.ckpt", char_tokenizer, seed=30, step=30)
    return folder


def test_best_averages_the_lowest_wer_checkpoints(run_folder, tmp_path):
    main([str(tmp_path / "best.ckpt"), "--best", "2", str(run_folder)])
    assert torch.load(tmp_path / "best.ckpt", weights_only=True)["averaged_from"] == [
        str(run_folder / "epoch002-wer0.3000.ckpt"), str(run_folder / "epoch003-wer0.4000.ckpt")]


def test_last_averages_the_newest_steps_counting_last_ckpt_once(run_folder, tmp_path):
    main([str(tmp_path / "last2.ckpt"), "--last", "2", str(run_folder)])
    sources = torch.load(tmp_path / "last2.ckpt", weights_only=True)["averaged_from"]
    assert [Path(p).name for p in sources] == ["epoch002-wer0.3000.ckpt", "epoch003-wer0.4000.ckpt"]


def test_asking_for_more_checkpoints_than_kept_points_at_save_top_k(run_folder, tmp_path):
    with pytest.raises(SystemExit, match="only 3 such checkpoints.*save_top_k"):
        main([str(tmp_path / "x.ckpt"), "--best", "4", str(run_folder)])


def test_a_checkpoint_from_before_a_setting_existed_averages_with_one_at_its_default(char_tokenizer, tmp_path):
    """A resumed run can span a release that added a setting (inter_ctc): the older file lacks the key."""
    a = write_checkpoint(tmp_path / "a.ckpt", char_tokenizer, seed=0)
    b = write_checkpoint(tmp_path / "b.ckpt", char_tokenizer, seed=1)
    older = torch.load(a, weights_only=True)
    del older["hyper_parameters"]["inter_ctc"]
    torch.save(older, a)
    average([a, b])  # no error: the missing inter_ctc is ASRModule's default, 0.0, as b's
    changed = write_checkpoint(tmp_path / "c.ckpt", char_tokenizer, inter_ctc=0.3)
    with pytest.raises(AverageError, match="c.ckpt: .*inter_ctc=0.3 vs 0.0"):
        average([a, changed])
