"""asr.bench.streaming --quick on a tiny streaming checkpoint: every section runs and its rows say what they
measured (the figures themselves are the lead's to take on a quiet machine: docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
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
    assert [row["algorithmic_s"] for row in results["wer"][:3]] == [row["algorithmic_s"] for row in results["latency"]]
    assert all(row["rtf"] > 0 for row in results["rtf"])
    streams = results["streams"]  # the load test ran against python -m asr.serve in a process of its own
    assert streams["levels"][0]["streams"] == 1 and streams["chunk_s"] == 0.32 and streams["held"] in (0, 1, 2)
    assert all(level["failed"] == 0 for level in streams["levels"])
    assert results["memory"]["readings"] and results["memory"]["audio_s"] == 4.0
    assert torch.get_num_threads() >= 1 and "real-time streams held" in streaming.table(results)


def test_a_chunk_that_is_not_whole_frames_is_skipped_and_said(char_tokenizer, capsys):
    from asr.inference.acoustic import CheckpointModel
    from asr.inference.transcriber import Transcriber

    transcriber = Transcriber(CheckpointModel(streaming_module(char_tokenizer)))
    assert streaming.chunk_frames_of(transcriber, (0.16, 0.1)) == [(0.16, 4)]
    assert "chunk 0.1 s skipped" in capsys.readouterr().err


def test_the_load_test_ramps_until_a_count_misses_the_target_and_holds_the_count_before(monkeypatch):
    """measure_streams with a stand-in client whose latency grows 0.1 s per stream at once: 1, 2 and 4 streams keep
    p95 <= 0.5 s, 8 do not; it stops there (12 and 16 are not tried) and holds 4."""
    at_once, peak = [0], [0]

    async def client(uri, audio, sample_rate, chunk_seconds=None):
        at_once[0] += 1
        peak[0] = max(peak[0], at_once[0])
        await asyncio.sleep(0.05)  # every caller of a count is in by then (their starts spread over 1 ms)
        heard = streaming.Heard(code=1000, latencies=[0.1 * peak[0]] * 10)
        at_once[0] -= 1
        peak[0] = peak[0] if at_once[0] else 0
        return heard

    monkeypatch.setattr(streaming, "listen", client)
    result = asyncio.run(streaming.measure_streams("ws://unused", None, 16000, 0.001, [1, 2, 4, 8, 12, 16]))
    assert [level["streams"] for level in result["levels"]] == [1, 2, 4, 8] and result["held"] == 4
    assert result["levels"][3]["p95_s"] == pytest.approx(0.8) and "8 streams at 0.001 s: p50 0.800 s, p95 0.800 s" in \
        streaming.table({"cpu": "x", "checkpoint": "c", "streams": result})
