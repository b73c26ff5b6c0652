"""asr.convert (asr/tools/converting.py): a sharded checkpoint folder becomes one .ckpt with the same weights,
the same metadata and optimizer state that a plain torch optimizer loads; anything else is refused
and nothing is written.

The folder here is written in one process exactly as Lightning's ModelParallelStrategy writes it with
``save_distributed_checkpoint: true`` (torch.distributed.checkpoint shards of the weights and of the
optimizer state keyed by parameter name, plus meta.pt). tests/e2e/test_scale_out.py converts the folder of
a real 2-process FSDP run and resumes from the result.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from asr.checkpoint import METADATA
from asr.tools.converting import convert, main


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model and its AdamW after two steps, so the optimizer has moments to carry."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def sharded_folder(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """``path`` as ModelParallelStrategy.save_checkpoint writes it: DCP shards, then meta.pt."""
    state = {"state_dict": model.state_dict(), "optimizer_0": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, no group
        dcp.save(state, checkpoint_id=path)
    torch.save({"epoch": 3, "global_step": 2, "hyper_parameters": {"d_model": 8}}, path / METADATA)
    return path


def test_the_merged_file_holds_the_weights_metadata_and_an_optimizer_state_torch_loads(tmp_path):
    model, optimizer = trained()
    merged = convert(sharded_folder(tmp_path / "last.ckpt", model, optimizer), tmp_path / "full.ckpt")
    checkpoint = torch.load(merged, weights_only=True)
    assert (checkpoint["epoch"], checkpoint["global_step"], checkpoint["hyper_parameters"]) == (3, 2, {"d_model": 8})
    assert checkpoint["state_dict"].keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(checkpoint["state_dict"][name], value, rtol=0, atol=0)
    fresh = torch.optim.AdamW(trained(seed=1)[0].parameters(), lr=0.01)
    fresh.load_state_dict(checkpoint["optimizer_states"][0])  # keyed by index, as Optimizer wants
    for ours, theirs in zip(fresh.state.values(), optimizer.state.values()):
        torch.testing.assert_close(ours["exp_avg"], theirs["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(ours["exp_avg_sq"], theirs["exp_avg_sq"], rtol=0, atol=0)


def test_a_folder_that_is_not_a_sharded_checkpoint_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys):
    folder = tmp_path / "plain"
    folder.mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([str(folder), str(tmp_path / "out.ckpt")])
    message = f"python -m asr.convert: error: {folder} is not a sharded checkpoint folder: it has no meta.pt"
    assert exit_.value.code == message  # sys.exit(message): printed on stderr, exit status 1
    torch.save({"epoch": 0}, folder / METADATA)  # metadata but no shards: an interrupted save
    with pytest.raises(ValueError, match=f"{folder}: its shards cannot be read"):
        convert(folder, tmp_path / "out.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # no output, no temporary file


def test_the_documented_command_says_what_it_wrote(tmp_path, capsys):
    folder = sharded_folder(tmp_path / "last.ckpt", *trained())
    main([str(folder), str(tmp_path / "last-full.ckpt")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'last-full.ckpt'}\n"
    assert torch.load(tmp_path / "last-full.ckpt", weights_only=True)["optimizer_states"][0]["state"]
