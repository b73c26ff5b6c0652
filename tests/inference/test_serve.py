"""asr.serve (asr.inference.serve) with a real WebSocket client on 127.0.0.1, at a port the system chooses: the
protocol's round trip, models of several sample rates, the refusal past the stream limit, clients that hang up or
break the protocol, a small load test, and the command as documented. Every test has a timeout and stops its server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from websockets.asyncio.client import connect

from asr.bench.streaming import Heard, listen, pcm16, percentile, receive
from asr.inference import serve
from asr.inference.acoustic import CheckpointModel
from asr.inference.serve import StreamServer
from asr.inference.transcribe import Transcriber
from tests import REPO
from tests.conftest import save_checkpoint
from tests.streams import RATE, speech_and_pauses, streaming_module

TIMEOUT = 60.0  # seconds any one test's conversation may take


@pytest.fixture(scope="module")
def transcriber(char_tokenizer):
    return Transcriber(CheckpointModel(streaming_module(char_tokenizer)))


@pytest.fixture(autouse=True)
def one_thread(keep_threads):
    torch.set_num_threads(1)  # as asr.serve runs its steps


def talk(server: StreamServer, conversation):
    """Run ``conversation(uri)`` against ``server`` listening on 127.0.0.1 at a free port, with TIMEOUT; the server
    stops afterwards whatever happened."""

    async def main():
        async with server.serve("127.0.0.1", 0) as ws:
            uri = "ws://127.0.0.1:%d" % ws.sockets[0].getsockname()[1]
            return await asyncio.wait_for(conversation(uri), TIMEOUT)

    try:
        return asyncio.run(main())
    finally:
        server.close()


def heard_audio() -> np.ndarray:
    """speech_and_pauses as the 16-bit PCM the client sends decodes back."""
    return np.frombuffer(pcm16(speech_and_pauses().numpy()), "<i2").astype(np.float32) / 32768


def test_a_stream_round_trip_gives_the_finals_of_the_api(transcriber):
    audio = speech_and_pauses().numpy()
    heard = talk(StreamServer([transcriber], workers=2), lambda uri: listen(uri, audio, RATE, realtime=False))
    expected = [u.to_json() for u in transcriber.stream([torch.from_numpy(heard_audio())]) if u.final]
    assert heard.ready == {"type": "ready", "sample_rate": RATE, "model_sample_rate": RATE, "chunk_seconds": 0.08,
                           "frame_seconds": 0.04}
    assert expected and heard.finals == expected and heard.code == 1000 and not heard.errors
    assert any(r["type"] == "partial" for r in heard.results)
    assert len(heard.latencies) == round(len(audio) / RATE / 0.04)  # every frame covered by a result


def test_each_rate_goes_to_its_model_or_is_resampled_to_the_nearest(transcriber, char_tokenizer):
    telephone = Transcriber(CheckpointModel(streaming_module(char_tokenizer, rate=8000)))
    server = StreamServer([transcriber, telephone], workers=2)
    assert [server.model_for(rate).sample_rate for rate in (8000, 11025, 16000, 44100, 4000)] == \
        [8000, 8000, 16000, 16000, 8000]

    async def conversation(uri):
        return [await listen(uri, speech_and_pauses(rate=rate).numpy()[: rate], rate, realtime=False)
                for rate in (8000, 22050)]

    phone, wideband = talk(server, conversation)
    assert phone.ready["model_sample_rate"] == 8000 and wideband.ready["model_sample_rate"] == 16000
    assert phone.code == wideband.code == 1000 and phone.latencies and wideband.latencies


def test_a_stream_past_the_limit_is_refused_and_served_once_one_ends(transcriber):
    server = StreamServer([transcriber], max_streams=1, workers=2)
    audio = speech_and_pauses().numpy()[: 2 * RATE]

    async def conversation(uri):
        first = asyncio.create_task(listen(uri, audio, RATE))  # real time: 2 s
        await asyncio.sleep(0.5)
        refused = await listen(uri, audio, RATE, realtime=False)
        await first
        return refused, first.result(), await listen(uri, audio, RATE, realtime=False)

    refused, first, later = talk(server, conversation)
    assert refused.code == 1013 and refused.ready is None and not refused.results
    assert refused.errors == ["busy: this server holds its limit of 1 streams; try again later"]
    assert first.code == later.code == 1000 and first.ready and later.ready and server.active == 0


def test_a_client_that_hangs_up_mid_stream_frees_its_place(transcriber):
    server = StreamServer([transcriber], max_streams=1, workers=2)
    audio = speech_and_pauses().numpy()

    async def conversation(uri):
        gone = await listen(uri, audio, RATE, hang_up_after=1.0)  # real time: the server is mid-stream
        for _ in range(100):  # the server notices the dropped connection
            if server.active == 0:
                break
            await asyncio.sleep(0.05)
        return gone, server.active, await listen(uri, audio[: RATE], RATE, realtime=False)

    gone, active, next_client = talk(server, conversation)
    assert gone.ready and gone.code != 1000 and active == 0
    assert next_client.code == 1000 and next_client.ready and not next_client.errors


@pytest.mark.parametrize("first, then, message", [
    ('{"type": "hello"}', None, "the first message must be"),
    ('{"type": "start", "sample_rate": 1000}', None, "integer from 4000 to 192000"),
    ('{"type": "start", "sample_rate": 16000, "chunk_seconds": 0.05}', None, "whole number of the model's"),
    ('{"type": "start", "sample_rate": 16000}', b"\x00\x01\x02", "whole 16-bit samples"),
    ('{"type": "start", "sample_rate": 16000}', "stop", "not a JSON object"),
])
def test_a_message_the_protocol_does_not_allow_gets_an_error_and_close_1008(transcriber, first, then, message):
    async def conversation(uri):
        async with connect(uri) as ws:
            await ws.send(first)
            if then is not None:
                await ws.send(then)
            heard = Heard()
            await receive(ws, heard)
            return heard, ws.close_code

    heard, code = talk(StreamServer([transcriber], workers=1), conversation)
    assert code == 1008 and len(heard.errors) == 1 and message in heard.errors[0]


def test_a_connection_without_a_start_message_is_closed(transcriber, monkeypatch):
    monkeypatch.setattr(serve, "START_SECONDS", 0.2)

    async def conversation(uri):
        async with connect(uri) as ws:
            heard = Heard()
            await receive(ws, heard)
            return heard, ws.close_code

    heard, code = talk(StreamServer([transcriber], workers=1), conversation)
    assert code == 1008 and heard.errors == ["no start message within 0.2 s"]


def test_concurrent_real_time_streams_are_all_served_and_their_latency_measured(transcriber):
    """A small load test: 4 streams of 2 s at real speed at once; each gets its results and an orderly close, and
    every frame's latency is measured (the figures themselves are the benchmark's: asr.bench.streaming)."""
    audio = speech_and_pauses().numpy()[: 2 * RATE]

    async def conversation(uri):
        return await asyncio.gather(*(listen(uri, audio, RATE) for _ in range(4)))

    runs = talk(StreamServer([transcriber], max_streams=4, workers=2), conversation)
    assert all(run.code == 1000 and run.results and not run.errors for run in runs)
    latencies = [latency for run in runs for latency in run.latencies]
    # every frame up to the last result: the second's silence at the end has no final (no text) to cover it
    assert len(latencies) >= 4 * 25 and all(np.isfinite(latencies)) and percentile(latencies, 95) > 0


def test_serve_refuses_a_model_that_cannot_stream(checkpoint, capsys):
    assert serve.main(["--checkpoint", str(checkpoint), "--port", "0"]) == 2
    assert "cannot stream" in capsys.readouterr().err


def test_the_documented_command_serves_until_interrupted(char_tokenizer, tmp_path):
    """``python -m asr.serve --checkpoint C --port 0``: it says where it listens, a client is served, Ctrl-C stops it."""
    path = save_checkpoint(streaming_module(char_tokenizer), tmp_path / "streaming.ckpt")
    process = subprocess.Popen([sys.executable, "-m", "asr.serve", "--checkpoint", str(path), "--port", "0"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # (the test's timeout: the process is killed below whatever happens)
        port = int(re.search(r"ws://127\.0\.0\.1:(\d+) \(16000 Hz; at most 8 streams\)", line).group(1))
        audio = speech_and_pauses().numpy()[: RATE]
        heard = asyncio.run(asyncio.wait_for(listen(f"ws://127.0.0.1:{port}", audio, RATE, realtime=False), TIMEOUT))
        assert heard.code == 1000 and heard.ready["sample_rate"] == RATE
        process.send_signal(2)  # SIGINT, Ctrl-C
        assert process.wait(timeout=30) == 0 and "stopped" in process.stderr.read()
    finally:
        process.kill()
        process.wait(timeout=30)
