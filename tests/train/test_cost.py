"""asr.train.cost: FLOP counts, padding, projections, peak FLOP/s, and the CostMonitor in a real (tiny) fit."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from asr.data.batch import Batch
from asr.models.ctc import CTCModel
from asr.models.features import FeatureConfig
from asr.models.transducer import TransducerConfig, TransducerModel
from asr.tokenizer import Tokenizer
from asr.train import cost
from asr.train.module import ASRModule
from tests.conftest import encoder as tiny_encoder


def tiny(sample_rate: int = 16000, conv_channels: int = 0, attention_window: int = 0, **block) -> CTCModel:
    features = FeatureConfig(sample_rate)
    cfg = tiny_encoder(d_model=8, n_heads=2, n_layers=2, ff_mult=2, conv_channels=conv_channels,
                       attention_window=attention_window, **block)
    return CTCModel(features, cfg, vocab_size=5).eval()


HOP = 160  # samples per feature frame at 16 kHz


def test_forward_flops_match_a_hand_count():
    # 80 mel bins, d=8, ff 16, vocab 5, 2 blocks, x4 subsampling; 20 feature frames.
    # conv1: 1 -> 8 channels, 3x3: time (20-1)//2 = 9, freq (80-1)//2 = 39 -> 2*9*39*8*(1*9) = 50544
    # conv2: 8 -> 8 channels, 3x3: time (9-1)//2 = 4, freq (39-1)//2 = 19 -> 2*4*19*8*(8*9) = 87552
    # out linear 8*19 = 152 -> 8 over 4 frames: 2*4*152*8 = 9728
    # a block over T' = 4: qkv 2*4*8*24 = 1536, proj 2*4*8*8 = 512, ff 2 * 2*4*8*16 = 2048,
    #   attention 2 * 2*4*4*8 = 512 -> 4608; two blocks 9216
    # head 2*4*8*5 = 320
    # 6 frames run alone are padded to the 7 one encoder frame needs: conv1 (7-1)//2 = 3 frames,
    # 2*3*39*8*9 = 16848; conv2 1 frame, 2*1*19*8*72 = 21888; out 2*1*152*8 = 2432;
    # a block over T' = 1: 384 + 128 + 512 + 2*2*1*1*8 = 1056, two 2112; head 2*1*8*5 = 80
    flops = tiny().forward_flops(torch.tensor([20 * HOP, 6 * HOP]))
    assert flops.tolist() == [50544 + 87552 + 9728 + 9216 + 320, 16848 + 21888 + 2432 + 2112 + 80]


def test_conformer_flops_match_a_hand_count():
    # as above up to the blocks (20 frames -> T' = 4: 50544 + 87552 + 9728), kernel 3, d 8, ff 16; per block:
    # two feed-forwards 2 * 2*4*(8*16 + 16*8) = 4096, qkv and proj 2*4*(24*8 + 8*8) = 2048, attention 512,
    # conv module: pointwise 2*4*8*16 = 1024, depthwise 2*4*8*3 = 192, pointwise 2*4*8*8 = 512 -> 8384
    flops = tiny(block="conformer", conv_kernel=3).forward_flops(torch.tensor([20 * HOP]))
    assert flops.tolist() == [50544 + 87552 + 9728 + 2 * 8384 + 320]


def test_windowed_attention_counts_only_the_keys_a_frame_may_see():
    # window 1: a frame of the T' = 4 above sees at most 3 keys, so a block's attention is
    # 2*2*4*3*8 = 384 FLOPs, not 512; two blocks count 256 fewer
    flops = tiny(attention_window=1).forward_flops(torch.tensor([20 * HOP]))
    assert flops.tolist() == [50544 + 87552 + 9728 + 9216 - 256 + 320]


@pytest.mark.parametrize("conv_channels, block", [(0, {}), (3, {}), (0, {"block": "conformer", "conv_kernel": 5}),
                                                   (0, {"block": "conformer", "conv_norm": "batch"}),
                                                   (3, {"subsampling_conv": "separable"}),
                                                   (4, {"subsampling_conv": "separable", "subsampling": 8})])
def test_forward_flops_agree_with_torch_flop_counter_on_a_padded_batch(conv_channels, block):
    model = tiny(8000, conv_channels, **block)  # linear features: the front end has no matrix product to count
    lengths = torch.tensor([8000, 5000])  # 100 and 62 feature frames
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # math SDPA: countable bmm
        model(torch.randn(2, 8000), lengths)
    batch = Batch(torch.randn(2, 8000), lengths, torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 2]), ["a", "b"])
    counts = dict(zip(cost.COUNTS, cost.batch_counts(batch, model).tolist()))
    assert counts["padded_flops"] == counter.get_total_flops()
    assert counts["flops"] == model.forward_flops(lengths).sum()


@pytest.mark.parametrize("ctc_head", [False, True])
def test_a_transducers_flops_count_its_prediction_network_and_joiner_over_the_lattice(ctc_head):
    """torch's FlopCounterMode sees every matrix product of a training forward but the LSTM's (aten.lstm): with that
    added, the transducer's own count of the padded batch is the executed FLOPs."""
    cfg = TransducerConfig(pred_dim=16, joint_dim=24)
    model = TransducerModel(FeatureConfig(8000), tiny_encoder(ff_mult=2), 12, cfg, ctc_head).eval()
    lengths, tokens, token_lengths = torch.tensor([8000, 5000]), torch.tensor([[3, 4, 5], [6, 7, 0]]), torch.tensor([3, 2])
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 8000), lengths, targets=tokens, target_lengths=token_lengths)
    lstm = 2 * (3 + 1) * 2 * 4 * 16 * (16 + 16)  # 2 utterances, 4 contexts each, 4 gates of (input + hidden) x 16
    batch = Batch(torch.randn(2, 8000), lengths, tokens, token_lengths, ["a", "b"])
    counts = dict(zip(cost.COUNTS, cost.batch_counts(batch, model).tolist()))
    assert counts["padded_flops"] == counter.get_total_flops() + lstm
    assert counts["flops"] == model.forward_flops(lengths, token_lengths).sum() < counts["padded_flops"]


def test_padding_and_rates_of_a_constructed_batch():
    model = tiny()
    audio = torch.zeros(3, 16000)  # padded to 1 s; utterances of 1, 0.5 and 0.25 s
    batch = Batch(audio, torch.tensor([16000, 8000, 4000]), torch.ones(3, 4, dtype=torch.long),
                  torch.tensor([4, 2, 1]), ["a", "b", "c"])
    counts = dict(zip(cost.COUNTS, cost.batch_counts(batch, model).tolist()))
    figures = cost.rates(counts, seconds=0.5, sample_rate=16000, peak_flops=1e9)
    assert figures["padding"] == pytest.approx((0 + 8000 + 12000) / 48000)
    assert figures["x_real_time"] == pytest.approx(1.75 / 0.5)
    assert figures["utterances_per_s"] == 6 and figures["tokens_per_s"] == 14
    useful = model.forward_flops(torch.tensor([16000, 8000, 4000])).sum().item()
    assert figures["mfu"] == pytest.approx(3 * useful / 0.5 / 1e9)
    padded = 3 * model.forward_flops(torch.tensor([16000])).item()
    assert figures["padding_flops"] == pytest.approx(1 - useful / padded)


def test_projection_of_wall_time_device_hours_and_cost():
    run = cost.project(step_seconds=1.8, total_steps=10_000, devices=8, price_per_device_hour=2.5)
    assert run.wall_hours == pytest.approx(5.0)  # 18,000 s
    assert run.device_hours == pytest.approx(40.0)
    assert run.cost == pytest.approx(100.0)


def test_peak_table_picks_the_figure_for_the_precision():
    a100 = "NVIDIA A100-SXM4-80GB"
    assert cost.gpu_peak_flops(a100, cost.compute_dtype("bf16-mixed")) == 312e12
    assert cost.gpu_peak_flops(a100, cost.compute_dtype("32-true", "highest")) == 19.5e12
    assert cost.gpu_peak_flops(a100, cost.compute_dtype("32-true", "high")) == 156e12  # tf32 allowed
    assert cost.gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == 756.5e12
    assert cost.gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12
    assert cost.gpu_peak_flops("NVIDIA L4", "fp16") == 121e12
    assert cost.gpu_peak_flops("NVIDIA L40S", "bf16") is None  # not the L4
    assert cost.gpu_peak_flops("Tesla T4", "fp16") == 65e12
    assert cost.gpu_peak_flops("Tesla T4", "bf16") is None  # no bf16 tensor cores
    assert cost.gpu_peak_flops("Tesla V100-SXM2-16GB", "tf32") == 15.7e12  # no tf32: plain fp32
    assert cost.gpu_peak_flops("NVIDIA GeForce RTX 3090 Ti", "bf16") is None


def test_cpu_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(cost, "PEAK_CACHE", tmp_path / "asr" / "peak_flops.json")
    monkeypatch.setattr(cost, "measure_matmul_flops", lambda dtype: measured.append(dtype) or 123e9)
    assert cost.cpu_peak_flops("bf16") == 123e9
    assert cost.cpu_peak_flops("bf16") == 123e9
    assert measured == [torch.bfloat16]
    (key, value), = json.loads((tmp_path / "asr" / "peak_flops.json").read_text()).items()
    assert value == 123e9 and cost.cpu_name() in key and torch.__version__ in key and key.endswith("bf16")
    assert cost.cpu_peak_flops("fp32") == 123e9 and measured == [torch.bfloat16, torch.float32]


def test_cost_metrics_appear_in_a_short_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "PEAK_CACHE", tmp_path / "peak_flops.json")
    texts = ["abc", "cab", "bca", "ab"]
    tokenizer = Tokenizer.train(texts, "char")
    torch.manual_seed(0)
    module = ASRModule(tokenizer=tokenizer, encoder=tiny_encoder(n_heads=2, n_layers=1), inter_ctc=0.0)

    def batch(seconds: list[float], words: list[str]) -> Batch:
        audio = [torch.randn(int(s * 16000)) * 0.1 for s in seconds]
        tokens = [torch.tensor(tokenizer.encode(w)) for w in words]
        pad = torch.nn.utils.rnn.pad_sequence
        return Batch(pad(audio, batch_first=True), torch.tensor([len(a) for a in audio]),
                     pad(tokens, batch_first=True), torch.tensor([len(t) for t in tokens]), words)

    batches = [batch([0.5, 0.4], texts[:2]), batch([0.6, 0.3], texts[2:])]
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, log_every_n_steps=1, logger=CSVLogger(tmp_path),
                         callbacks=[cost.CostMonitor(price_per_device_hour=3.0)], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("cost/")}
    assert 0 < metrics["cost/mfu"] <= 1 and 0 < metrics["cost/mfu_epoch"] <= 1
    assert metrics["cost/x_real_time"] > 0 and metrics["cost/x_real_time_epoch"] > 0
    assert metrics["cost/padding_epoch"] == pytest.approx((0.1 + 0.3) / (0.5 * 2 + 0.6 * 2))
    assert 0 <= metrics["cost/data_wait"] < 1
    assert metrics["cost/run_device_hours"] == pytest.approx(metrics["cost/run_hours"])
    assert metrics["cost/run_cost"] == pytest.approx(3.0 * metrics["cost/run_hours"])
    assert metrics["cost/step_seconds"] > 0 and "cost/run_hours_epoch" not in metrics
    assert (tmp_path / "peak_flops.json").is_file()
    logged = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"cost/x_real_time", "cost/mfu", "cost/mfu_epoch", "cost/run_cost"} <= set(logged)


def test_cost_monitor_counts_any_module_that_reports_its_flops():
    class Counted(pl.LightningModule):
        sample_rate = 8000

        def forward_flops(self, num_samples: torch.Tensor) -> torch.Tensor:
            return 10 * num_samples

    module = Counted()
    assert cost.counted(module) is module  # no .model: the module itself
    batch = Batch(torch.zeros(2, 800), torch.tensor([800, 400]), torch.ones(2, 1, dtype=torch.long),
                  torch.tensor([1, 1]), ["a", "b"])
    counts = dict(zip(cost.COUNTS, cost.batch_counts(batch, module).tolist()))
    assert counts["flops"] == 12000 and counts["padded_flops"] == 16000
    with pytest.raises(TypeError, match=r"CostMonitor counts the FLOPs of LightningModule: it needs forward_flops"):
        cost.counted(pl.LightningModule())
