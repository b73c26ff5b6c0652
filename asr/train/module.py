"""ASRModule: the LightningModule around the network of its objective (``--model.objective``, asr.models.objectives:
CTC's asr.models.ctc.CTCModel by default); the loss, and how validation decodes, are the objective's.

Train, validation and test share ``_shared_step`` and log ``{stage}/loss``; validation
and test also log ``{stage}/wer`` and ``{stage}/cer``, computed with jiwer over the whole
set (error counts are summed over batches and ranks, not averaged per batch).

Collectives: every cross-rank sum is explicit, in a hook that every rank runs at the same point,
and nothing is logged with ``sync_dist``: Lightning computes synced epoch metrics lazily, on rank 0
as early as its progress bar asks for them, which deadlocks against any collective the other ranks
are in. Logged values are already global when logged. A training step reads nothing on the host
(asr.intervals): its two sums over ranks (the global batch's loss and tokens, whether any rank's
update is non-finite) are queued on the device, and what the host logs and checks is counted on the
device (asr.train.tally) and read at logging steps. A run bounded by ``--trainer.max_time`` anneals its
lr (WarmupCosine) by the Timer's clock: one process's at every step; with several ranks, the ranks'
mean, agreed on at each logging step and followed until the next, so that every rank has one lr.

A non-finite loss or gradient skips that update on every rank together; ``train/skipped_steps``
counts them and ``max_consecutive_skips`` in a row stop the run (``NonFiniteLossError``) at the next
logging step or epoch end.
Checkpoints carry the tokenizer (``checkpoint["tokenizer"]``), so one file is enough
to transcribe: ``ASRModule.from_checkpoint(path)``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import typing
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Timer
from pytorch_lightning.cli import OptimizerCallable
from pytorch_lightning.utilities import rank_zero_warn

from asr.checkpoint import merge
from asr.data.batch import Batch
from asr.intervals import all_sum, host_step
from asr.models.config import EncoderConfig
from asr.models.features import FeatureConfig
from asr.models.objectives import build_objective
from asr.models.specaugment import SpecAugment, SpecAugmentConfig
from asr.models.transducer import TransducerConfig
from asr.scoring import score
from asr.settings import plain_settings
from asr.tokenizer import Tokenizer
from asr.train import fsdp
from asr.train.finetune import FineTune, frozen
from asr.train.legacy import as_setting, current_names, group_settings
from asr.train.schedule import ScheduleConfig, WarmupCosine
from asr.train.tally import UpdateTally, any_nonfinite, skip_update

# what _shared_step counts per evaluation batch, summed over batches and then over ranks
EVAL_COUNTS = ("word_errors", "words", "char_errors", "chars", "loss_sum", "tokens")
# The default optimizer, as LightningCLI reads one (--model.optimizer.init_args.lr 0.002 changes one argument): AdamW
# at its own lr, 0.001, better than 0.002 for every seed (docs/benchmarks.md, 2026-11-24 mid-morning); fused: one
# kernel steps all parameters.
ADAMW = {"class_path": "torch.optim.AdamW", "init_args": {"fused": True}}
OBJECTIVE_SETTINGS = ("inter_ctc", "transducer")  # ASRModule's settings handed to the objective whose constructor names them


class ASRModule(pl.LightningModule):
    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        features: FeatureConfig = FeatureConfig(),
        encoder: EncoderConfig = EncoderConfig(),
        spec_augment: SpecAugmentConfig | None = SpecAugmentConfig(),
        objective: str = "ctc",
        inter_ctc: float = 0.3,  # seeds 0 / 1, dev CER 0.115 / 0.139 with it, 0.132 / 0.154 without; unheard voices too
        transducer: TransducerConfig = TransducerConfig(),
        checkpoint_every: int = 0,
        compile: bool = False,
        optimizer: OptimizerCallable = ADAMW,
        schedule: ScheduleConfig = ScheduleConfig(),
        max_consecutive_skips: int = 10,
        init_from: str | None = None,
        finetune: FineTune = FineTune(),
    ):
        """
        Args:
            tokenizer: linked from data.tokenizer; its vocab_size sets the output layers' width.
            features: the feature front end (asr.models.features.FeatureConfig); its sample_rate is linked from data.sample_rate.
            encoder: the encoder's shapes (asr.models.config.EncoderConfig).
            spec_augment: SpecAugment in training (asr.models.specaugment.SpecAugmentConfig); null turns it off.
            objective: what training minimises and inference decodes (asr.models.objectives): ctc, transducer (RNN-T),
                hybrid (the transducer and a CTC head; asr.models.transducer_objectives), or a class path
                package.module:Class; it is handed the settings below that its constructor names (ctc: inter_ctc;
                the others: transducer and inter_ctc).
            inter_ctc: weight w of intermediate CTC (Lee and Watanabe 2021): training minimises (1 - w) x the
                objective's loss + w x the CTC loss of the middle block's output through a CTC head (CTC's, the
                hybrid's, or one of the transducer's own); 0 = off. Inference is unchanged; train/loss logs the final
                output's loss alone.
            transducer: (transducer, hybrid) the prediction network's and joiner's shapes, the hybrid's CTC weight,
                and decoding's bounds (asr.models.transducer.TransducerConfig).
            checkpoint_every: activation checkpointing of every k-th block (1 = all); 0 = off.
            compile: torch.compile each encoder block (after FSDP sharding, if any).
            optimizer: the optimizer class and its arguments (by default AdamW at its own lr, fused: ADAMW).
            schedule: the learning rate's warm-up and cosine (asr.train.schedule.ScheduleConfig).
            max_consecutive_skips: stop the run when this many updates in a row had a non-finite loss or
                gradient (each is skipped on every rank); 0 = never stop.
            init_from: start from this checkpoint's weights (an asr.fit .ckpt, an asr.average output, or a
                sharded checkpoint folder), with a new optimizer and schedule; asr.train.init_from says what it
                loaded. A resumed run (--ckpt_path) takes its weights from the checkpoint it resumes instead.
            finetune: which of init_from's weights to load, and which to hold still for the first steps
                (asr.train.finetune.FineTune).
        """
        super().__init__()
        if tokenizer is None:
            raise ValueError("ASRModule needs a tokenizer: asr.fit links it from data.tokenizer")
        self.save_hyperparameters(ignore=["tokenizer", "optimizer"])
        plain_settings(self)
        self.tokenizer, self.optimizer_factory, self.finetune = tokenizer, optimizer_callable(optimizer), finetune
        self.schedule_config = schedule
        self.objective = build_objective(objective, {"inter_ctc": inter_ctc, "transducer": transducer},
                                         objective_defaults())
        bin_hz = features.bin_hz() if spec_augment and spec_augment.warps else None  # only the warp needs it
        augment = SpecAugment(spec_augment, bin_hz) if spec_augment else None
        self.model = self.objective.network(features, encoder, tokenizer.vocab_size, augment, checkpoint_every)
        self.decoding = self.objective.decoding(self.model)  # what validation, and asr.inference, decode with
        if finetune.freeze_steps and not frozen(self, finetune.freeze):
            raise ValueError(f"model.finetune.freeze {', '.join(finetune.freeze)} matches no weight of this model "
                             "(its weights are named model.encoder.subsampling.*, model.encoder.blocks.<i>.*, ...)")
        self.errors: dict[str, torch.Tensor] = {}  # stage -> EVAL_COUNTS summed over this rank's batches
        self.step_totals: torch.Tensor | None = None  # (loss sum, tokens, utterances) of this update's global batch
        self.clock = 0.0  # this rank's seconds of training at this update (trainer.max_time's Timer)
        self.timer: Timer | None = None  # trainer.max_time's Timer, if the run is bounded by time
        self.tally: UpdateTally | None = None  # losses and skips on the device, from on_train_start
        self.skipped_steps, self.consecutive_skips = 0, 0  # as last read (or restored), for what is said and saved
        self.read_from = 0  # the first update since the last read of the tally
        self.validated_epoch = -1  # the epoch of the last validation while fitting: the per-epoch line's val/ figures

    @classmethod
    def from_checkpoint(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "ASRModule":
        """Rebuild from one checkpoint file, or a sharded checkpoint folder (asr.checkpoint.merge, on the CPU),
        without executing pickled code (weights_only load)."""
        if Path(path).is_dir():
            checkpoint = merge(path)
        else:
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
        if "tokenizer" not in checkpoint:
            raise ValueError(f"{path} has no tokenizer inside: it was not written by asr.fit")
        module = cls(tokenizer=Tokenizer(checkpoint["tokenizer"]), **cls.settings(checkpoint["hyper_parameters"]))
        module.load_state_dict(current_names(checkpoint["state_dict"]))
        return module.eval()

    @classmethod
    def settings(cls, hyper_parameters: dict) -> dict:
        """A checkpoint's hyper-parameters as this class's arguments (asr.train.legacy: also those of checkpoints
        written before the settings were grouped); keys LightningCLI added are dropped, and a setting the
        checkpoint lacks gets its default."""
        accepted, types = inspect.signature(cls.__init__).parameters, typing.get_type_hints(cls.__init__)
        grouped = group_settings(hyper_parameters)
        return {name: as_setting(types[name], grouped.get(name, p.default)) for name, p in accepted.items()
                if name not in ("self", "tokenizer", "optimizer")}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizer"] = self.tokenizer.serialized
        skips = (self.skipped_steps, self.consecutive_skips)
        if self.tally is not None:  # one host read: writing a checkpoint waits for the device anyway
            skips = tuple(int(x) for x in self.tally.skips[:2].tolist())
        checkpoint["skipped_steps"] = skips

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # (a sharded FSDP checkpoint restores its weights itself)
            checkpoint["state_dict"] = current_names(checkpoint["state_dict"])  # a run made before the encoder seam
        self.skipped_steps, self.consecutive_skips = checkpoint.get("skipped_steps", (0, 0))

    def configure_model(self) -> None:
        """FSDP2 under ModelParallelStrategy: shard each encoder block, then the rest (asr.train.fsdp, with the
        precision's mixed-precision policy); then compile.

        Lightning's device mesh is (data_parallel, tensor_parallel) = (nodes, devices per node)
        with sizes "auto". fully_shard on this 2-D mesh replicates across its first dimension and
        shards across its second (HSDP): parameters are gathered over the fast links inside a
        node, and only gradients cross nodes. On one node that is plain FSDP.
        """
        if getattr(self, "_configured", False):  # Lightning calls this again for test after fit
            return
        self._configured = True
        if self.device_mesh is not None:
            fsdp.shard(self.model, self.model.encoder.units(), self.device_mesh, self.trainer.precision)
        if self.hparams.compile:
            for unit in self.model.encoder.units():
                unit.compile()

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        """FSDP2 reduce-scatters gradients only on the micro-batch that steps (Lightning pauses DDP's alone)."""
        fsdp.gradient_sync(self.model, not self.trainer.fit_loop._should_accumulate())

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
        frames, out_lengths = self.model(audio, lengths)
        return [self.tokenizer.decode(ids) for ids in self.decoding.decode(frames, out_lengths)]

    def _reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks; every rank must call it at the same point (see the module docstring)."""
        return self.trainer.strategy.reduce(tensor, reduce_op="sum") if self.trainer.world_size > 1 else tensor

    def _shared_step(self, batch: Batch, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(summed loss to minimise, summed loss of the output, the batch's target tokens); they differ where the
        objective adds a loss of its own in training (inter_ctc, a hybrid's CTC head). Evaluation also counts word and
        char errors."""
        objective, loss_sum, frames, lengths = self.objective(self.model, batch, training=stage == "train")
        tokens = batch.token_lengths.sum().to(self.device, torch.float64)
        if stage != "train":
            hypotheses = [self.tokenizer.decode(ids) for ids in self.decoding.decode(frames, lengths)]
            counts = torch.cat([error_counts(batch.texts, hypotheses).to(self.device),
                                torch.stack([loss_sum.detach().double(), tokens])])
            self.errors[stage] = self.errors.get(stage, 0) + counts
        return objective, loss_sum, tokens

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """The loss to backpropagate: this rank's summed loss over the global batch's tokens, times the
        world size, so the ranks' averaged gradients equal the gradient of the global batch's per-token
        loss as one process would compute it. Accumulating micro-batches, the global batch is all of them: each
        backpropagates its summed loss times the world size, and ``on_before_optimizer_step`` divides the sum
        of their gradients by their tokens, all known by then (Lightning's mean over micro-batches of each one's
        per-token loss would weigh a token of a short micro-batch more than one of a long one)."""
        objective, loss_sum, tokens = self._shared_step(batch, "train")
        self.clock = self.timer.time_elapsed("train") if self.timer else 0.0
        utterances = tokens.new_full((1,), len(batch.texts))  # a fill on the device, not a copy from the host
        totals = all_sum(torch.cat([loss_sum.detach().double().view(1), tokens.view(1), utterances]), self.trainer)
        self.step_totals = totals if self.step_totals is None else self.step_totals + totals  # (accumulation)
        if self.trainer.accumulate_grad_batches > 1:
            return objective * self.trainer.world_size  # per token in on_before_optimizer_step
        return objective * (self.trainer.world_size / totals[1].clamp(min=1))

    def on_before_optimizer_step(self, optimizer) -> None:
        """When any rank's loss or gradient has a NaN or Inf, skip the update on every rank (``skip_update``:
        weights and optimizer moments stay); count the update (asr.train.tally) and, at a logging step, read the
        count (``read_interval``). In the first model.finetune.freeze_steps updates the gradients of
        model.finetune.freeze's weights are dropped first."""
        if self.global_step < self.finetune.freeze_steps:
            for p in frozen(self, self.finetune.freeze):
                p.grad = None  # held still: AdamW leaves a parameter without a gradient as it is
        elif self.global_step == self.finetune.freeze_steps > 0:
            self.print(f"step {self.global_step}: model.finetune.freeze's weights train from now on")
        params = [p for p in self.parameters() if p.grad is not None]
        (loss, tokens, utterances), self.step_totals = self.step_totals, None
        skip = loss.isfinite().logical_not()
        # 16-mixed: the GradScaler skips overflowing gradients and tunes its scale itself
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params]  # FSDP2 shards
        if grads and self.trainer.accumulate_grad_batches > 1:  # Lightning divided each micro-batch's loss by their count
            torch._foreach_mul_(grads, (self.trainer.accumulate_grad_batches / tokens.clamp(min=1)).float())
        if grads and getattr(self.trainer.precision_plugin, "scaler", None) is None:
            skip = skip | any_nonfinite(grads)
        skip = all_sum(skip.double().view(1), self.trainer)[0] > 0  # any rank's: all skip together
        skip_update(optimizer, skip, params)
        self.tally.add(skip, loss, tokens, utterances, self.global_step)
        if self.trainer.world_size == 1:
            self.schedule.elapsed = self.clock  # the lr after this step; with several ranks, see read_interval
        if host_step(self.trainer):
            self.read_interval()

    def read_interval(self) -> None:
        """A logging step's one host read (and, with several ranks and max_time, one collective): log the global
        per-token loss of the updates since the last read as train/loss_step and train/skipped_steps, say what
        was skipped, stop at max_consecutive_skips; with several ranks the lr follows their mean clock until the
        next. Logged as host tensors, which Lightning's per-batch read of progress-bar values does not wait for."""
        agree = self.timer is not None and self.trainer.world_size > 1
        clock = [all_sum(torch.full((1,), self.clock, dtype=torch.float64, device=self.device), self.trainer)] \
            if agree else []
        values = self.tally.read_interval(*clock)
        (loss, tokens), skips = values[:2], values[2:5]
        if agree:
            self.schedule.elapsed = values[5] / self.trainer.world_size
        if tokens:
            self.log("train/loss_step", torch.tensor(loss / tokens), prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/skipped_steps", torch.tensor(skips[0]), on_step=True, on_epoch=False)
        self.report_skips(self.global_step, *skips)

    def report_skips(self, update: int, skipped: float, in_a_row: float, reached: float) -> None:
        """Say how many updates were skipped since the last read, which was before update ``update``; raise
        NonFiniteLossError if ``reached`` (the update at which max_consecutive_skips in a row were skipped) >= 0."""
        new = int(skipped) - self.skipped_steps
        self.skipped_steps, self.consecutive_skips = int(skipped), int(in_a_row)
        span = f"step {update}" if self.read_from >= update else f"steps {self.read_from}-{update}"
        self.read_from = update + 1
        if new:
            self.print(f"{span}: non-finite loss or gradient, {'update' if new == 1 else f'{new} updates'} skipped "
                       f"on every rank ({self.consecutive_skips} in a row, {self.skipped_steps} in all)")
        if reached >= 0:
            raise NonFiniteLossError(
                f"{self.hparams.max_consecutive_skips} updates in a row had a non-finite loss or gradient (step "
                f"{int(reached)}); stopping. Look for bad audio or labels, lower the learning rate, or "
                "raise --model.max_consecutive_skips.")

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def _log_evaluation(self, stage: str) -> None:
        counts = self.errors.pop(stage, torch.zeros(len(EVAL_COUNTS), dtype=torch.float64, device=self.device))
        word_errors, words, char_errors, chars, loss, tokens = self._reduce(counts).tolist()
        self.log(f"{stage}/loss", loss / max(tokens, 1), prog_bar=True)  # per token over the whole set
        self.log(f"{stage}/wer", word_errors / max(words, 1), prog_bar=True)
        self.log(f"{stage}/cer", char_errors / max(chars, 1), prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")
        if not self.trainer.sanity_checking:
            self.validated_epoch = self.current_epoch

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def on_train_epoch_end(self) -> None:
        """One line per epoch: mean train loss and the validation figures computed in this epoch, if any; the
        skips since the last logging step are said (and max_consecutive_skips stops the run) here at the latest."""
        total, tokens, weighted, utterances, *skips = self.tally.read_epoch()  # global already: no collective
        if utterances:
            self.log("train/loss_epoch", torch.tensor(weighted / utterances), prog_bar=True, on_step=False,
                     on_epoch=True, batch_size=1)
        self.report_skips(self.global_step - 1, *skips)
        line = f"epoch {self.current_epoch}: train/loss {total / max(tokens, 1):.4f}"
        if self.validated_epoch == self.current_epoch:
            metrics = self.trainer.callback_metrics
            line += "".join(f"  {name} {float(metrics[name]):.4f}" for name in ("val/loss", "val/wer", "val/cer")
                            if name in metrics)
        else:
            line += "  (no validation in this epoch)"
            warn_if_validation_was_due(self.trainer)
        self.print(line)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        # The schedule's length is set in on_train_start: trainer.estimated_stepping_batches builds the
        # train loader, and built here, before a checkpoint is restored, it would start a resumed
        # epoch from its first batch instead of where the checkpoint left it.
        self.schedule = WarmupCosine.of(self.schedule_config)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self.schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_start(self) -> None:
        if self.finetune.freeze_steps > self.global_step:
            held = frozen(self, self.finetune.freeze)  # (FSDP2 keeps the names; its shards count locally)
            self.print(f"model.finetune: {len(held)} tensors ({sum(p.numel() for p in held):,} parameters) of "
                       f"{', '.join(self.finetune.freeze)} held still until step {self.finetune.freeze_steps}")
        total = self.trainer.estimated_stepping_batches  # -1 for an endless stream bounded by max_time alone
        self.schedule.total = max(1, total) if total > 0 else math.inf
        # --trainer.max_time: Lightning's Timer stops the run; the cosine reaches its floor by then too
        self.timer = next((c for c in self.trainer.callbacks if isinstance(c, Timer) and c.time_remaining()), None)
        self.schedule.duration = self.timer.time_elapsed() + self.timer.time_remaining() if self.timer else None
        self.tally = UpdateTally(self.device, self.hparams.max_consecutive_skips, self.skipped_steps,
                                 self.consecutive_skips)
        self.read_from = self.global_step


def optimizer_callable(optimizer: OptimizerCallable | dict) -> OptimizerCallable:
    """``optimizer``, or a class_path/init_args dict (ADAMW, the default, where ASRModule is built in Python: LightningCLI
    hands it the callable) as the callable it names."""
    if not isinstance(optimizer, dict):
        return optimizer
    module, name = optimizer["class_path"].rsplit(".", 1)
    return partial(getattr(importlib.import_module(module), name), **optimizer.get("init_args", {}))


def objective_defaults() -> dict:
    """ASRModule's settings that objectives read, at their defaults (asr.models.objectives.build_objective)."""
    parameters = inspect.signature(ASRModule.__init__).parameters
    return {name: parameters[name].default for name in OBJECTIVE_SETTINGS}


def error_counts(references: list[str], hypotheses: list[str]) -> torch.Tensor:
    """[word errors, reference words, char errors, reference chars] for a batch (asr.scoring.score, jiwer)."""
    counts = score(references, hypotheses)
    words, chars = counts["words"], counts["chars"]
    return torch.tensor([words["substitutions"] + words["deletions"] + words["insertions"], words["n"],
                         chars["substitutions"] + chars["deletions"] + chars["insertions"], chars["n"]],
                        dtype=torch.float64)


def warn_if_validation_was_due(trainer: pl.Trainer) -> None:
    """Say loudly that a whole epoch ended without the validation its settings asked for."""
    every = trainer.check_val_every_n_epoch
    stopping = trainer.should_stop or 0 <= trainer.max_steps <= trainer.global_step
    if trainer.enable_validation and every and (trainer.current_epoch + 1) % every == 0 and not stopping:
        rank_zero_warn(
            f"validation was due after epoch {trainer.current_epoch} but did not run: Lightning validates at "
            f"training batch {trainer.val_check_batch} of each epoch (val_check_interval; the train loader announced "
            f"{trainer.num_training_batches}) and this epoch ended after {trainer.fit_loop.epoch_loop.batch_idx + 1}; "
            "val/ metrics and checkpoint selection still hold an older epoch's figures"
        )


class NonFiniteLossError(RuntimeError):
    """Too many consecutive updates had a non-finite loss or gradient (ASRModule.max_consecutive_skips)."""
