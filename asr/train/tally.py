"""ASRModule's updates without a host read: whether to skip one (``any_nonfinite``, ``skip_update``), and
their count (``UpdateTally``), kept on the device and read on the host only at logging steps (asr.intervals).

    interval  (loss sum, tokens) of the updates taken since the last read -> train/loss_step, per token
    epoch     (loss sum, tokens, per-token loss x utterances, utterances) of this epoch's updates taken ->
              the epoch line's train/loss (per token) and train/loss_epoch (the mean of the updates' per-token
              losses, each weighted by its utterances)
    skips     (updates skipped in all, in a row now, the update at which max_consecutive_skips in a row was
              reached, or -1)

The figures are global already: the losses come from the training step's sum over ranks, and a skip is decided
on every rank together. A skipped update adds nothing to the losses (its loss may be NaN).
"""

from __future__ import annotations

import math

import torch


class UpdateTally:
    """The three tensors above on ``device`` (float64), continuing ``skipped`` and ``in_a_row`` of a checkpoint;
    ``limit`` is model.max_consecutive_skips (0 = never reached)."""

    def __init__(self, device: torch.device, limit: int, skipped: int = 0, in_a_row: int = 0):
        self.limit = limit
        self.interval = torch.zeros(2, dtype=torch.float64, device=device)
        self.epoch = torch.zeros(4, dtype=torch.float64, device=device)
        self.skips = torch.tensor([skipped, in_a_row, -1.0], dtype=torch.float64).to(device)  # once, at the start

    def add(self, skip: torch.Tensor, loss: torch.Tensor, tokens: torch.Tensor, utterances: torch.Tensor,
            update: int) -> None:
        """Count update number ``update`` (0-based, trainer.global_step before it): its global loss sum, target
        tokens and utterances (0-d float64) and whether it was skipped (``skip``, 0-d bool). Device work only."""
        taken = skip.logical_not().double()
        loss = torch.where(skip, 0.0, loss)  # NaN x 0 is NaN: a skipped loss must not reach the sums
        self.interval += torch.stack([loss, tokens]) * taken
        self.epoch += torch.stack([loss, tokens, loss / tokens.clamp(min=1) * utterances, utterances]) * taken
        skipped, in_a_row, reached = self.skips.unbind()
        in_a_row = (in_a_row + 1) * skip
        if self.limit:
            reached = torch.where((in_a_row >= self.limit) & (reached < 0), float(update), reached)
        self.skips = torch.stack([skipped + skip, in_a_row, reached])

    def read_interval(self, *more: torch.Tensor) -> list[float]:
        """(loss sum, tokens) of the interval, then the skips, then ``more``, in one host read; a new interval
        begins."""
        values = torch.cat([self.interval, self.skips, *more]).tolist()
        self.interval.zero_()
        return values

    def read_epoch(self) -> list[float]:
        """The epoch's four figures, then the skips, in one host read; a new epoch begins."""
        values = torch.cat([self.epoch, self.skips]).tolist()
        self.epoch.zero_()
        return values


def any_nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """True (a 0-d bool tensor, on the tensors' device) when any element of ``tensors`` is NaN or +-Inf: then its
    tensor's largest magnitude is too. Multi-tensor kernels (``torch._foreach_norm``, the inf-norm), not one per
    tensor, then one check of them all; no host read. A finite element never counts, however large."""
    return torch.stack(torch._foreach_norm(tensors, math.inf)).isfinite().all().logical_not()


def skip_update(optimizer: torch.optim.Optimizer, skip: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    """Make the coming ``optimizer.step()`` leave weights and state as they are if ``skip`` (0-d bool, on the
    device). A fused optimizer (torch's Adam, AdamW or SGD with fused=True, as every recipe sets) takes it as its
    found_inf and skips on the device; any other takes no found_inf, so it is read on the host (one sync a step)
    and the gradients are dropped. Under 16-mixed the GradScaler hands a fused optimizer its own found_inf."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = skip.float()
    elif skip.item():
        for p in params:
            p.grad = None
