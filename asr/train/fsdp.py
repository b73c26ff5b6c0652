"""FSDP2 for ASRModule under Lightning's ModelParallelStrategy (configs/strategy/fsdp.yaml).

- ``shard``: ``fully_shard`` on each encoder block, then on the whole model, with the mixed-precision policy
  of the run's precision (``policy``): under bf16-mixed (16-mixed) the all-gathered parameters are bf16 (fp16),
  so the gathers move half the bytes and the matmuls need no cast, while the sharded master weights, the
  optimizer state and the gradient reduce-scatter stay fp32. fp32 reduction is torchtitan's and NeMo's default:
  a bf16 sum over 32 ranks keeps 8 bits of mantissa, and would save a quarter of the bytes a step moves
  (two gathers of bf16 parameters, forward and backward, 2 + 2 bytes a parameter, and the scatter's 4).
- ``gradient_sync``: Lightning pauses the gradient all-reduce on accumulation micro-batches for DDP only;
  ASRModule calls this before each batch, so FSDP2 keeps the micro-batches' unsharded gradients and
  reduce-scatters once, on the batch that steps.
- ``sharded_fp16``: Lightning's ModelParallelStrategy refuses ``16-mixed`` (fp16, for GPUs without bf16:
  V100, T4); asr.fit.Trainer gives it Lightning's MixedPrecision plugin with torch's ShardedGradScaler,
  whose found-inf is all-reduced over the ranks, so that every rank skips an overflowing step together.
- ``ShardedStrategy`` (configs/strategy/fsdp.yaml): ModelParallelStrategy whose sharded checkpoints appear whole
  or not at all, written in a background thread while training goes on (see its docstring).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Literal

import torch
from lightning_fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning_fabric.utilities.load import _METADATA_FILENAME
from pytorch_lightning.plugins.precision import MixedPrecision
from pytorch_lightning.strategies import ModelParallelStrategy

from asr.train.resilience import CheckpointWriteError, Preempted

log = logging.getLogger(__name__)
PARTIAL, ASIDE = ".partial", ".old"  # suffixes of a checkpoint folder being written, and of the one it replaces

PARAM_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}  # the mixed precisions FSDP2 casts for


def policy(precision: str):
    """The MixedPrecisionPolicy of a Lightning precision: low-precision parameters for compute, fp32 reduce;
    None for the others (32-true; bf16-true's parameters are bf16 already)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = PARAM_DTYPES.get(str(precision))
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else None


def shard(model: torch.nn.Module, units, mesh, precision: str) -> None:
    """fully_shard each of ``units`` (the encoder's blocks), then ``model``, on ``mesh`` with ``policy``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = policy(precision) or MixedPrecisionPolicy()
    model.to(memory_format=torch.contiguous_format)  # FSDP2 refuses channels-last (the subsampling's)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)


def gradient_sync(model: torch.nn.Module, on: bool) -> None:
    """Reduce-scatter gradients in this backward (``on``), or keep accumulating them unsharded; no-op
    for a model FSDP2 did not shard."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(on)


def sharded_fp16(precision, strategy, plugins):
    """(precision, plugins) for Lightning's Trainer: ``16-mixed`` under ModelParallelStrategy becomes
    MixedPrecision with a ShardedGradScaler (Lightning refuses the flag there); else as given."""
    if str(precision) != "16-mixed" or not isinstance(strategy, ModelParallelStrategy):
        return precision, plugins
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    plugins = [plugins] if plugins is not None and not isinstance(plugins, list) else list(plugins or [])
    return None, [*plugins, MixedPrecision("16-mixed", "cuda", scaler=ShardedGradScaler(device="cuda"))]


class ShardedStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy, whose sharded checkpoints (``save_distributed_checkpoint: true``: each rank
    writes its shard with torch.distributed.checkpoint into a folder named like the file) are never half-written,
    and are written while training goes on.

    Lightning rewrites a folder in place (``last.ckpt/`` every epoch): each rank truncates its shard files, rank 0
    then replaces DCP's ``.metadata`` and ``meta.pt``; a kill in between leaves new shards under old metadata.
    Here every rank writes into ``<name>.partial/``; when all shards and ``.metadata`` are on disk, rank 0 moves
    the old checkpoint to ``<name>.old``, renames the new one into place and deletes the old (``replace``).

    With ``async_save`` a save copies this rank's shard to CPU memory (torch.distributed.checkpoint.async_save)
    and returns; a thread writes it over a gloo group of its own, so its collectives never interleave with
    training's. Rank 0 renames the folder in that thread, once DCP's last gather says every rank has written.
    The next save, the end of fit and an error ending it (the exit after a preemption's checkpoint) wait for the
    write in flight, and a failed write raises CheckpointWriteError there, on every rank.
    """

    def __init__(self, data_parallel_size: Literal["auto"] | int = "auto",
                 tensor_parallel_size: Literal["auto"] | int = "auto",
                 save_distributed_checkpoint: bool = True, async_save: bool = True,
                 process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout):
        """
        Args:
            data_parallel_size: devices that replicate the parameters ("auto": the number of nodes).
            tensor_parallel_size: devices that shard them ("auto": the devices of one node).
            save_distributed_checkpoint: each rank writes its shard into a checkpoint folder; false: rank 0
                gathers the full state and writes one file, while every rank waits.
            async_save: write sharded checkpoints in a background thread; training waits only for the copy of
                its shard to CPU memory. False: every rank waits for the write.
            process_group_backend: "gloo" or "nccl" (default: the device's).
            timeout: how long a rank waits in a collective.
        """
        super().__init__(data_parallel_size, tensor_parallel_size, save_distributed_checkpoint,
                         process_group_backend, timeout)
        self.async_save = async_save
        self._writes = None  # the gloo process group of the background writes
        self._in_flight: Future | None = None  # done when the last save is written (and, on rank 0, renamed)

    def setup_environment(self) -> None:
        super().setup_environment()
        if self._writes is None:  # every rank, also with async_save off (asr.bench.checkpoints turns it on)
            self._writes = torch.distributed.new_group(backend="gloo", timeout=self._timeout)

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        self.agree_on_previous()
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        path = Path(self.broadcast(filepath))
        partial = path.with_name(path.name + PARTIAL)
        if self.is_global_zero:
            remove(partial)  # left by a writer killed mid-write
            partial.mkdir(parents=True)
        self.barrier()  # no rank writes into the folder before rank 0 made it anew
        state = {"state_dict": checkpoint.pop("state_dict"),
                 **{f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))}}
        if self.is_global_zero:
            torch.save(checkpoint, partial / _METADATA_FILENAME)  # what is left: loops, callbacks, hyper-parameters
        self._in_flight = renamed_when_written(self._write(state, partial), partial, path, self.is_global_zero)
        if not self.async_save:
            self.wait_for_save()

    def _write(self, state: dict, folder: Path) -> Future:
        """torch.distributed.checkpoint's write of ``state`` into ``folder``, as a future (done at once unless
        async_save)."""
        import torch.distributed.checkpoint as dcp

        if self.async_save:
            return dcp.async_save(state, checkpoint_id=folder, process_group=self._writes)
        written: Future = Future()
        try:
            written.set_result(dcp.save(state, checkpoint_id=folder))
        except BaseException as err:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            written.set_exception(err)
        return written

    def wait_for_save(self) -> None:
        """Return when the save in flight, if any, is written and (rank 0) renamed into place; raise its
        CheckpointWriteError if it failed. No collective: safe while another rank is failing."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def agree_on_previous(self) -> None:
        """wait_for_save on every rank; if it failed on any, every rank raises (rank 0 alone renames)."""
        try:
            self.wait_for_save()
            error = None
        except CheckpointWriteError as err:
            error = err
        failed = self.reduce(torch.tensor([float(error is not None)], device=self.root_device), reduce_op="sum")
        if failed.item():
            raise error or CheckpointWriteError("the previous checkpoint was not written on another rank (its log "
                                                "says why); the one before it is intact")

    def teardown(self) -> None:
        ending = sys.exc_info()[1]  # Lightning also tears down while an error ends the fit (in its except block)
        try:
            self.wait_for_save()
        except CheckpointWriteError as err:
            if ending is not None and not isinstance(ending, Preempted):
                log.error(str(err))  # the error that ends the fit is the one to report
            else:
                raise
        finally:
            super().teardown()


def renamed_when_written(written: Future, partial: Path, path: Path, rename: bool) -> Future:
    """A future done when ``written`` is and then, where ``rename`` (rank 0), ``partial`` has replaced ``path``.
    If the write failed it holds a CheckpointWriteError naming ``path``, and ``partial`` is deleted."""
    done: Future = Future()

    def finish(_: Future) -> None:
        try:
            written.result()
            if rename:
                replace(partial, path)
            done.set_result(path)
        except BaseException as err:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if rename:
                remove(partial)
            error = CheckpointWriteError(f"{path}: checkpoint not written ({why(err)}); the previous one is intact")
            error.__cause__ = err
            done.set_exception(error)

    written.add_done_callback(finish)  # in the writer's thread, or here if it is done
    return done


def why(error: BaseException) -> str:
    """One line for a failed write: DCP's CheckpointException carries each failed rank's error and traceback."""
    failures = getattr(error, "failures", None)
    if failures:
        rank, (error, _) = next(iter(failures.items()))
        return f"rank {rank}: {type(error).__name__}: {' '.join(str(error).split())[:160]}"
    return f"{type(error).__name__}: {' '.join(str(error).split())[:160]}"


def replace(partial: Path, path: Path) -> None:
    """Rename the complete folder ``partial`` to ``path``. An old ``path`` (a folder, or a file) is renamed to
    ``<path>.old`` first and deleted last: a kill between the two renames leaves both, whole, beside it."""
    aside = path.with_name(path.name + ASIDE)
    remove(aside)
    if os.path.lexists(path):
        os.replace(path, aside)
    os.replace(partial, path)
    remove(aside)


def remove(path: Path) -> None:
    """Delete the folder or file ``path``, if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
