"""asr.serve (asr.inference.serving) with a real WebSocket client on 127.0.0.1, at a port the system chooses: the
protocol's round trip, models of several sample rates, the refusal past the stream limit, clients that hang up or
break the protocol, concurrent clients stepped together, an event loop that never waits for the model, a failing
model, a client faster than the model (backpressure), a small real-time load test, and the command as documented
(and on a port in use). Every test has a timeout and stops its server.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from websockets.asyncio.client import connect

from asr.bench.streaming import Heard, listen, pcm16, percentile, receive
from asr.inference import serving
from asr.inference.acoustic import CheckpointModel
from asr.inference.batched import feed_together
from asr.inference.serving import StreamServer
from asr.inference.transcriber import Transcriber
from tests import REPO
from tests.conftest import save_checkpoint
from tests.streams import RATE, batch_sizes, speech_and_pauses, streaming_module

TIMEOUT = 60.0  # seconds any one test's conversation may take

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/inference/conftest.py




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


def heard_audio(audio: np.ndarray | None = None) -> np.ndarray:
    """``audio`` (speech_and_pauses if None) as the 16-bit PCM the client sends decodes back."""
    audio = speech_and_pauses().numpy() if audio is None else audio
    return np.frombuffer(pcm16(audio), "<i2").astype(np.float32) / 32768


def test_a_stream_round_trip_gives_the_finals_of_the_api(streaming_transcriber):
    audio = speech_and_pauses().numpy()
    heard = talk(StreamServer([streaming_transcriber], threads=1), lambda uri: listen(uri, audio, RATE, realtime=False))
    expected = [u.to_json() for u in streaming_transcriber.stream([torch.from_numpy(heard_audio())]) if u.final]
    assert heard.ready == {"type": "ready", "sample_rate": RATE, "model_sample_rate": RATE, "chunk_seconds": 0.08,
                           "frame_seconds": 0.04}
    assert expected and heard.finals == expected and heard.code == 1000 and not heard.errors
    assert any(r["type"] == "partial" for r in heard.results)
    assert len(heard.latencies) == round(len(audio) / RATE / 0.04)  # every frame covered by a result


def test_each_rate_goes_to_its_model_or_is_resampled_to_the_nearest(streaming_transcriber, char_tokenizer):
    telephone = Transcriber(CheckpointModel(streaming_module(char_tokenizer, rate=8000)))
    server = StreamServer([streaming_transcriber, telephone], threads=1)
    assert [server.model_for(rate).sample_rate for rate in (8000, 11025, 16000, 44100, 4000)] == \
        [8000, 8000, 16000, 16000, 8000]

    async def conversation(uri):
        return [await listen(uri, speech_and_pauses(rate=rate).numpy()[: rate], rate, realtime=False)
                for rate in (8000, 22050)]

    phone, wideband = talk(server, conversation)
    assert phone.ready["model_sample_rate"] == 8000 and wideband.ready["model_sample_rate"] == 16000
    assert phone.code == wideband.code == 1000 and phone.latencies and wideband.latencies


def test_a_stream_past_the_limit_is_refused_and_served_once_one_ends(streaming_transcriber):
    server = StreamServer([streaming_transcriber], max_streams=1, threads=1)
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


def test_a_client_that_hangs_up_mid_stream_frees_its_place(streaming_transcriber):
    server = StreamServer([streaming_transcriber], max_streams=1, threads=1)
    audio = speech_and_pauses().numpy()

    async def conversation(uri):
        gone = await listen(uri, audio, RATE, hang_up_after=1.0)  # real time: the server is mid-stream
        for _ in range(100):  # the server notices the dropped connection
            if server.active == 0:
                break
            await asyncio.sleep(0.05)
        return gone, server.active, await listen(uri, audio[: RATE], RATE, realtime=False)

    gone, active, next_client = talk(server, conversation)
    assert gone.ready and gone.code != 1000 and active == 0 and not server.streams
    assert next_client.code == 1000 and next_client.ready and not next_client.errors


@pytest.mark.parametrize("first, then, message", [
    ('{"type": "hello"}', None, "the first message must be"),
    ('{"type": "start", "sample_rate": 1000}', None, "integer from 4000 to 192000"),
    ('{"type": "start", "sample_rate": 16000, "chunk_seconds": 0.05}', None, "whole number of the model's"),
    ('{"type": "start", "sample_rate": 16000}', b"\x00\x01\x02", "whole 16-bit samples"),
    ('{"type": "start", "sample_rate": 16000}', "stop", "not a JSON object"),
    ('{"type": "start", "sample_rate": 16001}', None, "sample_rate: 16001 Hz cannot be resampled to 16000 Hz"),
    ('{"type": "start", "sample_rate": 16000, "chunk_seconds": 3600}', None, "must be over 0 and at most 2 s"),
    ('{"type": "start", "sample_rate": 16000, "chunk_seconds": Infinity}', None, "a start message's chunk_seconds"),
    ('{"type": "start", "sample_rate": 16000, "chunk_seconds": "0.08"}', None, "chunk_seconds must be a number"),
    pytest.param('{"type": "' + "开始" * 40 + '"}', None, "the first message must be", id="a long type in CJK"),
    pytest.param("开始" * 100, None, "not a JSON object", id="CJK text"),
    pytest.param("[" * 100000, None, "not a JSON object", id="nested too deep"),
])
def test_a_message_the_protocol_does_not_allow_gets_an_error_and_close_1008(streaming_transcriber, first, then,
                                                                            message):
    """Each gets its error message and close 1008 with the message as its reason, cut to the 123 bytes a close
    reason may hold (never mid-character): an odd rate before any resampling filter is built, a chunk too long or
    infinite, text of many-byte characters, JSON nested too deep to parse."""
    async def conversation(uri):
        async with connect(uri, max_size=2 ** 20) as ws:
            await ws.send(first)
            if then is not None:
                await ws.send(then)
            heard = Heard()
            await receive(ws, heard)
            return heard, ws.close_code, ws.close_reason

    heard, code, reason = talk(StreamServer([streaming_transcriber], threads=1), conversation)
    assert code == 1008 and len(heard.errors) == 1 and message in heard.errors[0]
    assert reason and len(reason.encode()) <= 123 and heard.errors[0].startswith(reason)


def test_a_connection_without_a_start_message_is_closed(streaming_transcriber, monkeypatch):
    monkeypatch.setattr(serving, "START_SECONDS", 0.2)

    async def conversation(uri):
        async with connect(uri) as ws:
            heard = Heard()
            await receive(ws, heard)
            return heard, ws.close_code

    heard, code = talk(StreamServer([streaming_transcriber], threads=1), conversation)
    assert code == 1008 and heard.errors == ["no start message within 0.2 s"]


def test_concurrent_real_time_streams_are_all_served_and_their_latency_measured(streaming_transcriber):
    """A small load test: 4 streams of 3 s of their own audio at real speed, started 0.13 s apart (so at different
    positions when the rounds step them together): each gets the finals the API gives its audio alone and an
    orderly close, and every frame's latency is measured (the figures are the benchmark's: asr.bench.streaming)."""
    audio = [speech_and_pauses(seed).numpy()[: 3 * RATE] for seed in range(4)]
    expected = [[u.to_json() for u in streaming_transcriber.stream([torch.from_numpy(heard_audio(a))]) if u.final]
                for a in audio]

    async def caller(uri, i):
        await asyncio.sleep(0.13 * i)
        return await listen(uri, audio[i], RATE)

    async def conversation(uri):
        return await asyncio.gather(*(caller(uri, i) for i in range(4)))

    runs = talk(StreamServer([streaming_transcriber], max_streams=4, threads=1), conversation)
    assert all(run.code == 1000 and run.results and not run.errors for run in runs)
    assert [run.finals for run in runs] == expected and all(expected)
    latencies = [latency for run in runs for latency in run.latencies]
    # every frame up to the last result: silence at the end has no final (no text) to cover it
    assert len(latencies) >= 4 * 25 and all(np.isfinite(latencies)) and percentile(latencies, 95) > 0



async def held_until(gate: threading.Event, ready, seconds: float = TIMEOUT) -> None:
    """Open ``gate`` once ``ready()`` holds (polled), or after ``seconds`` whatever happened."""
    for _ in range(round(seconds / 0.02)):
        if ready():
            break
        await asyncio.sleep(0.02)
    gate.set()


def test_concurrent_clients_each_get_their_own_finals_from_shared_steps(streaming_transcriber, monkeypatch):
    """8 clients at once, each with its own audio, sent as fast as it goes: each gets exactly the finals the API
    gives its audio alone and an orderly close. The model thread is held until all 8 have sent everything, so the
    rounds after it hold all 8 streams: their encoder steps are shared (batches of 8)."""
    streams = 8
    audio = [speech_and_pauses(seed).numpy()[: 3 * RATE] for seed in range(streams)]
    expected = [[u.to_json() for u in streaming_transcriber.stream([torch.from_numpy(heard_audio(a))]) if u.final]
                for a in audio]
    server = StreamServer([streaming_transcriber], max_streams=streams, threads=1)
    sizes, gate = batch_sizes(streaming_transcriber.streaming_model.network, monkeypatch), threading.Event()
    server.model_thread.submit(gate.wait, TIMEOUT)

    async def conversation(uri):
        everything_sent = lambda: len(server.streams) == streams and all(s.ended for s in server.streams)  # noqa: E731
        opening = asyncio.create_task(held_until(gate, everything_sent))
        runs = await asyncio.gather(*(listen(uri, a, RATE, realtime=False) for a in audio))
        await opening
        return runs

    runs = talk(server, conversation)
    assert all(run.code == 1000 and not run.errors for run in runs)
    assert [run.finals for run in runs] == expected and all(expected)
    assert max(sizes) == streams and sum(sizes) > 3 * len(sizes)  # most steps held several streams


def test_the_event_loop_answers_while_the_model_is_busy(streaming_transcriber):
    """With the model thread held, a client still connects, gets its ready message and sends all its audio: the
    event loop never waits for the model. Once the model is free, its results follow."""
    server, gate = StreamServer([streaming_transcriber], threads=1), threading.Event()
    server.model_thread.submit(gate.wait, TIMEOUT)

    async def conversation(uri):
        async with connect(uri) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            ready = json.loads(await asyncio.wait_for(ws.recv(), 5.0))
            await ws.send(pcm16(speech_and_pauses().numpy()[: RATE]))
            await ws.send(json.dumps({"type": "end"}))
            stream = next(iter(server.streams))
            for _ in range(250):  # the server reads the audio and the end message while the model is held
                if stream.ended:
                    break
                await asyncio.sleep(0.02)
            read_while_held = stream.ended and not gate.is_set()
            gate.set()
            heard = Heard()
            await receive(ws, heard)
            return ready, read_while_held, heard, ws.close_code

    ready, read_while_held, heard, code = talk(server, conversation)
    assert ready["type"] == "ready" and read_while_held
    assert code == 1000 and heard.results and heard.results[-1]["type"] == "final"


def test_a_client_faster_than_the_model_is_read_only_up_to_the_backlog(streaming_transcriber):
    """18 s sent in 1 s messages as fast as the client can while the model thread is held: the server holds at most
    BACKLOG_SECONDS of it (and one message), not the 18 s, then stops reading the connection; once the model is free
    the rest is read as rounds take it, and the client gets the finals the API gives its audio and an orderly close."""
    audio = np.tile(speech_and_pauses().numpy(), 3)
    expected = [u.to_json() for u in streaming_transcriber.stream([torch.from_numpy(heard_audio(audio))]) if u.final]
    server, gate, held = StreamServer([streaming_transcriber], threads=1), threading.Event(), []
    server.model_thread.submit(gate.wait, TIMEOUT)

    async def send_all(ws):
        data = pcm16(audio)
        for at in range(0, len(data), 2 * RATE):
            await ws.send(data[at: at + 2 * RATE])
        await ws.send(json.dumps({"type": "end"}))

    async def conversation(uri):
        async with connect(uri, max_size=2 ** 20) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
            heard = Heard()
            receiving, sending = asyncio.create_task(receive(ws, heard)), asyncio.create_task(send_all(ws))
            for _ in range(100):  # 2 s of the server reading what it will while the model is held
                held.append(max((stream.waiting for stream in server.streams), default=0))
                await asyncio.sleep(0.02)
            gate.set()
            await sending
            await receiving
            return heard, ws.close_code

    heard, code = talk(server, conversation)
    assert serving.BACKLOG_SECONDS * RATE <= max(held) <= (serving.BACKLOG_SECONDS + 1) * RATE
    assert code == 1000 and not heard.errors and heard.finals == expected and expected


def test_a_round_takes_the_oldest_audio_first_and_at_most_a_round_s_worth():
    stream = serving.Stream(session=None, resampler=None, rate=10)  # ROUND_SECONDS (1 s) is 10 samples
    for piece in (np.arange(0, 7), np.arange(7, 14), np.arange(0), np.arange(14, 21)):
        stream.add(piece.astype(np.int16))
    first, last = stream.take()
    assert first.tolist() == list(range(10)) and not last and stream.waiting == 11 and stream.due
    stream.ended = True
    second, last = stream.take()
    assert second.tolist() == list(range(10, 20)) and not last and stream.waiting == 1
    third, last = stream.take()
    assert third.tolist() == [20] and last and stream.waiting == 0 and not stream.due and not stream.pending


def test_a_round_the_model_fails_ends_its_streams_with_1011_and_the_server_goes_on(streaming_transcriber, monkeypatch):
    calls = []

    def failing_once(*args):
        if not calls:
            calls.append(1)
            raise RuntimeError("out of memory")
        return feed_together(*args)

    monkeypatch.setattr(serving, "feed_together", failing_once)
    audio = speech_and_pauses().numpy()[: RATE]

    async def conversation(uri):
        return [await listen(uri, audio, RATE, realtime=False) for _ in range(2)]

    failed, next_client = talk(StreamServer([streaming_transcriber], threads=1), conversation)
    assert failed.code == 1011 and failed.errors == ["the model failed on this stream: RuntimeError: out of memory"]
    assert next_client.code == 1000 and next_client.finals and not next_client.errors


def test_a_round_runs_when_a_stream_completes_a_chunk_not_on_every_message(streaming_transcriber, monkeypatch):
    """A client sending 2 s in 20 ms messages at real speed: the server runs a round once the audio of a chunk
    (80 ms) is there, about 25 and the end's, not one a message (100); each round before the end gives a partial."""
    rounds = []

    def counted(sessions, pieces, finals):
        updates = feed_together(sessions, pieces, finals)
        rounds.append(updates[0])
        return updates

    monkeypatch.setattr(serving, "feed_together", counted)
    audio = speech_and_pauses().numpy()[: 2 * RATE]
    heard = talk(StreamServer([streaming_transcriber], threads=1), lambda uri: listen(uri, audio, RATE))
    assert heard.code == 1000 and heard.finals
    assert 10 <= len(rounds) <= 27 and all(any(not u.final for u in updates) for updates in rounds[:-1])


def test_serve_refuses_a_model_that_cannot_stream(checkpoint, capsys):
    assert serving.main(["--checkpoint", str(checkpoint), "--port", "0"]) == 2
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


def test_serve_on_a_port_in_use_ends_in_one_line_naming_it(char_tokenizer, tmp_path):
    """``python -m asr.serve --checkpoint C --port P`` with P taken: exit status 2 and one line naming --host and
    --port, no traceback."""
    path = save_checkpoint(streaming_module(char_tokenizer), tmp_path / "streaming.ckpt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "asr.serve", "--checkpoint", str(path), "--port", str(port)],
                                cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1].startswith(
        f"python -m asr.serve: error: cannot listen on --host 127.0.0.1 --port {port}: ")
