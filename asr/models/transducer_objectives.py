"""The transducer objectives (``--model.objective transducer`` or ``hybrid``): RNN-T's loss on the joiner's lattice
(asr.models.transducer), and for the hybrid a CTC head on the same encoder beside it (NeMo's hybrid RNNT-CTC
models). Decoding is asr.models.transducer_decoding's, with the network's prediction network and joiner.

    transducer: loss = RNN-T loss (torchaudio.functional.rnnt_loss, fp32, blank asr.tokenizer.BLANK_ID)
    hybrid:     loss = (1 - w) x RNN-T loss + w x CTC loss, w = model.transducer.ctc_weight
    either, with model.inter_ctc = v > 0, in training: (1 - v) x that loss + v x intermediate CTC's

Intermediate CTC (asr.models.objectives.with_inter_ctc, as NeMo's hybrid models have it) puts the middle block's
output through a CTC head: the hybrid's own, or for the transducer one of its own that only training reads. It is
independent of the final objective: a regulariser of the lower blocks. All are sums over the batch, as CTC's
(ASRModule divides by the global batch's tokens); train/loss logs the transducer's alone.

The logits are computed in the autocast dtype (bf16 on a bf16-mixed run) and cast to fp32 for the loss, whose
gradient torchaudio computes in its forward (one fp32 lattice kept for the backward pass).
A transducer trains on any utterance of at least one encoder frame: it may emit several tokens on one frame. The
hybrid's CTC head needs CTC's frames (CTC.frames_needed). Intermediate CTC's loss of an utterance too short for CTC
is 0 (``zero_infinity``): the transducer's length rule admits it.
"""

from __future__ import annotations

import torch
import torchaudio.functional as AF
from torch import nn

from asr.models.features import FeatureConfig
from asr.models.config import EncoderConfig
from asr.models.objectives import (CTC, LabelledBatch, Loss, ctc_loss, inter_ctc_weight, with_inter_ctc,
                                   with_middle_block)
from asr.models.specaugment import SpecAugment
from asr.models.transducer import TransducerConfig, TransducerModel
from asr.models.transducer_decoding import TransducerDecoding
from asr.tokenizer import BLANK_ID


class Transducer:
    """RNN-T (Graves 2012): a prediction network over the tokens before, a joiner, torchaudio's rnnt_loss; in
    training with ``inter_ctc`` = v > 0, (1 - v) x that + v x intermediate CTC's loss (module docstring)."""

    ctc_head = False  # the hybrid's CTC head beside the joiner

    def __init__(self, transducer: TransducerConfig = TransducerConfig(), inter_ctc: float = 0.0):
        self.cfg, self.inter_ctc = transducer, inter_ctc_weight(inter_ctc)

    def network(self, features: FeatureConfig, encoder: EncoderConfig, vocab_size: int,
                spec_augment: SpecAugment | None, checkpoint_every: int) -> TransducerModel:
        model = TransducerModel(features, encoder, vocab_size, self.cfg, self.ctc_head, spec_augment, checkpoint_every,
                                inter_ctc=self.inter_ctc > 0)
        return with_middle_block(model, encoder, self.inter_ctc)

    def __call__(self, model: nn.Module, batch: LabelledBatch, training: bool) -> Loss:
        weight = self.inter_ctc if training else 0.0
        out = model(batch.audio, batch.audio_lengths, middle=weight > 0, targets=batch.tokens,
                    target_lengths=batch.token_lengths)
        loss_sum = rnnt_loss(out.logits, out.lengths, batch.tokens, batch.token_lengths)
        objective = self.weighted(loss_sum, out, batch)
        if out.middle_log_probs is not None:
            objective = with_inter_ctc(objective, out.middle_log_probs, out.lengths, batch, weight, zero_infinity=True)
        return Loss(objective, loss_sum, out.frames, out.lengths)

    def weighted(self, loss_sum: torch.Tensor, out, batch: LabelledBatch) -> torch.Tensor:
        """What training minimises, given the transducer's summed loss: that loss."""
        return loss_sum

    @staticmethod
    def frames_needed(ids: list[int]) -> int:
        """One frame, whatever the tokens: a transducer may emit them all on it."""
        return 1

    def decoding(self, model: TransducerModel) -> TransducerDecoding:
        """Greedy and beam search with ``model``'s prediction network and joiner, wherever the model is."""
        lstm = model.predictor.lstm
        return TransducerDecoding(model.predictor.step, model.joiner.join, (lstm.num_layers, lstm.hidden_size),
                                  model.ctc_width, self.cfg.max_symbols, self.cfg.beam_size,
                                  device=lambda: model.joiner.output.weight.device)


class Hybrid(Transducer):
    """The transducer and a CTC head on the same encoder, weighted by ``model.transducer.ctc_weight``; it decodes as
    the transducer, and finds silent frames and cut points by its CTC head's blanks."""

    ctc_head = True
    frames_needed = staticmethod(CTC.frames_needed)

    def weighted(self, loss_sum: torch.Tensor, out, batch: LabelledBatch) -> torch.Tensor:
        ctc = ctc_loss(out.ctc_log_probs, out.lengths, batch.tokens, batch.token_lengths, reduction="sum")
        return (1 - self.cfg.ctc_weight) * loss_sum + self.cfg.ctc_weight * ctc


def rnnt_loss(logits: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lengths: torch.Tensor
              ) -> torch.Tensor:
    """RNN-T loss in fp32 of logits (B, T', U+1, V) over the batch's longest utterance and target, summed over the
    batch."""
    return AF.rnnt_loss(logits.float(), tokens[:, : logits.shape[2] - 1].int(), lengths.int(), token_lengths.int(),
                        blank=BLANK_ID, reduction="sum")
