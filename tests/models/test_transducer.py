"""asr.models.transducer: the transducer's network (prediction network, joiner, the hybrid's CTC head) in plain
PyTorch: shapes, what inference reads, intermediate CTC's output, the one-token step against the training forward,
and its FLOP count."""

from __future__ import annotations

import pytest
import torch

from asr.models.features import FeatureConfig
from asr.models.transducer import TransducerConfig, TransducerModel
from asr.tokenizer import BLANK_ID
from tests.conftest import encoder

CONFIG = TransducerConfig(pred_dim=16, joint_dim=24, dropout=0.0)


def tiny_transducer(ctc_head: bool = False, vocab_size: int = 12, seed: int = 0, inter_ctc: bool = False
                    ) -> TransducerModel:
    torch.manual_seed(seed)
    return TransducerModel(FeatureConfig(var_floor=0.0), encoder(dropout=0.0), vocab_size, CONFIG, ctc_head,
                           inter_ctc=inter_ctc).eval()


@pytest.mark.parametrize("ctc_head", [False, True])
def test_frames_are_the_joint_space_after_the_hybrids_ctc_log_probs(waveforms, ctc_head):
    model = tiny_transducer(ctc_head)
    audio, lengths = waveforms(1.3, 0.7)
    frames, out_lengths = model(audio, lengths)
    assert out_lengths.tolist() == [model.encoder_frames(int(n)) for n in lengths]
    assert frames.shape == (2, max(out_lengths), (12 if ctc_head else 0) + 24) and frames.dtype == torch.float32
    if ctc_head:
        torch.testing.assert_close(frames[..., :12].exp().sum(-1), torch.ones(frames.shape[:2]))
    alone, _ = model(audio[1:, : lengths[1]], lengths[1:])  # padding changes no frame of the shorter utterance
    torch.testing.assert_close(frames[1, : out_lengths[1]], alone[0], atol=1e-5, rtol=1e-5)


def test_training_gives_the_lattice_over_the_longest_utterance_and_target(waveforms):
    model = tiny_transducer(ctc_head=True)
    audio, lengths = waveforms(1.3, 0.7)
    targets, target_lengths = torch.tensor([[3, 4, 5, 0, 0], [6, 0, 0, 0, 0]]), torch.tensor([3, 1])
    out = model(audio, lengths, targets=targets, target_lengths=target_lengths)
    assert out.logits.shape == (2, int(out.lengths.max()), 4, 12)  # the targets' padding past 3 left out
    assert out.ctc_log_probs.shape == (2, int(out.lengths.max()), 12)
    frames, _ = model(audio, lengths)
    torch.testing.assert_close(out.frames, frames)


def test_intermediate_ctc_reads_the_middle_block_through_a_head_that_a_transducers_frames_leave_out(waveforms):
    audio, lengths = waveforms(1.3, 0.7)
    with pytest.raises(ValueError, match="intermediate CTC needs a CTC head"):
        tiny_transducer()(audio, lengths, middle=True)
    model = tiny_transducer(inter_ctc=True)
    frames, out_lengths, middle = model(audio, lengths, middle=True)
    assert model.ctc_width == 0 and frames.shape[-1] == 24  # inference reads what a transducer without it reads
    assert middle.shape == (2, max(out_lengths), 12) and "head.weight" in model.token_rows
    states, _, between = model.encode(audio, lengths, middle=True)
    torch.testing.assert_close(middle, model.head(model.norm(between)).log_softmax(-1))
    assert not torch.allclose(middle, model.head(model.norm(states)).log_softmax(-1))  # not the last block's
    targets, target_lengths = torch.tensor([[3, 4, 5], [6, 0, 0]]), torch.tensor([3, 1])
    out = model(audio, lengths, middle=True, targets=targets, target_lengths=target_lengths)
    torch.testing.assert_close(out.middle_log_probs, middle)
    assert out.ctc_log_probs is None


def test_one_token_at_a_time_the_prediction_network_gives_the_training_contexts():
    """Decoding steps the prediction network token by token from the blank and a zero state: the contexts must be
    those the training forward computed for the same tokens."""
    predictor = tiny_transducer().predictor
    tokens = torch.tensor([[3, 7, 7, 2]])
    whole = predictor(tokens)[0]  # (U+1, J)
    h, c = predictor.initial_state(1)
    steps = []
    for token in [BLANK_ID, *tokens[0].tolist()]:
        context, h, c = predictor.step(torch.tensor([token]), h, c)
        steps.append(context[0])
    torch.testing.assert_close(torch.stack(steps), whole)


def test_the_joiner_of_one_point_is_the_lattices_log_softmax():
    model = tiny_transducer()
    enc, pred = torch.randn(1, 3, 24), torch.randn(1, 2, 24)
    lattice = model.joiner(enc, pred).log_softmax(-1)  # (1, 3, 2, V)
    torch.testing.assert_close(model.joiner.join(enc[0, 2:3], pred[0, 1:2])[0], lattice[0, 2, 1])


def test_forward_flops_count_the_joiner_over_the_whole_lattice_and_the_hybrids_head():
    plain, hybrid = tiny_transducer(), tiny_transducer(ctc_head=True)
    samples = torch.tensor([16000])
    t = plain.encoder_frames(16000)
    more_tokens = plain.forward_flops(samples, torch.tensor([10])) - plain.forward_flops(samples, torch.tensor([0]))
    lstm = 2 * 4 * 16 * 32  # one step of the one-layer LSTM of width 16
    assert more_tokens.item() == 10 * (lstm + 2 * 16 * 24) + t * 10 * 2 * 24 * 12
    assert (hybrid.forward_flops(samples) - plain.forward_flops(samples)).item() == 2 * t * 32 * 12
