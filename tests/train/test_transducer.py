"""The transducer objectives (asr.models.transducer_objectives): RNN-T's loss summed as torchaudio computes it per
utterance, the hybrid's weighting, intermediate CTC beside either, sums that add over any split of the batch (what DDP and FSDP
rely on), fp32 under autocast, a few steps that learn, the settings each objective reads, the data rule, and
--model.init_from a CTC checkpoint (the encoder loaded, the new layers as initialised)."""

from __future__ import annotations

import pytest
import torch
import torchaudio.functional as AF

from asr.data.batch import collate
from asr.models.objectives import CTC, ctc_loss
from asr.models.transducer import TransducerConfig, TransducerModel
from asr.models.transducer_objectives import Hybrid, Transducer
from asr.tokenizer import BLANK_ID
from asr.train.finetune import FineTune
from asr.train.init_from import initialize
from tests.conftest import TEXTS, save_checkpoint, sine
from tests.train.test_init_from import batch
from tests.train.test_module import module

SMALL = TransducerConfig(pred_dim=16, joint_dim=24, dropout=0.0)


def transducer(tokenizer, objective: str = "transducer", inter_ctc: float = 0.0, encoder: dict | None = None):
    """A tiny transducer ASRModule (tests.train.test_module.module, SMALL) of 40 ms frames, so that a CTC head has
    a frame for every character of ``batch``'s texts; ``encoder``: other EncoderConfig fields."""
    return module(tokenizer, {"subsampling": 4, **(encoder or {})}, objective=objective, transducer=SMALL,
                  inter_ctc=inter_ctc)


def test_the_transducer_loss_is_rnnt_loss_of_each_utterance_alone_summed(char_tokenizer):
    model = transducer(char_tokenizer).eval()
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
    model = transducer(char_tokenizer, "hybrid").eval()
    data = batch(char_tokenizer)
    with torch.no_grad():
        loss = model.objective(model.model, data, training=True)
        out = model.model(data.audio, data.audio_lengths, targets=data.tokens, target_lengths=data.token_lengths)
        ctc = ctc_loss(out.ctc_log_probs, out.lengths, data.tokens, data.token_lengths, reduction="sum")
    torch.testing.assert_close(loss.objective, 0.7 * loss.loss_sum + 0.3 * ctc)
    assert not torch.isclose(loss.objective, loss.loss_sum)


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_inter_ctc_adds_the_middle_blocks_ctc_loss_to_either_objective_in_training_alone(char_tokenizer, objective):
    """(1 - v) x the objective + v x the CTC loss of the middle block's output through the CTC head: the hybrid's,
    or a head of the transducer's own that no frame holds (inference is unchanged)."""
    model = transducer(char_tokenizer, objective, inter_ctc=0.3).eval()
    plain = transducer(char_tokenizer, objective).eval()
    plain.load_state_dict(model.state_dict(), strict=False)  # the same weights, but for the transducer's new head
    data = batch(char_tokenizer)
    with torch.no_grad():
        trained, evaluated = (model.objective(model.model, data, training=t) for t in (True, False))
        _, lengths, middle = model.model(data.audio, data.audio_lengths, middle=True)
        middle_loss = ctc_loss(middle, lengths, data.tokens, data.token_lengths, reduction="sum")
        without = plain.objective(plain.model, data, training=True)
    torch.testing.assert_close(trained.objective, 0.7 * evaluated.objective + 0.3 * middle_loss)
    assert not torch.isclose(trained.objective, evaluated.objective)
    torch.testing.assert_close(trained.loss_sum, evaluated.loss_sum)  # train/loss logs the transducer's alone
    torch.testing.assert_close(without.objective, evaluated.objective)
    torch.testing.assert_close(trained.frames, without.frames)
    assert model.model.ctc_width == plain.model.ctc_width == (char_tokenizer.vocab_size if objective == "hybrid" else 0)


def test_a_transducers_intermediate_ctc_adds_nothing_for_an_utterance_too_short_for_ctc(char_tokenizer):
    """The transducer's data rule keeps an utterance of fewer frames than CTC needs; its intermediate CTC loss is 0,
    the others' are kept, and the gradient is finite."""
    model = transducer(char_tokenizer, inter_ctc=0.3).eval()  # eval: no dropout, the same outputs twice
    texts = [TEXTS[0], "abcdefghijklmnopqrstuvwxyz" * 2]  # 52 characters in 0.3 s: 7 encoder frames
    audio = [torch.from_numpy(sine(seconds, 16000, seed=i)) for i, seconds in enumerate((1.0, 0.3))]
    data = collate(audio, [torch.tensor(char_tokenizer.encode(t)) for t in texts], texts)
    loss = model.objective(model.model, data, training=True)
    _, lengths, middle = model.model(data.audio, data.audio_lengths, middle=True)
    assert lengths[1] < data.token_lengths[1]
    first = ctc_loss(middle[:1], lengths[:1], data.tokens[:1], data.token_lengths[:1], reduction="sum")
    torch.testing.assert_close(loss.objective, 0.7 * loss.loss_sum + 0.3 * first)
    loss.objective.backward()
    assert all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())
    assert model.model.head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_the_objective_of_a_batch_is_the_sum_of_its_parts(char_tokenizer, objective):
    """Each rank's summed objective, over the global batch's tokens, is one process's per-token objective (ASRModule's
    reduction): true only if the objective adds over any split of the batch, inter-CTC and the hybrid's CTC too."""
    model = transducer(char_tokenizer, objective, inter_ctc=0.3).eval()
    data = batch(char_tokenizer)
    with torch.no_grad():
        whole = model.objective(model.model, data, training=True)
        parts = [model.objective(model.model, part(data, rows), training=True) for rows in ([0, 2], [1])]
    torch.testing.assert_close(whole.objective, parts[0].objective + parts[1].objective, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(whole.loss_sum, parts[0].loss_sum + parts[1].loss_sum, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("objective, inter_ctc", [("transducer", 0.3), ("hybrid", 0.0)])
def test_under_bf16_autocast_the_loss_is_fp32_and_a_few_steps_lower_it(char_tokenizer, objective, inter_ctc):
    model, data = transducer(char_tokenizer, objective, inter_ctc=inter_ctc), batch(char_tokenizer)
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


def test_each_objective_refuses_the_settings_it_does_not_read_or_cannot_use(char_tokenizer):
    with pytest.raises(ValueError, match="model.transducer is not read by model.objective ctc"):
        module(char_tokenizer, transducer=SMALL, inter_ctc=0.0)
    with pytest.raises(ValueError, match="model.inter_ctc needs a middle block, so model.encoder.n_layers >= 2, got 1"):
        transducer(char_tokenizer, inter_ctc=0.3, encoder={"n_layers": 1})
    with pytest.raises(ValueError, match=r"model.inter_ctc must be in \[0, 1\), got 1"):
        transducer(char_tokenizer, "hybrid", inter_ctc=1.0)
    with pytest.raises(ValueError, match="model.transducer.joint_dim must be >= 1"):
        TransducerConfig(joint_dim=0)


def test_a_transducer_trains_on_any_utterance_the_hybrid_on_what_ctc_can_emit():
    repeats = [3, 3, 3, 4]
    assert Transducer.frames_needed(repeats) == 1
    assert Hybrid.frames_needed(repeats) == CTC.frames_needed(repeats) == 6


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_init_from_a_ctc_checkpoint_loads_the_encoder_and_leaves_the_new_layers_as_initialised(
        char_tokenizer, tmp_path, objective):
    ctc = module(char_tokenizer, encoder={"n_layers": 1, "subsampling": 4}, inter_ctc=0.0)
    with torch.no_grad():
        for p in ctc.parameters():
            p.add_(1.0)  # unlike any fresh initialisation
    path = save_checkpoint(ctc, tmp_path / "ctc.ckpt")
    torch.manual_seed(1)
    fresh = transducer(char_tokenizer, objective, encoder={"n_layers": 1})
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


def part(data, rows: list[int]):
    """The utterances ``rows`` of the Batch ``data``, collated anew (as another rank's batch)."""
    return collate([data.audio[b, : data.audio_lengths[b]] for b in rows],
                   [data.tokens[b, : data.token_lengths[b]] for b in rows], [data.texts[b] for b in rows])
