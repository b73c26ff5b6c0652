"""asr.bench.streaming --quick on a tiny streaming checkpoint: every section runs and its rows say what they
measured (the figures themselves are the lead's to take on a quiet machine: docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest
import torch

from asr.bench import streaming
from tests.conftest import save_checkpoint
from tests.streams import streaming_module


def test_quick_measures_every_section_on_a_tiny_checkpoint(corpus, char_tokenizer, checkpoint, tmp_path, keep_threads):
    path = save_checkpoint(streaming_module(char_tokenizer), tmp_path / "streaming.ckpt")
    out = tmp_path / "streaming.json"
    results = streaming.main(["--checkpoint", str(path), "--manifest", str(corpus.dev), "--offline", str(checkpoint),
                              "--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [row["chunk_s"] for row in results["latency"]] == [0.16, 0.32, 0.64]
    for row in results["latency"]:  # the chunk and the 25 ms window's 15 ms past its hop
        assert row["algorithmic_s"] == pytest.approx(row["chunk_s"] + 0.015)
        assert row["p95_s"] is None or row["p95_s"] >= row["p50_s"] >= 0
    assert [row["model"] for row in results["wer"]] == ["streaming 0.16 s", "streaming 0.32 s", "streaming 0.64 s",
                                                        "streaming full context", "offline"]
    assert all(row["rtf"] > 0 for row in results["rtf"]) and results["streams"]["levels"][0]["streams"] == 1
    assert results["memory"]["readings"] and results["memory"]["audio_s"] == 4.0
    assert torch.get_num_threads() >= 1 and "real-time streams held" in streaming.table(results)


def test_a_chunk_that_is_not_whole_frames_is_skipped_and_said(char_tokenizer, capsys):
    from asr.inference.acoustic import CheckpointModel
    from asr.inference.transcribe import Transcriber

    transcriber = Transcriber(CheckpointModel(streaming_module(char_tokenizer)))
    assert streaming.chunk_frames_of(transcriber, (0.16, 0.1)) == [(0.16, 4)]
    assert "chunk 0.1 s skipped" in capsys.readouterr().err
