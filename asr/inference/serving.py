"""Live transcription over WebSocket: ``python -m asr.serve --checkpoint C [--checkpoint C8K ...]`` (asr/serve.py).

    python -m asr.serve --checkpoint runs/demo-streaming/version_0/checkpoints/last.ckpt          # ws://127.0.0.1:2700
    python -m asr.serve --checkpoint a16k.ckpt --checkpoint b8k.ckpt --host 0.0.0.0 --max_streams 16

One connection is one stream, in the JSON protocol of docs/streaming-protocol.md: the client sends a start message
(its sample rate), then its audio as binary messages of 16-bit little-endian mono PCM, then an end message; the
server answers with a ready message, then partial and final results (asr.inference.streaming.Update.to_json) as
they are known, and closes the connection (code 1000) after the last final. Each checkpoint must be a streaming
model (--model.encoder.streaming); a client's rate picks the model of that rate, else one it is resampled to
(``model_for``; a rate that needs a huge resampling filter, such as 16001 Hz, is refused: asr.audio.check_resampling).
Past ``max_streams`` open streams a new connection gets an error message and close code 1013 (try again later); a
client that goes away mid-stream just ends its stream.

The model runs in rounds, in one thread of its own: the event loop only moves messages, adding each stream's audio
to what it has waiting. When a stream has the audio that completes its next chunk (or has ended) and the model
thread is free, a round takes the audio waiting in every such stream (at most ROUND_SECONDS of each) and steps them
all together (asr.inference.batched): one encoder step over every stream that completed a chunk, whatever its
position, so that N streams cost about one step of a batch of N per chunk instead of N steps. Rounds follow each
other as long as audio waits: the busier the server, the more streams each round holds. A stream with more than
BACKLOG_SECONDS waiting is not read until a round takes some (backpressure): a client sending faster than real time
holds seconds of memory, not its whole audio. Torch runs ``threads`` threads in that thread (default: the usable
cores less the one the event loop, the websockets and the streams' decoding need).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from asr.audio import StreamResampler, stream_resampler
from asr.hardware import usable_cores
from asr.inference.batched import feed_together
from asr.inference.streaming import ENDPOINT_SECONDS, MAX_CHUNK_SECONDS, Session, Update
from asr.inference.transcriber import Transcriber

PORT = 2700  # the default port (Vosk's; sherpa's servers take 6006)
START_SECONDS = 10.0  # a connection that has not sent its start message by then is closed
MIN_RATE, MAX_RATE = 4000, 192000  # sample rates a client may stream at
ROUND_SECONDS = 1.0  # the most audio of one stream a round takes: a client sending faster than real time is served
# a second at a time instead of holding up the rounds of the real-time ones
BACKLOG_SECONDS = 5.0  # audio of one stream waiting for rounds past which its connection is not read until a round
# takes some (backpressure: a client sending an hour as fast as it can holds seconds of it here, not the hour)
NORMAL, UNACCEPTABLE, INTERNAL, TRY_AGAIN_LATER = 1000, 1008, 1011, 1013  # close codes (RFC 6455, IANA's 1013)


class ProtocolError(ValueError):
    """A client's message the protocol does not allow: sent to it as an error message, then the connection closes."""


class StreamFailed(RuntimeError):
    """The model failed on a round that held this stream: sent to it as an error message, then close code 1011."""


def model_threads() -> int:
    """Torch threads of the model's thread: the usable cores but one, for the event loop (at least 1)."""
    return max(1, usable_cores() - 1)


@dataclass(eq=False)
class Stream:
    """One connection's stream. The event loop adds its audio to ``pending`` and sets ``ended``; only the model
    thread touches its session and resampler, in rounds, whose Updates come back on ``results``."""

    session: Session
    resampler: StreamResampler | None
    rate: int  # the client's sample rate
    results: asyncio.Queue = field(default_factory=asyncio.Queue)  # (Updates, last) of each round, or StreamFailed
    pending: deque[np.ndarray] = field(default_factory=deque)  # (n,) int16 pieces no round has taken yet, in order
    waiting: int = 0  # samples in pending
    wanted: int = 0  # samples (at the client's rate, at most) that complete the next chunk, as of the last round
    ended: bool = False  # the end message came
    finished: bool = False  # a round took its last audio
    taken: asyncio.Event = field(default_factory=asyncio.Event)  # set by each round that takes some of pending

    def add(self, pcm: np.ndarray) -> None:
        if len(pcm):  # an empty message adds nothing: pending holds no empty piece that would keep a stream unfinished
            self.pending.append(pcm)
            self.waiting += len(pcm)

    @property
    def due(self) -> bool:
        """Whether the next round has something of this stream to do: its end, or audio that completes a chunk."""
        return not self.finished and (self.ended or (self.waiting > 0 and self.waiting >= self.wanted))

    @property
    def backlogged(self) -> bool:
        """Whether more than BACKLOG_SECONDS wait (and more than the next chunk wants, so the stream is due): its
        connection is not read until a round takes some."""
        return self.waiting > max(self.wanted, round(BACKLOG_SECONDS * self.rate))

    def take(self) -> tuple[np.ndarray, bool]:
        """The audio the next round feeds (at most ROUND_SECONDS of what waits, from the front, so that a backlog is
        never copied whole), and whether it is the stream's last."""
        most, pieces, got = round(ROUND_SECONDS * self.rate), [], 0
        while self.pending and got < most:
            piece = self.pending.popleft()
            if got + len(piece) > most:  # the rest of this piece waits for the next round
                self.pending.appendleft(piece[most - got:])
                piece = piece[: most - got]
            pieces.append(piece)
            got += len(piece)
        self.waiting -= got
        self.finished = self.ended and not self.pending
        self.taken.set()
        return np.concatenate(pieces or [np.zeros(0, np.int16)]), self.finished

    def client_samples(self, samples: int) -> int:
        """Samples at the model's rate -> at the client's, rounded down."""
        return samples * self.rate // self.session.model.sample_rate

    def audio(self, pcm: np.ndarray, final: bool) -> torch.Tensor:
        """(n,) int16 at the client's rate -> float32 at the model's (``final``: with the resampler's rest)."""
        audio = torch.from_numpy(pcm.astype(np.float32) / 32768)
        if self.resampler is None:
            return audio
        return torch.cat([self.resampler(audio), self.resampler(audio[:0], True)]) if final else self.resampler(audio)


def step_round(streams: list[Stream], pieces: list[np.ndarray], finals: list[bool]
               ) -> list[tuple[list[Update], int]]:
    """One round, in the model thread: each stream's ``pieces`` fed to its session (``finals``: and finished),
    the sessions stepped together; each stream's Updates, and the samples at its client's rate that complete its
    next chunk (rounded down: a round too early only finds it has nothing to do)."""
    audio = [stream.audio(pcm, final) for stream, pcm, final in zip(streams, pieces, finals)]
    updates = feed_together([stream.session for stream in streams], audio, finals)
    return [(own, stream.client_samples(stream.session.wanted)) for own, stream in zip(updates, streams)]


class StreamServer:
    """Serves live transcription with one or more streaming models (``transcribers``, one per sample rate).

    Args:
        transcribers: Transcribers of streaming models, of different sample rates.
        max_streams: streams open at once; a connection past it is refused (close code 1013).
        threads: torch threads of the model's thread (None: ``model_threads``, the usable cores but one).
        chunk_seconds: audio per encoder step (None: each model's own model.encoder.chunk_frames); a start message
            may ask for another.
        endpoint_seconds: silence after words that ends a segment with a final (asr.inference.streaming).
    """

    def __init__(self, transcribers: list[Transcriber], max_streams: int = 8, threads: int | None = None,
                 chunk_seconds: float | None = None, endpoint_seconds: float = ENDPOINT_SECONDS):
        if max_streams < 1:
            raise ValueError(f"--max_streams must be at least 1, got {max_streams}")
        if threads is not None and threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        self.models: dict[int, Transcriber] = {}
        for transcriber in transcribers:
            if transcriber.sample_rate in self.models:
                raise ValueError(f"two --checkpoint models take {transcriber.sample_rate} Hz: give one per rate")
            transcriber.open_stream(chunk_seconds, endpoint_seconds)  # a model that cannot stream is refused now
            self.models[transcriber.sample_rate] = transcriber
        self.max_streams, self.chunk_seconds, self.endpoint_seconds = max_streams, chunk_seconds, endpoint_seconds
        self.threads = threads or model_threads()
        self.model_thread = ThreadPoolExecutor(1, "asr-serve-model", torch.set_num_threads, (self.threads,))
        self.active = 0  # connections being served now (the event loop's own count: no lock)
        self.streams: set[Stream] = set()  # streams started and not yet ended (the event loop's)
        self.wake: asyncio.Event | None = None  # set when audio waits for a round

    def model_for(self, rate: int) -> Transcriber:
        """The model of ``rate``; else the one of the highest rate under it (the audio is resampled down, losing
        nothing that model hears); else the one of the lowest rate (resampled up)."""
        if rate in self.models:
            return self.models[rate]
        below = [r for r in self.models if r < rate]
        return self.models[max(below) if below else min(self.models)]

    async def handle(self, connection: ServerConnection) -> None:
        """One connection: refused past max_streams, else its stream until the end message or until it goes away."""
        if self.active >= self.max_streams:
            await self.refuse(connection, TRY_AGAIN_LATER, f"busy: this server holds its limit of {self.max_streams} "
                                                           "streams; try again later")
            return
        self.active += 1
        try:
            await self.converse(connection)
        except ProtocolError as err:
            await self.refuse(connection, UNACCEPTABLE, str(err))
        except ConnectionClosed:  # the client went away: its stream ends with it
            pass
        finally:
            self.active -= 1

    async def converse(self, connection: ServerConnection) -> None:
        """start -> ready; audio -> partials and finals; end -> the last finals, then close (1000)."""
        try:
            start = await asyncio.wait_for(connection.recv(), START_SECONDS)
        except asyncio.TimeoutError:
            raise ProtocolError(f"no start message within {START_SECONDS:g} s") from None
        stream, ready = self.start(start)
        await connection.send(json.dumps(ready))
        self.streams.add(stream)
        sending = asyncio.create_task(self.send_results(connection, stream))
        try:
            if await self.receive(connection, stream):
                await sending
                await connection.close(NORMAL, "end of stream")
        finally:
            self.streams.discard(stream)
            sending.cancel()

    async def receive(self, connection: ServerConnection, stream: Stream) -> bool:
        """The client's audio onto ``stream`` until its end message (True) or a close without one (False)."""
        async for message in connection:
            if isinstance(message, bytes):
                stream.add(pcm(message))
            elif read_message(message).get("type") == "end":
                stream.ended = True
            else:
                raise ProtocolError("after the start message: binary audio, or {\"type\": \"end\"}")
            if stream.due:
                self.wake.set()
            if stream.ended:
                return True
            if stream.backlogged:
                await drained(connection, stream)
        return False

    async def send_results(self, connection: ServerConnection, stream: Stream) -> None:
        """Each round's Updates of ``stream`` to its client, until the round of its last audio; a failed round's
        error message and close code 1011 instead (the client's ``async for`` then ends). Ends quietly if the
        client has gone."""
        try:
            while True:
                result = await stream.results.get()
                if isinstance(result, StreamFailed):
                    await self.refuse(connection, INTERNAL, str(result))
                    return
                updates, last = result
                for update in updates:
                    await connection.send(json.dumps(update.to_json(), ensure_ascii=False))
                if last:
                    return
        except ConnectionClosed:
            pass

    def start(self, message: str | bytes) -> tuple[Stream, dict]:
        """The stream a start message asks for, and the ready message that answers it; ProtocolError if it cannot."""
        start = read_message(message)
        rate = start.get("sample_rate")
        if start.get("type") != "start" or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
            raise ProtocolError(f"the first message must be {{\"type\": \"start\", \"sample_rate\": HZ}} with HZ an "
                                f"integer from {MIN_RATE} to {MAX_RATE}; got {str(message)[:200]}")
        transcriber, chunk = self.model_for(rate), start.get("chunk_seconds", self.chunk_seconds)
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, float))):
            raise ProtocolError(f"chunk_seconds must be a number of seconds, got a JSON {type(chunk).__name__}")
        try:
            resampler = stream_resampler(rate, transcriber.sample_rate, "sample_rate")
            session = transcriber.open_stream(chunk, self.endpoint_seconds)
        except (TypeError, ValueError, OverflowError) as err:  # AudioError is a ValueError
            raise ProtocolError(str(err)) from None
        ready = {"type": "ready", "sample_rate": rate, "model_sample_rate": transcriber.sample_rate,
                 "chunk_seconds": round(session.chunk * session.model.frame_seconds, 6),
                 "frame_seconds": session.model.frame_seconds}
        stream = Stream(session, resampler, rate)
        stream.wanted = stream.client_samples(session.wanted)
        return stream, ready

    async def rounds(self) -> None:
        """Forever: once a stream is due (``Stream.due``), a round of every stream that is, in the model thread; its
        Updates to each stream's ``results``. A round that fails ends its streams (StreamFailed), not the server."""
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            due = [stream for stream in self.streams if stream.due]
            if not due:
                continue
            pieces, finals = zip(*(stream.take() for stream in due))
            try:
                stepped = await loop.run_in_executor(self.model_thread, step_round, due, list(pieces), list(finals))
                results = [(updates, final) for (updates, _), final in zip(stepped, finals)]
                for stream, (_, wanted) in zip(due, stepped):
                    stream.wanted = wanted
            except Exception as err:  # noqa: BLE001 (whatever the model raised, its streams are told and end)
                results = [StreamFailed(f"the model failed on this stream: {type(err).__name__}: {err}")] * len(due)
            for stream, result in zip(due, results):
                stream.results.put_nowait(result)
            if any(stream.due for stream in self.streams):
                self.wake.set()

    @staticmethod
    async def refuse(connection: ServerConnection, code: int, message: str) -> None:
        """An error message, then the close ``code``, to a client that may already be gone. The close reason is the
        message cut to 123 bytes of UTF-8 (RFC 6455's most), before any character the cut would split."""
        try:
            await connection.send(json.dumps({"type": "error", "message": message}))
            await connection.close(code, message.encode(errors="replace")[:123].decode(errors="ignore"))
        except ConnectionClosed:
            pass

    @contextlib.asynccontextmanager
    async def serve(self, host: str = "127.0.0.1", port: int = PORT) -> AsyncIterator[Server]:
        """The websockets server, with the model's rounds running while it is open (``async with
        server.serve(host, port) as ws: await ws.serve_forever()``); port 0: one the system chooses
        (``ws.sockets[0].getsockname()[1]``)."""
        self.wake = asyncio.Event()
        rounds = asyncio.create_task(self.rounds())
        try:
            async with serve(self.handle, host, port, compression=None, max_size=2 ** 20) as ws:
                yield ws
        finally:
            rounds.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rounds

    def close(self) -> None:
        self.model_thread.shutdown(wait=True)


async def drained(connection: ServerConnection, stream: Stream) -> None:
    """Backpressure: return once rounds have taken ``stream`` out of its backlog (Stream.backlogged), or the
    connection has closed; meanwhile its messages are not read (websockets then stops reading the socket, and TCP
    holds the client's sends). A backlogged stream is due, so a round comes."""
    closed = asyncio.ensure_future(connection.wait_closed())
    try:
        while stream.backlogged and not closed.done():
            stream.taken.clear()
            taken = asyncio.ensure_future(stream.taken.wait())
            await asyncio.wait([taken, closed], return_when=asyncio.FIRST_COMPLETED)
            taken.cancel()
    finally:
        closed.cancel()


def read_message(message: str | bytes) -> dict:
    """A text message's JSON object; ProtocolError for anything else (nesting too deep to parse too)."""
    try:
        value = json.loads(message)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ProtocolError(f"not a JSON object: {str(message)[:200]}")
    return value


def pcm(message: bytes) -> np.ndarray:
    """A binary message of 16-bit little-endian mono PCM -> (n,) int16 (a view of it)."""
    if len(message) % 2:
        raise ProtocolError(f"a binary message of {len(message)} bytes: audio is whole 16-bit samples")
    return np.frombuffer(message, "<i2")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.serve", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--checkpoint", action="append", required=True, help="a streaming model's .ckpt; once per sample rate served")
    add("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    add("--port", type=int, default=PORT, help="port to listen on; 0 = one the system chooses (printed)")
    add("--max_streams", type=int, default=8, help="streams served at once; a connection past them is refused (1013)")
    add("--threads", type=int, default=None, help="torch threads of the model's thread (default: the usable cores "
        "but one, left to the event loop)")
    add("--chunk_seconds", type=float, default=None, help="audio per encoder step, a whole number of the model's "
        f"frames, at most {MAX_CHUNK_SECONDS:g} s (default: each model's model.encoder.chunk_frames); a client's start "
        "message may ask for another")
    add("--endpoint_seconds", type=float, default=ENDPOINT_SECONDS, help="silence after words that ends a segment")
    add("--min_confidence", type=float, default=0.0, help="drop words under this confidence (0..1)")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    return args


async def serve_until_stopped(server: StreamServer, host: str, port: int) -> None:
    async with server.serve(host, port) as ws:
        address = ws.sockets[0].getsockname()
        rates = ", ".join(f"{rate} Hz" for rate in sorted(server.models))
        print(f"serving ws://{address[0]}:{address[1]} ({rates}; at most {server.max_streams} streams)", flush=True)
        await ws.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """``python -m asr.serve``: serve until interrupted (Ctrl-C, SIGTERM); 2 if a checkpoint or flag cannot be used
    or --host and --port cannot be listened on."""
    args = parse_args(argv)
    try:
        transcribers = [Transcriber.from_checkpoint(Path(c), args.device, min_confidence=args.min_confidence)
                        for c in args.checkpoint]
        server = StreamServer(transcribers, args.max_streams, args.threads, args.chunk_seconds, args.endpoint_seconds)
    except (OSError, ValueError) as err:
        print(f"python -m asr.serve: error: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_until_stopped(server, args.host, args.port))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    except OSError as err:  # the address is taken or not this machine's (the bind, before anything is served)
        print(f"python -m asr.serve: error: cannot listen on --host {args.host} --port {args.port}: {err}",
              file=sys.stderr)
        return 2
    finally:
        server.close()
    return 0


def run() -> None:
    """The command, as ``asr serve`` and ``python -m asr.serve`` run it (see asr.__main__)."""
    sys.exit(main())
