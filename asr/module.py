"""ASRModule: the LightningModule around asr.model.CTCModel.

Train, validation and test share ``_shared_step`` and log ``{stage}/loss``; validation
and test also log ``{stage}/wer`` and ``{stage}/cer``, computed with jiwer over the whole
set (error counts are summed over batches and ranks, not averaged per batch).
Checkpoints carry the tokenizer (``checkpoint["tokenizer"]``), so one file is enough
to transcribe: ``ASRModule.from_checkpoint(path)``.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.cli import OptimizerCallable

from asr.audio import FeatureConfig, SpecAugment
from asr.data import Batch
from asr.decoding import greedy
from asr.model import CTCModel, EncoderConfig
from asr.output import score
from asr.tokenizer import BLANK_ID, Tokenizer


class ASRModule(pl.LightningModule):
    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        sample_rate: int = 16000,
        features: Literal["auto", "mel", "linear"] = "auto",
        d_model: int = 144,
        n_heads: int = 4,
        n_layers: int = 4,
        ff_mult: int = 4,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        subsampling: int = 4,
        attention_window: int = 0,
        conv_channels: int = 0,
        block: str = "transformer",
        conv_kernel: int = 31,
        conv_norm: str = "layer",
        spec_augment: bool = True,
        freq_masks: int = 2,
        freq_width: int = 15,
        time_masks: int = 2,
        time_width: float = 0.05,
        checkpoint_every: int = 0,
        compile: bool = False,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        warmup_steps: int = 300,
        min_lr_ratio: float = 0.05,
    ):
        """
        Args:
            tokenizer: linked from data.tokenizer; its vocab_size sets the CTC head's width.
            sample_rate: Hz, linked from data.sample_rate; picks the feature preset.
            features: "auto" (8 kHz: 81-bin linear, 16 kHz: 80 log-mel), or force "mel" / "linear".
            d_model: Transformer width.
            n_heads: attention heads; must divide d_model.
            n_layers: Transformer blocks.
            ff_mult: feed-forward width as a multiple of d_model.
            dropout: dropout on each block's residual branches and inside its feed-forward.
            attention_dropout: dropout on the attention weights (0 keeps the fused attention kernel).
            subsampling: feature frames per encoder frame, 4 or 8.
            attention_window: > 0 limits attention to this many encoder frames either side; 0 = global.
            conv_channels: channels of the subsampling convolutions; 0 = d_model.
            block: encoder block type, "transformer" or "conformer" (asr.blocks).
            conv_kernel: conformer only: depthwise convolution width in encoder frames, odd.
            conv_norm: conformer only: norm after the depthwise convolution, "layer" or "batch" (padding-masked).
            spec_augment: frequency and time masking (SpecAugment) during training.
            freq_masks: SpecAugment frequency masks per utterance.
            freq_width: widest frequency mask, in feature bins.
            time_masks: SpecAugment time masks per utterance.
            time_width: widest time mask, as a fraction of the batch's frames.
            checkpoint_every: activation checkpointing of every k-th block (1 = all); 0 = off.
            compile: torch.compile each encoder block (after FSDP sharding, if any).
            optimizer: the optimizer class and its arguments (AdamW by default).
            warmup_steps: optimizer steps of linear warm-up from 0 to the optimizer's lr.
            min_lr_ratio: after warm-up the lr follows a cosine down to lr * min_lr_ratio at the last step.
        """
        super().__init__()
        if tokenizer is None:
            raise ValueError("ASRModule needs a tokenizer: fit.py links it from data.tokenizer")
        self.save_hyperparameters(ignore=["tokenizer", "optimizer"])
        self.tokenizer, self.optimizer_factory = tokenizer, optimizer
        feature_config = FeatureConfig.preset(sample_rate, features)
        encoder = EncoderConfig(
            vocab_size=tokenizer.vocab_size, n_feats=feature_config.n_feats, d_model=d_model, n_heads=n_heads,
            n_layers=n_layers, ff_mult=ff_mult, dropout=dropout, attention_dropout=attention_dropout,
            subsampling=subsampling, attention_window=attention_window, conv_channels=conv_channels,
            block=block, conv_kernel=conv_kernel, conv_norm=conv_norm,
        )
        augment = SpecAugment(freq_masks, freq_width, time_masks, time_width) if spec_augment else None
        self.model = CTCModel(feature_config, encoder, augment, checkpoint_every)
        self.errors: dict[str, torch.Tensor] = {}
        self.train_loss: torch.Tensor | None = None  # (sum of batch losses, batches) this epoch, on device

    @classmethod
    def from_checkpoint(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "ASRModule":
        """Rebuild from one checkpoint file, without executing pickled code (weights_only load)."""
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
        if "tokenizer" not in checkpoint:
            raise ValueError(f"{path} has no tokenizer inside: it was not written by asr.fit")
        accepted = inspect.signature(cls.__init__).parameters  # LightningCLI adds keys of its own
        hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if k in accepted}
        module = cls(tokenizer=Tokenizer(checkpoint["tokenizer"]), **hparams)
        module.load_state_dict(checkpoint["state_dict"])
        return module.eval()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizer"] = self.tokenizer.serialized

    def configure_model(self) -> None:
        """FSDP2 under ModelParallelStrategy: shard each encoder block, then the rest; then compile.

        Lightning's device mesh is (data_parallel, tensor_parallel) = (nodes, devices per node)
        with sizes "auto". fully_shard on this 2-D mesh replicates across its first dimension and
        shards across its second (HSDP): parameters are gathered over the fast links inside a
        node, and only gradients cross nodes. On one node that is plain FSDP.
        """
        if getattr(self, "_configured", False):  # Lightning calls this again for test after fit
            return
        self._configured = True
        if self.device_mesh is not None:
            from torch.distributed.fsdp import fully_shard

            self.model.subsampling.conv.to(memory_format=torch.contiguous_format)  # FSDP2 refuses channels-last
            for block in self.model.blocks:
                fully_shard(block, mesh=self.device_mesh)
            fully_shard(self.model, mesh=self.device_mesh)
        if self.hparams.compile:
            for block in self.model.blocks:
                block.compile()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip with torch's own functions, which also handle FSDP2's sharded (DTensor) gradients."""
        if not gradient_clip_val:
            return
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(self.parameters(), gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(audio, lengths)

    def transcribe_batch(self, audio: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        log_probs, out_lengths = self.model(audio, lengths)
        return [self.tokenizer.decode(ids) for ids in greedy(log_probs, out_lengths)]

    def _shared_step(self, batch: Batch, stage: str) -> torch.Tensor:
        log_probs, lengths = self.model(batch.audio, batch.audio_lengths)  # (B, T', V) fp32
        loss = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lengths)
        if stage == "train" and self.trainer.world_size > 1:
            loss = loss * self.global_token_scale(batch.token_lengths)
        # sync_dist: under DDP/FSDP the logged loss is the global batch's, not rank 0's share
        self.log(f"{stage}/loss", loss, batch_size=len(batch.texts), prog_bar=True, on_epoch=True, sync_dist=True)
        if stage != "train":
            hypotheses = [self.tokenizer.decode(ids) for ids in greedy(log_probs, lengths)]
            self.errors[stage] = self.errors.get(stage, 0) + error_counts(batch.texts, hypotheses).to(self.device)
        return loss

    def global_token_scale(self, token_lengths: torch.Tensor) -> torch.Tensor:
        """world_size * local tokens / global tokens: with it, the ranks' averaged gradients equal
        the gradient of the global batch's per-token loss, as one process would compute it."""
        local = token_lengths.sum().to(self.device, torch.float32)
        total = self.trainer.strategy.reduce(local.clone(), reduce_op="sum")
        return self.trainer.world_size * local / total

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, "train")
        totals = torch.stack([loss.detach().float(), torch.ones_like(loss, dtype=torch.float32)])
        self.train_loss = totals if self.train_loss is None else self.train_loss + totals
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def _log_error_rates(self, stage: str) -> None:
        counts = self.errors.pop(stage, torch.zeros(4, dtype=torch.float64, device=self.device))
        word_errors, words, char_errors, chars = self.trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        self.log(f"{stage}/wer", word_errors / max(words, 1), prog_bar=True)
        self.log(f"{stage}/cer", char_errors / max(chars, 1), prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._log_error_rates("val")

    def on_test_epoch_end(self) -> None:
        self._log_error_rates("test")

    def on_train_epoch_end(self) -> None:
        """One line per epoch: mean train loss and the validation figures just computed."""
        totals = self.train_loss if self.train_loss is not None else torch.zeros(2, device=self.device)
        total, batches = self.trainer.strategy.reduce(totals, reduce_op="sum").tolist()
        self.train_loss = None
        metrics = self.trainer.callback_metrics
        line = f"epoch {self.current_epoch}: train/loss {total / max(batches, 1):.4f}"
        for name in ("val/loss", "val/wer", "val/cer"):
            if name in metrics:
                line += f"  {name} {float(metrics[name]):.4f}"
        self.print(line)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        total = max(1, self.trainer.estimated_stepping_batches)
        schedule = WarmupCosine(self.hparams.warmup_steps, total, self.hparams.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor):
    """CTC loss in fp32, summed over the batch and divided by its target tokens (a per-token mean)."""
    loss = F.ctc_loss(
        log_probs.float().transpose(0, 1), tokens, lengths, token_lengths, blank=BLANK_ID, reduction="sum"
    )
    return loss / token_lengths.sum().clamp(min=1)


def error_counts(references: list[str], hypotheses: list[str]) -> torch.Tensor:
    """[word errors, reference words, char errors, reference chars] for a batch (asr.output.score, jiwer)."""
    counts = score(references, hypotheses)
    words, chars = counts["words"], counts["chars"]
    return torch.tensor([words["substitutions"] + words["deletions"] + words["insertions"], words["n"],
                         chars["substitutions"] + chars["deletions"] + chars["insertions"], chars["n"]],
                        dtype=torch.float64)


class WarmupCosine:
    """lr multiplier: linear from 0 to 1 over ``warmup`` steps, then cosine down to ``floor`` at ``total``."""

    def __init__(self, warmup: int, total: int, floor: float):
        self.warmup, self.total, self.floor = warmup, total, floor

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))
