"""asr.bench.presets: every size preset's parameters and FLOPs from its shapes, on the meta device, as the model
asr.fit builds would count them; the GPU presets' front ends no longer cost as much as their blocks (issue 43)."""

import math

import pytest
import torch

from asr.bench.presets import main, model_of
from asr.configs import CONFIGS

RECIPE = CONFIGS / "recipes" / "gpu-100h.yaml"


def test_a_preset_built_on_meta_counts_what_the_same_model_built_for_real_counts():
    meta = model_of(RECIPE, CONFIGS / "model" / "conformer-large.yaml")
    cfg = meta.encoder.cfg
    assert (cfg.block, cfg.subsampling, cfg.subsampling_conv, cfg.conv_channels) == ("conformer", 8, "separable", 256)
    real = type(meta)(meta.features.config, cfg, meta.head.out_features)
    assert sum(p.numel() for p in real.parameters()) == sum(p.numel() for p in meta.parameters())
    samples = torch.tensor([15 * 16000])
    assert torch.equal(real.forward_flops(samples), meta.forward_flops(samples))


def test_every_preset_has_a_row_and_no_front_end_costs_a_fifth_of_its_model(capsys):
    main([])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [r[0].strip("| ") for r in rows[1:]]
    assert sorted(names) == sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
    shares = {name: float(r[4].rstrip("%")) / 100 for name, r in zip(names, rows[1:])}
    for name in ("large", "xl", "conformer-large", "conformer-xl", "conformer-1b", "xxl"):
        assert shares[name] < 0.2, (name, shares[name])
    parameters = {name: float(r[2].rstrip("M").replace(",", "")) for name, r in zip(names, rows[1:])}
    assert parameters["conformer-1b"] > 1000 and parameters["xxl"] > 1000


def test_the_audio_a_gpu_trains_on_and_the_workers_that_feed_it_follow_from_the_hours(capsys):
    main(["--worker_audio_per_second", "500"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    for r in rows[1:]:
        hours, consumed, workers = float(r[6]), float(r[7].replace(",", "")), int(r[8].strip(" |"))
        assert consumed == pytest.approx(1000 / hours, rel=0.05)  # 1,000 h of audio in that many GPU-hours
        assert workers == math.ceil(consumed / 500)
