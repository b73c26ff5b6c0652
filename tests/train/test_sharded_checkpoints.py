"""asr.train.fsdp.ShardedStrategy's checkpoint folders in one gloo process: written beside the old one and renamed
into place whole, so a write that fails part-way leaves the previous checkpoint loadable; with async_save, the save
returns before the write and holds the weights of the moment it was called; teardown finishes the write in flight.

The 2-process runs (folders of the default FSDP preset, read by asr.transcribe, asr.average, --ckpt_path last) are
in tests/e2e/test_scale_out.py.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.accelerators import CPUAccelerator
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from asr.checkpoint import merge
from asr.train.fsdp import ShardedStrategy, replace
from asr.train.resilience import CheckpointWriteError, Preempted


@pytest.fixture
def model():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))  # its state dict holds DTensors, as under FSDP2
    yield model
    dist.destroy_process_group()


def strategy(async_save: bool) -> ShardedStrategy:
    """As Lightning sets it up for one CPU process."""
    strategy = ShardedStrategy(async_save=async_save)
    strategy.cluster_environment, strategy.accelerator = LightningEnvironment(), CPUAccelerator()
    strategy.parallel_devices = [torch.device("cpu")]
    strategy._writes = dist.new_group(backend="gloo")
    return strategy


def save(strategy: ShardedStrategy, model: torch.nn.Module, path, step: int) -> None:
    """What Trainer.save_checkpoint hands the strategy: the model's shards and the rest."""
    strategy.save_checkpoint({"state_dict": get_model_state_dict(model), "global_step": step}, path)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.full_tensor().clone() for name, value in model.state_dict().items()}


def assert_holds(path, expected: dict[str, torch.Tensor], step: int) -> None:
    checkpoint = merge(path)
    assert checkpoint["global_step"] == step
    for name, value in expected.items():
        torch.testing.assert_close(checkpoint["state_dict"][name], value, rtol=0, atol=0)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_rewrite_that_fails_part_way_leaves_the_previous_checkpoint_loadable(async_save, model, tmp_path,
                                                                               monkeypatch):
    sharded, path = strategy(async_save), tmp_path / "last.ckpt"
    save(sharded, model, path, step=1)
    sharded.wait_for_save()
    before = weights(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)

    def killed(*args, **kwargs):  # every shard is on disk, DCP's .metadata is not: as a kill before the last gather
        raise OSError("No space left on device")

    monkeypatch.setattr(FileSystemWriter, "finish", killed)
    with pytest.raises(CheckpointWriteError, match=f"{path}: checkpoint not written .*No space left on device.*"
                                                   "the previous one is intact"):
        save(sharded, model, path, step=2)
        sharded.wait_for_save()  # async: the write's error comes here (or at the next save, or teardown)
    assert_holds(path, before, step=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no .partial or .old left


def test_an_async_save_returns_before_the_write_with_the_weights_of_its_call(model, tmp_path, monkeypatch):
    sharded, path = strategy(async_save=True), tmp_path / "last.ckpt"
    release, write_data = threading.Event(), FileSystemWriter.write_data

    def slow(self, *args, **kwargs):
        assert release.wait(60)
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", slow)
    saved = weights(model)
    save(sharded, model, path, step=1)
    assert not path.exists() and (tmp_path / "last.ckpt.partial" / "meta.pt").is_file()  # training goes on
    with torch.no_grad():
        model[0].weight.add_(1.0)  # the next optimizer step
    release.set()
    sharded.wait_for_save()
    assert_holds(path, saved, step=1)  # a copy of the shards taken at the save, not the weights at the write
    save(sharded, model, path, step=2)  # the rewrite replaces the folder whole
    sharded.teardown()  # the end of fit: the write in flight is finished and renamed
    assert_holds(path, weights(model), step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.parametrize("ending", [None, Preempted("SIGTERM: stopped and wrote last.ckpt"), ValueError("nan")])
def test_teardown_raises_a_failed_write_unless_another_error_ends_the_fit(ending, model, tmp_path, monkeypatch,
                                                                        caplog):
    sharded = strategy(async_save=True)
    monkeypatch.setattr(FileSystemWriter, "finish", lambda *args, **kwargs: (_ for _ in ()).throw(OSError("gone")))
    save(sharded, model, tmp_path / "last.ckpt", step=1)
    try:
        if ending is not None:
            raise ending
        with pytest.raises(CheckpointWriteError, match="last.ckpt: checkpoint not written"):
            sharded.teardown()  # the end of fit
    except Preempted:  # Lightning tears down in its except block; Preempted's "wrote last.ckpt" would lie
        with pytest.raises(CheckpointWriteError, match="last.ckpt: checkpoint not written"):
            sharded.teardown()
    except ValueError:
        sharded.teardown()  # the fit's own error is the one to report; the write's is logged
        assert "last.ckpt: checkpoint not written" in caplog.text
    assert not (tmp_path / "last.ckpt").exists() and not (tmp_path / "last.ckpt.partial").exists()


def test_replace_puts_a_folder_over_a_file_a_folder_or_nothing(tmp_path):
    for old in ("nothing", "file", "folder"):
        path, partial = tmp_path / f"{old}.ckpt", tmp_path / f"{old}.ckpt.partial"
        if old == "file":
            path.write_text("a full checkpoint")
        elif old == "folder":
            path.mkdir()
            (path / "meta.pt").write_text("old")
        partial.mkdir()
        (partial / "meta.pt").write_text("new")
        replace(partial, path)
        assert (path / "meta.pt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.ckpt", "folder.ckpt", "nothing.ckpt"]
