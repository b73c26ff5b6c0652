"""ASRModule: loss and metrics arithmetic, the lr schedule, checkpoint round trip, bf16 and compile."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import LambdaCallback, Timer
from torch.utils.data import DataLoader

from asr.data.batch import Batch
from asr.models.features import FeatureConfig
from asr.models.objectives import ctc_loss
from asr.models.specaugment import SpecAugmentConfig
from asr.train.module import ASRModule, any_nonfinite, error_counts
from asr.train.schedule import ScheduleConfig, WarmupCosine
from tests.conftest import encoder as tiny_encoder, flat_hyper_parameters, old_weight_names, save_checkpoint


def module(tokenizer, encoder: dict | None = None, **kwargs) -> ASRModule:
    """A tiny ASRModule (tests.conftest.TINY_ENCODER without dropout, per-bin features over every frame, no
    SpecAugment, no intermediate CTC); ``encoder``: other EncoderConfig fields, ``kwargs``: other arguments of
    ASRModule."""
    torch.manual_seed(0)
    shapes = tiny_encoder(**{"dropout": 0.0, **(encoder or {})})
    features = FeatureConfig(norm="bin", quiet_db=0.0)
    settings = dict(encoder=shapes, features=features, spec_augment=None, inter_ctc=0.0) | kwargs
    return ASRModule(tokenizer=tokenizer, **settings)


def test_ctc_loss_is_the_per_token_mean_over_the_batch():
    torch.manual_seed(0)
    log_probs = torch.randn(2, 20, 6).log_softmax(-1)
    lengths, tokens, token_lengths = torch.tensor([20, 15]), torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])
    summed = F.ctc_loss(log_probs.transpose(0, 1), tokens, lengths, token_lengths, reduction="sum")
    assert ctc_loss(log_probs, lengths, tokens, token_lengths).item() == pytest.approx(summed.item() / 5)


def test_error_counts_add_up_word_and_character_edits():
    counts = error_counts(["call five two", "go left"], ["call fife two", "go"]).tolist()
    assert counts[:2] == [2, 5]  # one substitution, one deletion, of 5 reference words
    assert counts[2:] == [1 + 5, 13 + 7]  # v->f; " left" deleted; reference characters incl. spaces


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_any_nonfinite_finds_one_bad_gradient_element_among_many(dtype, bad):
    """The check that skips an update finds one NaN or Inf among many gradients, and passes large finite ones."""
    grads = [torch.full((64, 64), 1e30, dtype=dtype), torch.tensor([1.0, -1.0], dtype=dtype), torch.zeros(3, dtype=dtype)]
    if bad is not None:
        grads[1][0] = bad
    assert bool(any_nonfinite(grads)) is (bad is not None)


def test_schedule_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    schedule = WarmupCosine(warmup=10, total=110, floor=0.1, warmup_share=1.0)
    assert schedule(0) == pytest.approx(0.1) and schedule(9) == pytest.approx(1.0)
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule(110) == pytest.approx(0.1) and schedule(500) == pytest.approx(0.1)
    schedule.elapsed = 1e9  # a clock without a duration (no --trainer.max_time) changes nothing
    assert schedule(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def cosine(progress: float, floor: float) -> float:
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def test_time_bounded_schedule_follows_the_elapsed_share_of_max_time_or_the_steps_if_further():
    schedule = WarmupCosine(warmup=10, total=10_010, floor=0.1, duration=600.0, warmup_share=1.0)
    for elapsed, expected in [(0.0, 1.0), (150.0, cosine(0.25, 0.1)), (300.0, cosine(0.5, 0.1)),
                              (540.0, cosine(0.9, 0.1)), (600.0, 0.1), (900.0, 0.1)]:
        schedule.elapsed = elapsed
        assert schedule(10) == pytest.approx(expected)
    schedule.elapsed = 150.0
    assert schedule(5010) == pytest.approx(cosine(0.5, 0.1))  # half the steps are done: further than the clock
    assert schedule(4) == pytest.approx(0.5 * cosine(0.25, 0.1))  # warm-up is counted in steps


class FakeClock(Timer):
    """trainer.max_time's Timer (it also stops the run) on a fake clock: each training batch takes ``tick`` s."""

    def __init__(self, seconds: float, tick: float):
        super().__init__(duration=timedelta(seconds=seconds), verbose=False)
        self.tick, self.now = tick, 0.0

    def on_train_batch_start(self, *args) -> None:
        self.now += self.tick

    def time_elapsed(self, stage: str = "train") -> float:
        return self.now


def test_time_bounded_warmup_ends_at_its_share_of_the_time_on_a_slow_machine():
    """400 warm-up steps tuned on a machine that makes 1,278 in the time; this one makes 175 (issue 37)."""
    schedule = WarmupCosine(warmup=400, total=None, floor=0.05, duration=900.0, warmup_share=0.3)
    seconds_per_step = 900.0 / 175
    schedule.elapsed = 26 * seconds_per_step  # step 26 of 175: 15% of the time, half of warm-up's 30%
    assert schedule.ramp(26) == pytest.approx(26 / (0.3 * 175))
    schedule.elapsed = 53 * seconds_per_step  # 30% of the time: warm-up is over, 122 steps of cosine remain
    assert schedule.ramp(53) == 1.0 and schedule(53) == pytest.approx(cosine(53 / 175, 0.05))
    for step, ramp in ((383, pytest.approx(383 * 900.0 / 1278 / 270)), (384, 1.0)):  # the tuned machine's 1,278:
        schedule.elapsed = step * 900.0 / 1278  # its warm-up ends at 30% of them, 384 steps, not 400
        assert schedule.ramp(step) == ramp


def run_for_time(model, seconds: float, tick: float) -> list[float]:
    """Fit ``model`` on two fixed batches in endless epochs under max_time ``seconds``, each batch taking ``tick``
    seconds of a fake clock; the lr of each batch."""
    texts = ["nine four", "two five", "call nine", "four two one"]
    batches = []
    for pair in (texts[:2], texts[2:]):
        audio = torch.randn(2, 16000) * 0.1  # 1 s: 25 encoder frames, room for the CTC paths
        tokens = [torch.tensor(model.tokenizer.encode(t)) for t in pair]
        batches.append(Batch(audio, torch.tensor([16000, 14000]), torch.nn.utils.rnn.pad_sequence(tokens, True),
                             torch.tensor([len(t) for t in tokens]), pair))
    lrs = []
    record = LambdaCallback(on_train_batch_start=lambda trainer, *_: lrs.append(trainer.optimizers[0].param_groups[0]["lr"]))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=-1, callbacks=[FakeClock(seconds, tick), record], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    return lrs


def test_a_run_bounded_by_max_time_leaves_a_long_warmup_by_its_share_of_the_time(char_tokenizer):
    """1,000 warm-up steps, but this machine makes 10 in the time: warm-up ends at 30% of it, batch 3."""
    lrs = run_for_time(module(char_tokenizer, schedule=ScheduleConfig(1000, 0.3, 0.1)), 100.0, 10.0)
    expected = [1e-3 * min(1.0, max((k + 1) / 1000, 10 * k / 30)) * cosine(10 * k / 100, 0.1) for k in range(10)]
    assert lrs == pytest.approx(expected) and max(lrs) > 0.7e-3


def test_a_run_bounded_by_max_time_anneals_its_lr_to_the_floor_when_the_time_is_up(char_tokenizer):
    """10 batches of 10 s under max_time 100 s, endless epochs: batch k's lr is the cosine at (10 k / 100)."""
    model = module(char_tokenizer, schedule=ScheduleConfig(warmup_steps=2, min_lr_ratio=0.1))
    lrs = run_for_time(model, 100.0, 10.0)
    peak = 1e-3  # AdamW's default lr
    expected = [peak * min(1.0, (k + 1) / 2) * cosine(10 * k / 100, 0.1) for k in range(10)]
    assert lrs == pytest.approx(expected)  # the run stops after batch 9, when its clock reads 100 s
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(0.1 * peak)


def test_module_without_tokenizer_is_refused_with_the_link_named():
    with pytest.raises(ValueError, match="data.tokenizer"):
        ASRModule()


@pytest.mark.parametrize("n_mels, feature_norm", [(80, "bin"), (40, "bin"), (80, "shared")])
def test_checkpoint_round_trip_gives_the_same_transcripts(n_mels, feature_norm, char_tokenizer, waveforms, tmp_path):
    original = module(char_tokenizer, features=FeatureConfig(n_mels=n_mels, norm=feature_norm)).eval()
    loaded = ASRModule.from_checkpoint(save_checkpoint(original, tmp_path / "m.ckpt"))
    assert loaded.model.features.config.n_feats == loaded.model.encoder.subsampling.n_feats == n_mels
    assert loaded.model.features.config.norm == feature_norm
    audio, lengths = waveforms(1.0, 0.7)
    assert loaded.transcribe_batch(audio, lengths) == original.transcribe_batch(audio, lengths)
    torch.testing.assert_close(loaded(audio, lengths)[0], original(audio, lengths)[0])


def test_a_checkpoint_from_before_a_setting_existed_loads_with_the_value_it_was_trained_with(char_tokenizer, waveforms,
                                                                                           tmp_path):
    """Checkpoints written before --model.feature_norm (now --model.features.norm) have no such key: their features
    were normalised per bin, ASRModule's default then, whatever the default is now. Such a checkpoint is also
    one of before the settings were grouped (flat hyper-parameters, weights under model.blocks.*)."""
    original = module(char_tokenizer).eval()
    hyper_parameters = {k: v for k, v in flat_hyper_parameters(original.hparams).items() if k != "feature_norm"}
    old = save_checkpoint(original, tmp_path / "old.ckpt", hyper_parameters=hyper_parameters,
                          state_dict=old_weight_names(original.state_dict()))
    loaded = ASRModule.from_checkpoint(old)
    assert loaded.model.features.config.norm == "bin"
    audio, lengths = waveforms(1.0, 0.7)
    torch.testing.assert_close(loaded(audio, lengths)[0], original(audio, lengths)[0])


def test_checkpoint_without_tokenizer_is_refused(char_tokenizer, tmp_path):
    torch.save({"state_dict": {}, "hyper_parameters": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="no tokenizer"):
        ASRModule.from_checkpoint(tmp_path / "other.ckpt")


def test_under_bf16_autocast_the_loss_and_log_probs_stay_fp32(char_tokenizer, waveforms):
    model = module(char_tokenizer)
    audio, lengths = waveforms(1.0, 0.8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs, out_lengths = model(audio, lengths)
        loss = ctc_loss(log_probs, out_lengths, torch.tensor([[2, 3], [4, 0]]), torch.tensor([2, 1]))
    assert log_probs.dtype == torch.float32 and loss.dtype == torch.float32
    assert torch.isfinite(loss)


def test_compiled_blocks_compute_what_eager_blocks_compute(char_tokenizer, waveforms):
    """--model.compile: each Conformer block compiled (its padding-masked batch norm included) computes what it
    computes eagerly."""
    conformer = {"block": "conformer", "conv_norm": "batch", "conv_kernel": 5}
    eager, compiled = module(char_tokenizer, conformer).eval(), module(char_tokenizer, conformer, compile=True).eval()
    compiled.configure_model()
    audio, lengths = waveforms(0.6, 0.5)
    torch.testing.assert_close(compiled(audio, lengths)[0], eager(audio, lengths)[0], atol=1e-4, rtol=1e-4)
    assert set(compiled.state_dict()) == set(eager.state_dict())  # checkpoints stay interchangeable


def test_dropout_settings_reach_every_block(char_tokenizer):
    blocks = module(char_tokenizer, {"dropout": 0.2, "attention_dropout": 0.3}).model.encoder.blocks
    assert all((b.dropout, b.attention_dropout) == (0.2, 0.3) for b in blocks)


def test_inter_ctc_trains_on_the_middle_blocks_ctc_loss_too_and_leaves_evaluation_alone(char_tokenizer, waveforms):
    model = module(char_tokenizer, {"n_layers": 4}, inter_ctc=0.3).eval()  # eval: no dropout, same outputs twice
    audio, lengths = waveforms(1.0, 0.8)
    tokens, token_lengths = torch.tensor([[2, 3], [4, 0]]), torch.tensor([2, 1])
    batch = Batch(audio, lengths, tokens, token_lengths, ["ab", "c"])
    middle_states = []
    hook = model.model.encoder.blocks[1].register_forward_hook(lambda _m, _args, out: middle_states.append(out))
    objective, final, _ = model._shared_step(batch, "train")
    hook.remove()
    log_probs, out_lengths = model(audio, lengths)  # inference: two outputs, as before
    expected_final = ctc_loss(log_probs, out_lengths, tokens, token_lengths, reduction="sum")
    expected_middle = ctc_loss(model.model.log_probs(middle_states[0]), out_lengths, tokens, token_lengths,
                               reduction="sum")
    torch.testing.assert_close(final, expected_final)
    torch.testing.assert_close(objective, 0.7 * expected_final + 0.3 * expected_middle)
    assert not torch.isclose(objective, final)  # the middle block's loss does count
    model.errors.clear()
    objective, final, _ = model._shared_step(batch, "val")
    assert objective is final  # validation and test score the output alone


NO_MIDDLE = "n_layers >= 2, got 1 .with model.inter_ctc 0.3; model.inter_ctc 0 turns it off"  # names the way out


@pytest.mark.parametrize("weight, layers, message", [(1.0, 4, "model.inter_ctc must be in"),
                                                     (-0.1, 4, "model.inter_ctc must be in"), (0.3, 1, NO_MIDDLE)])
def test_inter_ctc_outside_its_range_or_without_a_middle_block_is_refused(char_tokenizer, weight, layers, message):
    with pytest.raises(ValueError, match=message):
        module(char_tokenizer, {"n_layers": layers}, inter_ctc=weight)


@pytest.mark.parametrize("warp", [{"freq_warp": 0.2}, {"freq_warp_jitter": 0.1}])
def test_freq_warp_changes_training_features_only_and_spec_augment_null_turns_it_off_too(char_tokenizer, warp):
    assert isinstance(module(char_tokenizer, spec_augment=None).model.spec_augment, torch.nn.Identity)
    model = module(char_tokenizer, spec_augment=SpecAugmentConfig(freq_masks=0, time_masks=0, **warp)).model
    feats = torch.randn(2, 30, 80)
    assert not torch.equal(model.spec_augment.train()(feats), feats)  # the masks are off: this is the warp
    assert torch.equal(model.spec_augment.eval()(feats), feats)
    assert not any("bin_hz" in key for key in model.state_dict())  # checkpoints stay as they were
