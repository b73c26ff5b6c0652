"""asr.fit on a bad day (issue 39): what a user can get wrong, or a machine can do to a run, ends with one line
that names the flag, file or folder, an exit code that is not 0, and no file a user wants back replaced.

A case that trains, signals or reads what a run prints is a subprocess of ``python -m asr.fit`` (or asr.average,
asr.export) as a user runs it, with tests/e2e/test_resilience.py's timeout: a hang fails the test. A setting refused
before training is the command's own function (``refused``) in this process, which spares each case the 5-6 s
of imports a new process costs on a 2-core CPU; tests/e2e/test_fit.py runs such a refusal as a process too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.test_resilience import SMALL, data, run, versions  # noqa: F401  (data: a fixture)
from tests.faults import signal_at
from tests.cli import CHAR_FRAMES, one_line_refusal, refused


def asr(module: str, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", f"asr.{module}", *args])


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory) -> tuple[Path, list[str]]:
    """A run of one epoch on data/mini's first 28 lines, finished: (save_dir, the arguments it ran with)."""
    out = tmp_path_factory.mktemp("finished")
    args = [*SMALL, *data, "--trainer.max_epochs", "1", "--test", "false", "--trainer.logger.init_args.save_dir", str(out)]
    result = asr("fit", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, args


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(result: subprocess.CompletedProcess, message: str, code: int = 1) -> None:
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(("asr.", "python -m asr.")) and message in last, result.stderr[-1000:]


def bad_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"bad-{kind}"
    if kind == "folder":
        path.mkdir()
    elif kind == "text":
        path.write_text("not a model\n")
    return path  # "missing": nothing there


@pytest.mark.parametrize("args, message", [
    (["--model.encoder.dropout", "1"], "model.encoder.dropout must be in [0, 1), got 1"),
    (["--model.encoder.dropout", "1.5"], "model.encoder.dropout must be in [0, 1), got 1.5"),
    (["--model.encoder.attention_dropout", "-0.1"], "model.encoder.attention_dropout must be in [0, 1), got -0.1"),
    (["--model.optimizer.init_args.lr", "-0.001"], "model.optimizer: Invalid learning rate: -0.001"),
    (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches must be at least 1, got 0"),
    (["--trainer.max_epochs", "0"], "trainer.max_epochs 0 trains nothing"),
    (["--data.tokenizer.vocab_size", "0"], "data.tokenizer.vocab_size must be at least 2"),
    (["--model.encoder.d_model", "0"], "model.encoder.d_model must be at least 1, got 0"),
    (["--model.schedule.warmup_steps", "-1"], "model.schedule.warmup_steps must be >= 0"),
    (["--data.sample_rate", "0"], "sample_rate must be at least 4000 Hz, got 0"),
    (["--data.max_batch_seconds", "0"], "data.max_batch_seconds must be > 0"),
    (["--trainer.max_epochs", "-5"], "`max_epochs` must be a non-negative integer or -1"),
    (["--trainer.devices", "0"], "`Trainer(devices='0')` value is not a valid input"),
    (["--trainer.logger.init_args.save_dir", "/proc/asr-runs"], "run folder /proc/asr-runs/default/version_0 cannot be written"),
])
def test_a_setting_out_of_range_is_one_line_with_the_range(args, message, tmp_path):
    one_line_refusal(refused("--trainer.logger.init_args.save_dir", str(tmp_path), *args), message)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("kind, reason", [("missing", "no such file"), ("folder", "a folder, not a sharded checkpoint (it has no meta.pt)"),
                                          ("text", "not a sentencepiece model or checkpoint of asr")])
def test_a_tokenizer_file_that_is_not_one_is_named_by_its_flag(kind, reason, tmp_path):
    path = bad_file(tmp_path, kind)
    one_line_refusal(refused("--data.tokenizer.model", str(path), "--trainer.logger.init_args.save_dir", str(tmp_path)),
                     f"data.tokenizer.model {path}: {reason}")


def test_a_config_file_that_is_not_yaml_is_named_with_its_line(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("trainer:\n  max_epochs: [3\nmodel:\n  encoder:\n    d_model: 64\n")
    one_line_refusal(refused("--config", str(config)), f"--config {config}: not valid YAML at line 3")


@pytest.mark.parametrize("kind, reason", [("missing", "no such file"), ("text", "not a readable checkpoint"),
                                          ("cut", "not a readable checkpoint")])
def test_a_checkpoint_to_resume_that_is_not_one_is_named(kind, reason, finished, tmp_path):
    out, args = finished
    path = bad_file(tmp_path, kind)
    if kind == "cut":  # a copy interrupted half way
        whole = (versions(out)[0] / "checkpoints" / "last.ckpt").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    one_line_refusal(refused(*args, "--ckpt_path", str(path)), f"--ckpt_path {path}: {reason}")


def test_ckpt_path_last_passes_over_a_newest_checkpoint_cut_short_for_the_one_before(finished, tmp_path):
    out, args = finished
    copy = tmp_path / "runs"
    shutil.copytree(out, copy)
    newer = copy / "default" / "version_9" / "checkpoints" / "last.ckpt"
    newer.parent.mkdir(parents=True)
    whole = (copy / "default" / "version_0" / "checkpoints" / "last.ckpt").read_bytes()
    newer.write_bytes(whole[:1000])  # written last: the newest
    args = [a if a != str(out) else str(copy) for a in args]
    result = asr("fit", *args, "--ckpt_path", "last")
    said = result.stdout + result.stderr
    assert f"--ckpt_path last: passing over {newer}: not a readable checkpoint" in said
    assert f"resuming from {copy / 'default' / 'version_0' / 'checkpoints' / 'last.ckpt'}" in said
    assert result.returncode == 0 and "nothing to train" in said  # it had finished its one epoch


def test_a_sharded_folder_cut_short_is_passed_over_and_one_is_resumed_under_fsdp_only(finished, tmp_path):
    out, args = finished
    copy = tmp_path / "runs"
    shutil.copytree(out, copy)
    newer = copy / "default" / "version_9" / "checkpoints" / "last.ckpt"
    newer.mkdir(parents=True)  # meta.pt but no torch.distributed.checkpoint .metadata: a write never finished
    shutil.copy(copy / "default" / "version_0" / "checkpoints" / "last.ckpt", newer / "meta.pt")
    args = [a if a != str(out) else str(copy) for a in args]
    result = asr("fit", *args, "--ckpt_path", "last")
    said = result.stdout + result.stderr
    assert f"--ckpt_path last: passing over {newer}: its shards cannot be read" in said
    assert result.returncode == 0 and "nothing to train" in said  # the file of version_0 had finished its epoch
    one_line_refusal(refused(*args, "--ckpt_path", str(newer)), f"--ckpt_path {newer} is a sharded checkpoint "
                   f"folder, which only configs/strategy/fsdp.yaml resumes from; make it one file for this strategy")


@pytest.mark.parametrize("change, message", [
    (["--model.encoder.d_model", "96"], "weights differ in shape, e.g. model."),
    (["--data.tokenizer.type", "char", *CHAR_FRAMES], "its tokenizer is another"),
    (["--data.sample_rate", "8000"], "its input features differ (features.sample_rate 16000 -> 8000"),
])
def test_resuming_another_model_is_refused_naming_what_differs(change, message, finished):
    out, args = finished
    one_line_refusal(refused(*args, "--trainer.max_epochs", "2", *change, "--ckpt_path", "last"), message)


def test_a_tokenizer_of_the_same_size_but_other_pieces_is_refused_on_resume(finished, tmp_path, data):
    """The manifest changed between runs: a tokenizer trained on it has as many pieces, other ones."""
    out, args = finished
    train = Path(data[1])
    changed = tmp_path / "train.jsonl"
    changed.write_text(train.read_text().replace("call", "cull"))
    args = [a if a != str(train) else str(changed) for a in args]
    one_line_refusal(refused(*args, "--trainer.max_epochs", "2", "--ckpt_path", "last"), "its tokenizer is another")


def test_a_finished_run_folder_is_not_reused_unless_asked(finished):
    out, args = finished
    before = snapshot(out)
    message = refused(*args, "--trainer.logger.init_args.version", "0")
    one_line_refusal(message, "already holds a run")
    assert "--ckpt_path last" in message and "--overwrite true" in message
    assert snapshot(out) == before


def test_average_and_export_refuse_to_replace_a_resumable_checkpoint_or_an_input(finished, tmp_path):
    out, _ = finished
    last = versions(out)[0] / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    result = asr("average", str(last), str(last))
    one_line_error(result, "is also an input")
    result = asr("export", str(last), str(last))
    one_line_error(result, "is also an input")
    other = next(p for p in last.parent.glob("*.ckpt") if p != last)
    one_line_error(asr("average", str(last), str(other)), "is a checkpoint a run resumes from")
    assert last.read_bytes() == before


def test_ctrl_c_writes_a_checkpoint_like_sigterm_and_exits_130(data, tmp_path):
    args = [*SMALL, *data, "--trainer.max_epochs", "2", "--test", "false", "--trainer.logger.init_args.save_dir",
            str(tmp_path)]
    result = asr("fit", *args, *signal_at(2, "SIGINT", group=True))  # Ctrl-C signals the terminal's whole group
    assert result.returncode == 130 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "asr.fit: SIGINT: stopped after step 3 and wrote " in result.stderr
    checkpoint = torch.load(versions(tmp_path)[-1] / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3 and checkpoint["optimizer_states"]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs, mounted for the test (root only; skipped where mount is not allowed)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_while_a_checkpoint_is_written_names_the_file_and_keeps_the_previous_one(small_disk):
    from asr.train.resilience import AtomicCheckpointIO, CheckpointWriteError

    io, path = AtomicCheckpointIO(), small_disk / "last.ckpt"
    io.save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)
    with pytest.raises(CheckpointWriteError, match=rf"{path}: checkpoint not written \(no space left on the device; "):
        io.save_checkpoint({"step": 2, "weights": torch.ones(1_000_000)}, path)  # 4 MB
    assert torch.load(path, weights_only=True)["step"] == 1 and [p.name for p in small_disk.iterdir()] == ["last.ckpt"]


def test_a_run_folder_without_room_for_two_checkpoints_is_refused_before_the_first_step(small_disk):
    message = refused("--trainer.logger.init_args.save_dir", str(small_disk), "--model.encoder.d_model", "256")
    one_line_refusal(message, "MiB free, and two checkpoints of this model need")
    assert not list(small_disk.rglob("*.ckpt"))
