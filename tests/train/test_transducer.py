"""The transducer objectives (asr.train.transducer): RNN-T's loss summed as torchaudio computes it per utterance,
the hybrid's weighting, fp32 under autocast, a few steps that learn, the settings each objective reads, the data
rule, and --model.init_from a CTC checkpoint (the encoder loaded, the new layers as initialised)."""

from __future__ import annotations

import pytest
import torch
import torchaudio.functional as AF

from asr.models.transducer import TransducerConfig, TransducerModel
from asr.tokenizer import BLANK_ID
from asr.train.finetune import FineTune
from asr.train.init_from import initialize
from asr.train.objectives import CTC, ctc_loss
from asr.train.transducer import Hybrid, Transducer
from tests.conftest import save_checkpoint
from tests.train.test_init_from import batch
from tests.train.test_module import module

SMALL = TransducerConfig(pred_dim=16, joint_dim=24, dropout=0.0)


def test_the_transducer_loss_is_rnnt_loss_of_each_utterance_alone_summed(char_tokenizer):
    model = module(char_tokenizer, objective="transducer", transducer=SMALL).eval()
    data = batch(char_tokenizer)
    with torch.no_grad():
        loss = model.objective(model.model, data, training=False)
        expected = 0.0
        for b in range(len(data.texts)):
            n, u = int(data.audio_lengths[b]), int(data.token_lengths[b])
            out = model.model(data.audio[b:b + 1, :n], data.audio_lengths[b:b + 1], targets=data.tokens[b:b + 1, :u],
                              target_lengths=data.token_lengths[b:b + 1])
            expected += AF.rnnt_loss(out.logits, data.tokens[b:b + 1, :u].int(), out.lengths.int(),
                                     data.token_lengths[b:b + 1].int(), blank=BLANK_ID, reduction="sum")
    torch.testing.assert_close(loss.loss_sum, expected, atol=1e-3, rtol=1e-4)
    assert loss.objective is loss.loss_sum and loss.frames.shape[-1] == SMALL.joint_dim


def test_the_hybrid_minimises_the_weighted_sum_and_logs_the_transducers_loss(char_tokenizer):
    model = module(char_tokenizer, objective="hybrid", transducer=SMALL).eval()
    data = batch(char_tokenizer)
    with torch.no_grad():
        loss = model.objective(model.model, data, training=True)
        out = model.model(data.audio, data.audio_lengths, targets=data.tokens, target_lengths=data.token_lengths)
        ctc = ctc_loss(out.ctc_log_probs, out.lengths, data.tokens, data.token_lengths, reduction="sum")
    torch.testing.assert_close(loss.objective, 0.7 * loss.loss_sum + 0.3 * ctc)
    assert not torch.isclose(loss.objective, loss.loss_sum)


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_under_bf16_autocast_the_loss_is_fp32_and_a_few_steps_lower_it(char_tokenizer, objective):
    model, data = module(char_tokenizer, objective=objective, transducer=SMALL), batch(char_tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.objective(model.model, data, training=True)
        assert loss.objective.dtype == torch.float32 and loss.frames.dtype == torch.float32
        loss.objective.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.loss_sum.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_each_objective_refuses_the_settings_it_does_not_read(char_tokenizer):
    with pytest.raises(ValueError, match="model.inter_ctc is not read by model.objective transducer"):
        module(char_tokenizer, objective="transducer", inter_ctc=0.3)
    with pytest.raises(ValueError, match="model.transducer is not read by model.objective ctc"):
        module(char_tokenizer, transducer=SMALL)
    with pytest.raises(ValueError, match="model.transducer.joint_dim must be >= 1"):
        TransducerConfig(joint_dim=0)


def test_a_transducer_trains_on_any_utterance_the_hybrid_on_what_ctc_can_emit():
    repeats = [3, 3, 3, 4]
    assert Transducer.frames_needed(repeats) == 1
    assert Hybrid.frames_needed(repeats) == CTC.frames_needed(repeats) == 6


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_init_from_a_ctc_checkpoint_loads_the_encoder_and_leaves_the_new_layers_as_initialised(
        char_tokenizer, tmp_path, objective):
    ctc = module(char_tokenizer, encoder={"n_layers": 1})
    with torch.no_grad():
        for p in ctc.parameters():
            p.add_(1.0)  # unlike any fresh initialisation
    path = save_checkpoint(ctc, tmp_path / "ctc.ckpt")
    torch.manual_seed(1)
    fresh = module(char_tokenizer, encoder={"n_layers": 1}, objective=objective, transducer=SMALL)
    before = {name: value.clone() for name, value in fresh.state_dict().items()}
    lines = initialize(fresh, str(path), FineTune())
    own = fresh.state_dict()
    loaded = {name for name in own if name in ctc.state_dict()}
    assert {"model.norm.weight", "model.encoder.subsampling.conv.0.weight"} <= loaded
    assert ("model.head.weight" in loaded) is (objective == "hybrid")
    for name in own:
        expected = ctc.state_dict()[name] if name in loaded else before[name]
        assert torch.equal(own[name], expected), name
    new = [name for name in own if name not in loaded]
    assert new and all(name.startswith(("model.predictor.", "model.joiner.")) for name in new)
    assert any("left as initialised" in line and "model.predictor." in line for line in lines)
    assert isinstance(fresh.model, TransducerModel)
