"""Host syncs of training steps, counted on a CPU: ``--trainer.callbacks+={"class_path": "tests.syncs.SyncCounter"}``.

On a GPU, reading a device tensor on the host (``.item()``, ``.tolist()``, ``bool``/``int``/``float`` of a tensor,
``if tensor:``, ``.cpu()``, an output shape that depends on values such as a boolean mask's) waits for every kernel
queued before it, and so does a blocking collective. On a CPU nothing waits, so ``SyncCounter`` counts the calls
that would: while a training batch runs (Lightning's ``advance`` and ``on_advance_end``, validation left out) it
patches those Tensor methods and torch.distributed's collectives and records each call made by asr's or
Lightning's code, by optimizer step. Left out, as on the host by design: calls made inside torch (the optimizer's
step counts are host tensors; a collective's own reads are counted as that collective) and those under the
DataLoader (batches are built on the host). ``host_names``: metrics the run logs from host tensors, whose
per-batch read by Lightning's logger connector (it converts progress-bar values every batch) is no sync either.
On a GPU, ``cuda=True`` also records the syncs CUDA's debug mode sees (``torch.cuda.set_sync_debug_mode``), as
"cuda sync", and the calls of asr's CTC loss, whose syncs are torch's own (it plans on the host).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pytorch_lightning as pl
import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
SHAPED_BY_VALUES = ("nonzero", "masked_select", "unique", "argwhere")  # their output's size is read on the host
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "broadcast_object_list", "reduce_scatter_tensor", "reduce", "gather", "scatter", "barrier")
TORCH = str(Path(torch.__file__).parent)
TENSOR_PY = str(Path(torch.__file__).parent / "_tensor.py")  # Tensor's own Python methods (__format__ -> item)
DATA = str(Path(torch.__file__).parent / "utils" / "data")


def site(frame) -> str | None:
    """"file:line function" of the call at ``frame``, or None when it is exempt (see the module docstring)."""
    while frame is not None and frame.f_code.co_filename == TENSOR_PY:
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(TORCH):
        return None
    caller = frame
    while frame is not None:
        if frame.f_code.co_filename.startswith(DATA):
            return None
        frame = frame.f_back
    return f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} {caller.f_code.co_name}"


class SyncCounter(pl.Callback):
    """Counts would-be host syncs per optimizer step (see the module docstring); ``steps`` maps a step (1 = the
    first update of the run) to its ``(what, where)`` calls, ``logging`` holds the steps Lightning logged at.
    With ``path``, each rank also writes them there as JSON (``<path>.<rank>``) when training ends."""

    def __init__(self, path: str | None = None, host_names: list[str] = ("train/loss_step",), cuda: bool = False):
        self.path, self.host_names, self.cuda = path, tuple(host_names), cuda
        self.steps: dict[int, list[tuple[str, str]]] = defaultdict(list)
        self.logging: set[int] = set()
        self._on, self._patched, self._step = False, [], 0

    def _record(self, what: str, frame) -> None:
        if not self._on:
            return
        where = site(frame)
        if where is None or (what == "item" and self._host_metric(frame)):
            return
        self.steps[self._step].append((what, where))

    def _host_metric(self, frame) -> bool:
        """A progress-bar value Lightning converts in _ResultCollection.metrics, of a metric logged from the host."""
        while frame is not None and frame.f_code.co_name != "metrics":
            frame = frame.f_back
        return frame is not None and frame.f_locals.get("forked_name") in self.host_names

    def _patch(self, owner, name: str, what: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        counter = self

        def counted(*args, **kwargs):
            if name == "__getitem__" and not boolean_index(args[1]):
                return original(*args, **kwargs)
            counter._record(what, sys._getframe(1))
            return original(*args, **kwargs)

        self._patched.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, counted)

    def _wrap(self, loop, name: str, counting: bool) -> None:
        original = getattr(loop, name)

        def wrapped(*args, **kwargs):
            before, self._on = self._on, counting
            if not self.cuda:
                try:
                    return original(*args, **kwargs)
                finally:
                    self._on = before
            mode = torch.cuda.get_sync_debug_mode()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn" if counting else "default")
                try:
                    return original(*args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode(mode)
                    self._on = before
                    self.steps[self._step] += [("cuda sync", f"{Path(w.filename).name}:{w.lineno}") for w in seen
                                               if counting and "synchronizing" in str(w.message)]

        self._patched.append((loop, name, vars(loop).get(name)))
        setattr(loop, name, wrapped)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name in READS:
            self._patch(torch.Tensor, name, name)
        for name in SHAPED_BY_VALUES:
            self._patch(torch.Tensor, name, name)
            self._patch(torch, name, name)
        self._patch(torch.Tensor, "__getitem__", "boolean mask")
        if self.cuda:
            from asr.models import objectives

            self._patch(objectives, "ctc_loss", "ctc_loss")
        for name in COLLECTIVES:
            self._patch(torch.distributed, name, name)
        loop = trainer.fit_loop.epoch_loop
        self._wrap(loop, "advance", True)
        self._wrap(loop, "on_advance_end", True)
        self._wrap(loop.val_loop, "run", False)
        original_advance = loop.advance

        def advance(*args, **kwargs):
            self._step = loop._batches_that_stepped + 1
            try:
                return original_advance(*args, **kwargs)
            finally:
                if trainer._logger_connector.should_update_logs:
                    self.logging.add(self._step)

        self._patched.append((loop, "advance", vars(loop).get("advance")))
        loop.advance = advance

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._on = False
        for owner, name, original in reversed(self._patched):
            if original is not None:
                setattr(owner, name, original)
            elif name in vars(owner):
                delattr(owner, name)  # an instance's wrapper: the class's method shows again
        self._patched = []
        if self.path:
            report = {"steps": {str(k): v for k, v in self.steps.items()}, "logging": sorted(self.logging)}
            Path(f"{self.path}.{trainer.global_rank}").write_text(json.dumps(report))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._patched:
            self.on_train_end(trainer, pl_module)


def boolean_index(index) -> bool:
    """Whether ``tensor[index]`` selects by a boolean mask (its output's shape depends on the mask's values)."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)
