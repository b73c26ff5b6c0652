"""Streaming recognition measured: latency, WER per chunk size, real-time factor, streams a server holds, memory.

This module's client (``listen``) speaks asr.serve's protocol (docs/streaming-protocol.md) over a real WebSocket and
times what comes back: per encoder frame, the seconds from when its audio had all been sent to when the first
result covering it arrived (the chunk's wait, the model's step and the transport together).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

PIECE_SECONDS = 0.02  # a client's audio per message: a microphone's 20 ms buffers


@dataclass
class Heard:
    """What one client sent and heard: the ready message, each result with the time it came, how the connection
    closed, and the latency of every frame a result covered (seconds, module docstring)."""

    ready: dict | None = None
    results: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # time.monotonic() of each result
    errors: list[str] = field(default_factory=list)  # the server's error messages
    code: int | None = None  # the close code
    latencies: list[float] = field(default_factory=list)

    @property
    def finals(self) -> list[dict]:
        return [r for r in self.results if r["type"] == "final"]


def pcm16(audio: np.ndarray) -> bytes:
    """(n,) float audio in [-1, 1] -> 16-bit little-endian PCM, as the protocol's binary messages carry it."""
    return (np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes()


async def listen(uri: str, audio: np.ndarray, sample_rate: int, realtime: bool = True, chunk_seconds: float | None = None,
                 hang_up_after: float | None = None) -> Heard:
    """Stream ``audio`` (n,) float at ``sample_rate`` to the server at ``uri`` in PIECE_SECONDS messages, at real speed
    or as fast as it goes, then the end message; collect what comes back until the server closes. ``hang_up_after``:
    drop the connection (no close handshake) after that many seconds of audio instead of ending the stream."""
    heard, sent = Heard(), []  # sent: (samples sent so far, time)
    async with connect(uri, compression=None, max_size=2 ** 20) as ws:
        start = {"type": "start", "sample_rate": sample_rate} | ({"chunk_seconds": chunk_seconds} if chunk_seconds else {})
        receiving = asyncio.create_task(receive(ws, heard))
        try:
            await ws.send(json.dumps(start))
            await send(ws, audio, sample_rate, realtime, hang_up_after, sent)
        except ConnectionClosed:  # refused, or closed by the server: what it said is in heard
            pass
        await receiving
        heard.code = ws.close_code
    heard.latencies = frame_latencies(heard, sent, sample_rate)
    return heard


async def send(ws, audio: np.ndarray, sample_rate: int, realtime: bool, hang_up_after: float | None,
               sent: list[tuple[int, float]]) -> None:
    """listen's side that speaks: the audio in PIECE_SECONDS messages, then the end message (or a hang-up), noting in
    ``sent`` how many samples had gone at what time."""
    step, begun = round(PIECE_SECONDS * sample_rate), time.monotonic()
    for at in range(0, len(audio), step):
        if hang_up_after is not None and at >= hang_up_after * sample_rate:
            ws.transport.abort()
            return
        if realtime:
            await asyncio.sleep(max(0.0, begun + at / sample_rate - time.monotonic()))
        await ws.send(pcm16(audio[at: at + step]))
        sent.append((min(at + step, len(audio)), time.monotonic()))
    await ws.send(json.dumps({"type": "end"}))


async def receive(ws, heard: Heard) -> None:
    """Every message until the connection closes (or is dropped), sorted into ``heard``."""
    try:
        async for message in ws:
            data = json.loads(message)
            if data["type"] == "ready":
                heard.ready = data
            elif data["type"] == "error":
                heard.errors.append(data["message"])
            else:
                heard.results.append(data)
                heard.times.append(time.monotonic())
    except ConnectionClosed:  # dropped without a close handshake
        pass


def frame_latencies(heard: Heard, sent: list[tuple[int, float]], sample_rate: int) -> list[float]:
    """Per encoder frame the first result covered (its ``end`` past the frame): that result's time minus the time
    the frame's last sample was sent."""
    if heard.ready is None or not sent:
        return []
    frame, covered, latencies = heard.ready["frame_seconds"], 0, []
    counts, moments = np.array([n for n, _ in sent]), [t for _, t in sent]
    for result, at in zip(heard.results, heard.times):
        frames = round(result["end"] / frame)
        for f in range(covered, frames):
            index = int(np.searchsorted(counts, min((f + 1) * frame * sample_rate, counts[-1]) - 1e-6))
            latencies.append(at - moments[min(index, len(moments) - 1)])
        covered = max(covered, frames)
    return latencies


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None
