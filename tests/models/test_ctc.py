import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr.configs import CONFIGS
from asr.models.blocks import BLOCKS
from asr.models.ctc import CTCModel
from asr.models.ctc_decoding import greedy
from asr.models.features import FeatureConfig, num_frames
from asr.models.objectives import ctc_loss
from asr.models.subsampling import subsampled_lengths
from tests import MINI, REPO
from tests.cli import CHAR_FRAMES
from tests.conftest import encoder


BLOCK_TYPES = list(BLOCKS)


def mini_slice(folder: Path, n: int) -> Path:
    """The first n lines of data/mini/train.jsonl with absolute audio paths, as folder/train.jsonl."""
    rows = [json.loads(line) for line in (MINI / "train.jsonl").read_text().splitlines()[:n]]
    absolute = [r | {"audio_filepath": str(MINI / r["audio_filepath"])} for r in rows]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in absolute))
    return folder / "train.jsonl"


def epoch_losses(run: Path) -> list[float]:
    with open(run / "metrics.csv") as f:
        return [float(r["train/loss_epoch"]) for r in csv.DictReader(f) if r.get("train/loss_epoch")]


@pytest.mark.parametrize("block", BLOCK_TYPES)
@pytest.mark.parametrize("subsampling", [4, 8])
@pytest.mark.parametrize("sample_rate", [8000, 16000])
@pytest.mark.parametrize("conv", ["full", "separable"])
def test_output_shape_and_lengths_follow_subsampled_lengths(tiny_model, waveforms, sample_rate, subsampling, block, conv):
    model = tiny_model(sample_rate=sample_rate, subsampling=subsampling, block=block, subsampling_conv=conv).eval()
    audio, lengths = waveforms(1.3, 0.7, rate=sample_rate)
    log_probs, out_lengths = model(audio, lengths)
    expected = [subsampled_lengths(num_frames(int(n), sample_rate), subsampling) for n in lengths]
    assert out_lengths.tolist() == expected
    assert log_probs.shape == (2, max(expected), 12)
    assert model.encoder_frames(int(lengths[1])) == expected[1]
    assert model.frame_seconds == pytest.approx(0.01 * subsampling)  # 10 ms feature hop


def test_subsampled_lengths_match_the_convolutions():
    assert subsampled_lengths(100, 4) == 24  # 100 -> 49 -> 24
    assert subsampled_lengths(100, 8) == 11  # ... -> 11
    assert subsampled_lengths(torch.tensor([100, 7]), 4).tolist() == [24, 1]


def test_subsampled_lengths_are_zero_not_negative_below_one_encoder_frame():
    assert subsampled_lengths(torch.arange(8), 4).tolist() == [0] * 7 + [1]  # x4 needs 7 feature frames
    assert subsampled_lengths(torch.arange(16), 8).tolist() == [0] * 15 + [1]  # x8 needs 15
    assert subsampled_lengths(2, 4) == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_log_probs_are_fp32_distributions_per_frame(tiny_model, waveforms, autocast):
    model = tiny_model().eval()
    audio, lengths = waveforms(1.0, 0.6)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        log_probs, _ = model(audio, lengths)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]))


@pytest.mark.parametrize("block", BLOCK_TYPES)
@pytest.mark.parametrize("subsampling, window, conv", [(4, 0, "full"), (8, 0, "full"), (4, 3, "full"), (8, 0, "separable")])
def test_an_utterance_gives_the_same_output_batched_and_alone(tiny_model, waveforms, subsampling, window, conv, block):
    model = tiny_model(subsampling=subsampling, attention_window=window, block=block, subsampling_conv=conv).eval()
    audio, lengths = waveforms(1.5, 0.8, 1.1)
    with torch.no_grad():
        batch, out_lengths = model(audio, lengths)
        for i in range(3):
            alone, alone_lengths = model(audio[i : i + 1, : lengths[i]], lengths[i : i + 1])
            assert alone_lengths[0] == out_lengths[i] == alone.shape[1]
            torch.testing.assert_close(batch[i, : out_lengths[i]], alone[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("subsampling", [4, 8])
def test_a_too_short_utterance_in_a_batch_decodes_to_nothing(tiny_model, waveforms, subsampling):
    audio, lengths = waveforms(1.0, 0.02)  # 2 feature frames: less than one encoder frame
    log_probs, out_lengths = tiny_model(subsampling=subsampling).eval()(audio, lengths)
    assert out_lengths[1] == 0 and greedy(log_probs, out_lengths)[1] == []


@pytest.mark.parametrize("subsampling", [4, 8])
def test_a_lone_utterance_too_short_for_an_encoder_frame_decodes_to_nothing(tiny_model, waveforms, subsampling):
    audio, lengths = waveforms(0.05)  # a short click transcribed on its own
    log_probs, out_lengths = tiny_model(subsampling=subsampling).eval()(audio, lengths)
    assert out_lengths.tolist() == [0] and greedy(log_probs, out_lengths) == [[]]


def loss_and_gradients(model: CTCModel, audio: torch.Tensor, lengths: torch.Tensor):
    log_probs, out_lengths = model(audio, lengths)
    tokens = torch.tensor([[3, 4, 5, 4], [6, 7, 0, 0]])
    loss = ctc_loss(log_probs, out_lengths, tokens, torch.tensor([4, 2]))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def count_block_calls(model: CTCModel) -> list[int]:
    calls = [0] * len(model.encoder.blocks)
    for i, block in enumerate(model.encoder.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("block, conv_norm", [("transformer", "layer"), ("conformer", "layer"),
                                              ("conformer", "batch")])
@pytest.mark.parametrize("dropout", [0.0, 0.1])  # the recomputed forward must draw the same dropout masks
@pytest.mark.parametrize("every, expected_calls", [(1, [2, 2]), (2, [2, 1])])
def test_activation_checkpointing_leaves_loss_and_gradients_unchanged(tiny_model, waveforms, every, expected_calls,
                                                                      dropout, block, conv_norm):
    audio, lengths = waveforms(1.0, 0.7)
    reference = tiny_model(dropout=dropout, block=block, conv_norm=conv_norm).train()
    torch.manual_seed(1)
    reference_loss, reference_grads = loss_and_gradients(reference, audio, lengths)
    model = tiny_model(checkpoint_every=every, dropout=dropout, block=block, conv_norm=conv_norm).train()
    calls = count_block_calls(model)
    torch.manual_seed(1)
    loss, grads = loss_and_gradients(model, audio, lengths)
    assert calls == expected_calls  # checkpointed blocks run again in the backward pass
    torch.testing.assert_close(loss, reference_loss)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)



def test_d_model_not_divisible_by_n_heads_is_refused():
    with pytest.raises(ValueError, match=r"model\.encoder\.d_model.*model\.encoder\.n_heads"):
        CTCModel(FeatureConfig(16000), encoder(d_model=30), 12)


def test_subsampling_other_than_4_or_8_is_refused():
    with pytest.raises(ValueError, match=r"model\.encoder\.subsampling.*3"):
        CTCModel(FeatureConfig(16000), encoder(subsampling=3), 12)


@pytest.mark.parametrize("sample_rate, n_feats", [(8000, 81), (16000, 80)])
def test_the_encoder_takes_the_feature_count_of_the_front_end(sample_rate, n_feats):
    """The encoder's settings name no feature count: it is the front end's, so the two cannot disagree."""
    model = CTCModel(FeatureConfig(sample_rate), encoder(), 12)
    assert model.features.config.n_feats == model.encoder.subsampling.n_feats == n_feats


def test_negative_checkpoint_every_is_refused():
    with pytest.raises(ValueError, match="model.checkpoint_every"):
        CTCModel(FeatureConfig(16000), encoder(), 12, checkpoint_every=-1)


def test_conv_channels_narrow_the_subsampling_maps_but_not_the_model_width(waveforms):
    features = FeatureConfig(16000)
    cfg = encoder(n_layers=1, conv_channels=8)
    model = CTCModel(features, cfg, 12).eval()
    assert [m.out_channels for m in model.encoder.subsampling.conv if hasattr(m, "out_channels")] == [8, 8]
    audio, lengths = waveforms(1.0, 0.6)
    log_probs, out_lengths = model(audio, lengths)
    assert log_probs.shape == (2, int(out_lengths.max()), 12)
    alone, _ = model(audio[1:, : lengths[1]], lengths[1:])
    torch.testing.assert_close(log_probs[1, : out_lengths[1]], alone[0], atol=1e-4, rtol=1e-4)


def test_fit_cli_trains_a_conformer_that_transcribes(tmp_path):
    """``python -m asr.fit --model.encoder.block conformer`` (default callbacks and progress bar), then asr.transcribe."""
    manifest = mini_slice(tmp_path, 48)
    fit = [sys.executable, "-m", "asr.fit", *CHAR_FRAMES, "--model.encoder.block", "conformer", "--model.encoder.conv_kernel", "7",
           "--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
           "--model.schedule.warmup_steps", "10",
           "--data.tokenizer.type", "char", "--data.train_manifest", str(manifest), "--data.val_manifest",
           str(manifest), "--data.test_manifest", str(manifest), "--data.num_workers", "0", "--trainer.max_epochs", "3",
           "--trainer.logger.init_args.save_dir", str(tmp_path)]
    result = subprocess.run(fit, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "default" / "version_0"
    losses = epoch_losses(run)
    assert len(losses) == 3 and losses[-1] < losses[0]
    out = tmp_path / "hyps.jsonl"
    transcribe = [sys.executable, "-m", "asr.transcribe", "--checkpoint", str(run / "checkpoints" / "last.ckpt"),
                  str(manifest), "--output", str(out)]
    result = subprocess.run(transcribe, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(out.read_text().splitlines()) == 48 and "WER" in result.stdout


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_conformer_presets_state_their_parameter_count_and_match_the_transformer_of_their_size(size, char_tokenizer,
                                                                                              tmp_path):
    import re

    from asr.bench.steps import build_module

    char_tokenizer.save(tmp_path / "tokenizer.model")
    tokenizer = f"--data.tokenizer.model={tmp_path / 'tokenizer.model'}"

    def parameters(module) -> int:
        return sum(p.numel() for p in module.parameters())

    header = (CONFIGS / "model" / f"conformer-{size}.yaml").read_text().splitlines()[0]
    stated = float(re.search(r"([\d.]+)M parameters", header).group(1))
    conformer = build_module(f"conformer-{size}", tokenizer)  # each build of the base preset takes seconds: once
    assert conformer.model.encoder.cfg.block == "conformer"
    assert round(parameters(conformer) / 1e6, 1) == stated
    # conformer-tiny takes the default run's front end (8x at 48 channels); at tiny's own (4x at d_model) they match
    if size == "tiny":
        conformer = build_module("conformer-tiny", tokenizer, "--model.encoder.subsampling=4",
                                 "--model.encoder.conv_channels=0")
    assert abs(parameters(conformer) / parameters(build_module(size, tokenizer)) - 1) < 0.03


def test_conformer_trains_under_fsdp_in_bf16_with_checkpointing_and_transcribes(tmp_path):
    """2 processes on gloo, FSDP2 fully_shard per Conformer block (batch norm buffers included), with
    intermediate CTC: forward's middle flag runs through FSDP2's hooks on the sharded root without error."""
    from asr.inference.transcriber import Transcriber

    manifest = mini_slice(tmp_path, 32)
    command = [sys.executable, "-m", "asr.fit", "--config", "configs/strategy/fsdp.yaml", *CHAR_FRAMES,
               "--model.encoder.block", "conformer", "--model.encoder.conv_norm", "batch", "--model.encoder.conv_kernel", "7",
               "--model.encoder.d_model", "64", "--model.encoder.n_heads", "2", "--model.encoder.n_layers", "2",
               "--model.checkpoint_every", "1", "--model.inter_ctc", "0.3",
               "--trainer.precision", "bf16-mixed",
               "--model.schedule.warmup_steps", "5", "--data.tokenizer.type", "char", "--data.train_manifest", str(manifest),
               "--data.val_manifest", str(manifest), "--test", "false", "--data.num_workers", "0",
               "--trainer.max_epochs", "2", "--trainer.logger.init_args.save_dir", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "default" / "version_0"
    losses = epoch_losses(run)
    assert len(losses) == 2 and losses[1] < losses[0]
    module = Transcriber.from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert len(module.transcribe([MINI / "audio" / "test" / "000000.flac"])) == 1


@pytest.mark.parametrize("conv_norm, window", [("layer", 0), ("batch", 3)])
def test_a_conformer_exports_with_torch_export_and_matches_itself(tiny_model, waveforms, char_tokenizer, conv_norm,
                                                                   window):
    from asr.inference.exported import ExportedModel
    from asr.tools import exporting

    model = tiny_model(block="conformer", conv_norm=conv_norm, attention_window=window)
    model.train()(*waveforms(1.0, 0.6))  # running statistics away from their initial 0 and 1
    model.eval()
    program = exporting.export_program(exporting.serving_model(model), 16000)
    exported = ExportedModel(program.module(), 16000, char_tokenizer, model.frame_seconds,
                             exporting.min_samples(program, model), torch.device("cpu"))
    assert exporting.parity(model, exported).ok  # batches of 1 to 4 utterances, one graph


def test_the_middle_output_is_the_first_halfs_last_block_and_one_block_has_none(tiny_model, waveforms):
    model = tiny_model(n_layers=4).eval()
    states = []
    model.encoder.blocks[1].register_forward_hook(lambda _m, _args, out: states.append(out))
    audio, lengths = waveforms(0.9, 0.5)
    with torch.no_grad():
        _, _, middle = model(audio, lengths, middle=True)
    torch.testing.assert_close(middle, model.log_probs(states[0]))
    with pytest.raises(ValueError, match="at least 2 blocks"):
        tiny_model(n_layers=1)(audio, lengths, middle=True)
