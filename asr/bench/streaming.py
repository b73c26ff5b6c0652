"""Streaming recognition measured: latency, WER per chunk, real-time factor, streams a server holds, memory, and
the training step's cost against the offline model's.

    python -m asr.bench.streaming --checkpoint STREAMING.ckpt --manifest data/mini/test.jsonl \
        --offline runs/default/version_0/checkpoints/last.ckpt --out streaming.json
    python -m asr.bench.streaming --checkpoint STREAMING.ckpt --manifest data/mini/test.jsonl --sections streams \
        --seconds 30                  # only the streams the server holds: about 4 min (6 counts of 30 s each)

Prints one table (the CPU first) and writes it as JSON with ``--out``. The audio every stream replays is the
manifest's utterances one after another with 1 s pauses (a call, to the endpointer), ``--seconds`` long:
- latency, at each of ``--chunks`` (160 / 320 / 640 ms): the algorithmic latency (the chunk, and what a feature
  window reaches past its hop) and, measured, per encoder frame the seconds from when its audio had all been sent to
  when the first result covering it arrived (the chunk's wait, the model's step and the transport together), p50
  and p95, of one real-time stream through ``python -m asr.serve`` on 127.0.0.1 (``serving``: a process of its
  own, as deployed; ``listen`` speaks its protocol);
- WER and CER of the manifest at each chunk and in full context (whole files at that chunk: what a stream gives),
  and of ``--offline`` (the default run's model) as asr.transcribe runs it;
- the real-time factor of one thread streaming as fast as it can, at each chunk;
- the streams the server holds: ``--stream_counts`` (1, 2, 4, 8, 12, 16) real-time streams at once, each count for
  ``--seconds``, at ``--streams_chunk`` (320 ms), their starts spread over a chunk; per count the p50 and p95 frame
  latency of all its streams, until a count whose p95 passes 0.5 s or whose streams are not all served; ``held``:
  the largest count before it. The server steps its streams together (asr.inference.batched) in its model thread,
  ``--threads`` torch threads (default: the server's, the usable cores but one); the clients run in this process,
  on the same cores, as a load test on one machine must;
- memory: the resident MB of the process every minute of one ``--memory_seconds`` stream (an hour) fed as fast as
  it goes, and the most frames its session held;
- training: seconds per step of the default run with and without demo-streaming.yaml on the same batches of the
  manifest, fp32 (the target: within 1.3x).
``--sections`` runs some of them only (``--sections streams``: the load test alone). ``--quick`` (tests) runs each
for seconds on whatever checkpoint it is given; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from asr.atomic import write_atomically
from asr.audio import load_audio, resample
from asr.configs import CONFIGS
from asr.data.manifest import Utterance, parse_manifest
from asr.inference.transcriber import Transcriber
from asr.models.streaming import algorithmic_latency
from asr.scoring import score

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


# ---- the measurements: python -m asr.bench.streaming ----

CHUNKS = (0.16, 0.32, 0.64)  # seconds of audio per encoder step whose latency and WER are measured (issue 65)
STREAMS_CHUNK = 0.32  # the chunk the server's capacity is measured at
STREAM_COUNTS = (1, 2, 4, 8, 12, 16)  # real-time streams at once whose latency is measured, in turn (issue 65: >= 8)
SECTIONS = ("wer", "rtf", "latency", "streams", "memory", "train")
SERVER_START_SECONDS = 300.0  # python -m asr.serve's start (imports, the checkpoint) on a busy machine
LATENCY_TARGET = 0.5  # p95 seconds from a frame's audio to its first result that a stream must keep to count as held
STREAMING_RECIPE = CONFIGS / "recipes" / "demo-streaming.yaml"
PAUSE_SECONDS = 1.0  # between the utterances of the conversation the streams replay
SAMPLE_EVERY = 60.0  # seconds of audio between two readings of the process's memory


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), for the table's header."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def resident_mb() -> float | None:
    """This process's resident memory in MB (Linux), or None."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return None


def conversation(utterances: list[Utterance], sample_rate: int, seconds: float) -> np.ndarray:
    """``seconds`` of audio at ``sample_rate``: the utterances one after another with PAUSE_SECONDS of silence
    between them, from the first again until it is long enough (what a call sounds like to the endpointer)."""
    pieces, total, pause = [], 0, np.zeros(round(PAUSE_SECONDS * sample_rate), np.float32)
    while total < seconds * sample_rate:
        for utt in utterances:
            audio, rate = load_audio(utt.audio_filepath)
            pieces += [resample(torch.from_numpy(audio), rate, sample_rate).numpy(), pause]
            total += len(pieces[-2]) + len(pause)
            if total >= seconds * sample_rate:
                break
    return np.concatenate(pieces)[: round(seconds * sample_rate)]


def chunk_frames_of(transcriber: Transcriber, chunks: tuple[float, ...]) -> list[tuple[float, int]]:
    """(seconds, encoder frames) of each chunk that is a whole number of the model's frames; the others are said."""
    frame, out = transcriber.model.frame_seconds, []
    for seconds in chunks:
        frames = seconds / frame
        if abs(frames - round(frames)) < 1e-6 and round(frames) >= 1:
            out.append((seconds, round(frames)))
        else:
            print(f"chunk {seconds:g} s skipped: not a whole number of the model's {frame:g} s frames", file=sys.stderr)
    return out


def network(transcriber: Transcriber) -> torch.nn.Module:
    """The checkpoint's network (asr.inference.acoustic.CheckpointModel.module.model)."""
    return transcriber.model.module.model


def measure_wer(transcriber: Transcriber, utterances: list[Utterance], chunks: list[tuple[float, int]],
                offline: Transcriber | None) -> list[dict]:
    """WER and CER of the streaming model at each chunk, with its algorithmic latency (the chunk, its look-ahead and
    the feature window's reach), and in full context (whole files through its encoder at that chunk: what a stream
    gives, tests/inference/test_streaming.py), and of ``offline`` as asr.transcribe runs it."""
    encoder, rows = network(transcriber).encoder, []
    references, window = [u.text for u in utterances], network(transcriber).features.config.win_seconds
    for name, frames in [(f"streaming {s:g} s", f) for s, f in chunks] + [("streaming full context", 0)]:
        encoder.chunk = frames
        scores = score(references, transcriber.transcribe_utterances(utterances))
        latency = algorithmic_latency(encoder, frames, window) if frames else None
        rows.append({"model": name, "wer": scores["wer"], "cer": scores["cer"], "algorithmic_s": latency})
    encoder.chunk = encoder.cfg.chunk_frames
    if offline is not None:
        scores = score(references, offline.transcribe_utterances(utterances))
        rows.append({"model": "offline", "wer": scores["wer"], "cer": scores["cer"]})
    return rows


def measure_rtf(transcriber: Transcriber, audio: np.ndarray, chunks: list[tuple[float, int]]) -> list[dict]:
    """Seconds of one thread per second of audio, streaming ``audio`` as fast as it goes in PIECE_SECONDS pieces."""
    rows, step, threads = [], round(PIECE_SECONDS * transcriber.sample_rate), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seconds, _ in chunks:
            session, begun = transcriber.open_stream(seconds), time.perf_counter()
            for at in range(0, len(audio), step):
                session.feed(audio[at: at + step])
            session.finish()
            rows.append({"chunk_s": seconds, "rtf": (time.perf_counter() - begun) / session.seconds})
    finally:
        torch.set_num_threads(threads)
    return rows


async def measure_latency(uri: str, audio: np.ndarray, sample_rate: int, chunks: list[tuple[float, int]],
                          transcriber: Transcriber) -> list[dict]:
    """At each chunk: the algorithmic latency (the chunk and what a feature window reaches past its hop) and one
    real-time stream's frame latencies (``listen``), p50 and p95."""
    window = network(transcriber).features.config.win_seconds
    rows = []
    for seconds, frames in chunks:
        heard = await listen(uri, audio, sample_rate, chunk_seconds=seconds)
        rows.append({"chunk_s": seconds, "algorithmic_s": algorithmic_latency(network(transcriber).encoder, frames, window),
                     "p50_s": percentile(heard.latencies, 50), "p95_s": percentile(heard.latencies, 95)})
    return rows


async def measure_streams(uri: str, audio: np.ndarray, sample_rate: int, chunk: float, counts: list[int]) -> dict:
    """``counts`` real-time streams at once, each count in turn, each stream replaying ``audio``, their starts spread
    over one chunk as independent callers' would be: per count the p50 and p95 of every frame's latency and the
    streams not served to the end. Stops after the first count whose p95 passes LATENCY_TARGET or that lost a
    stream; ``held`` is the largest count before it (0: not even one)."""
    levels, held = [], 0
    for count in counts:
        async def caller(i: int, n: int = count) -> Heard:
            await asyncio.sleep(chunk * i / n)
            return await listen(uri, audio, sample_rate, chunk_seconds=chunk)

        runs = await asyncio.gather(*(caller(i) for i in range(count)))
        latencies = [latency for run in runs for latency in run.latencies]
        failed, p95 = sum(run.code != 1000 for run in runs), percentile(latencies, 95)
        levels.append({"streams": count, "p50_s": percentile(latencies, 50), "p95_s": p95, "failed": failed})
        print(level_line(levels[-1], chunk), file=sys.stderr, flush=True)  # a long run says how it goes
        if failed or p95 is None or p95 > LATENCY_TARGET:
            break
        held = count
    return {"chunk_s": chunk, "target_s": LATENCY_TARGET, "held": held, "levels": levels}


def level_line(level: dict, chunk: float) -> str:
    return (f"{level['streams']} streams at {chunk:g} s: p50 {fmt(level['p50_s'])} s, p95 {fmt(level['p95_s'])} s, "
            f"failed {level['failed']}")


def measure_memory(transcriber: Transcriber, audio: np.ndarray, seconds: float, every: float = SAMPLE_EVERY) -> dict:
    """One stream of ``seconds`` of audio (``audio`` over and over) as fast as it goes: the process's resident MB every
    ``every`` seconds of audio, and the most frames the session held at once."""
    session, fed, readings, held = transcriber.open_stream(), 0, [], 0
    piece = round(transcriber.sample_rate)  # 1 s a feed: memory, not latency, is measured here
    while fed < seconds * transcriber.sample_rate:
        start = fed % max(1, len(audio) - piece)
        session.feed(audio[start: start + piece])
        fed += piece
        held = max(held, len(session.frames))
        if fed % round(every * transcriber.sample_rate) < piece:
            readings.append({"audio_s": round(fed / transcriber.sample_rate), "rss_mb": resident_mb()})
    session.finish()
    first, last = readings[0]["rss_mb"] if readings else None, readings[-1]["rss_mb"] if readings else None
    growth = None if first is None or last is None else last - first
    return {"audio_s": seconds, "readings": readings, "growth_mb": growth, "most_frames_held": held}


@contextlib.asynccontextmanager
async def serving(checkpoint: str, max_streams: int, threads: int | None = None) -> AsyncIterator[str]:
    """``python -m asr.serve --checkpoint checkpoint`` on 127.0.0.1 at a port the system chooses, in a process of its
    own, as deployed (its event loop and model thread share nothing with the clients but the cores): its ws:// URI.
    Stopped as Ctrl-C stops it when the block ends; RuntimeError with its output if it does not start."""
    command = [sys.executable, "-m", "asr.serve", "--checkpoint", checkpoint, "--port", "0",
               "--max_streams", str(max_streams), *(["--threads", str(threads)] if threads else [])]
    with tempfile.TemporaryFile() as errors:
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=errors)
        try:
            line = await asyncio.wait_for(process.stdout.readline(), SERVER_START_SECONDS)
            started = re.search(r"serving (ws://\S+)", line.decode())
            if not started:
                errors.seek(0)
                raise RuntimeError(f"{' '.join(command)} did not start: {errors.read().decode()[-2000:]}")
            yield started.group(1)
        finally:
            await stop(process)


async def stop(process: asyncio.subprocess.Process) -> None:
    """Ctrl-C's signal to ``process``, then a kill if it has not ended within 30 s."""
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()


async def measure_server(args: argparse.Namespace, transcriber: Transcriber, audio: np.ndarray,
                         chunks: list[tuple[float, int]]) -> dict:
    """The sections of ``args.sections`` that need the server (latency, streams), against ``serving``."""
    results, rate = {}, transcriber.sample_rate
    async with serving(args.checkpoint, max(args.stream_counts), args.threads) as uri:
        if "latency" in args.sections:
            results["latency"] = await measure_latency(uri, audio, rate, chunks, transcriber)
        if "streams" in args.sections:
            results["streams"] = await measure_streams(uri, audio, rate, args.streams_chunk, args.stream_counts)
    return results


def measure_train_cost(manifest: str, steps: int, passes_: int = 2) -> dict:
    """Seconds per training step of the default run and of it with demo-streaming.yaml on the same batches of
    ``manifest`` (asr.bench.steps.plain_times, fp32, the fastest of ``passes_`` over each batch), and their ratio."""
    from asr.bench.sections import training_batches
    from asr.bench.steps import BENCH_TRAINER, fastest, passes, plain_times, quiet
    from asr.train import fitting

    common = [*(f"--data.{split}_manifest={manifest}" for split in ("train", "val", "test")), *BENCH_TRAINER,
              "--trainer.precision=32-true"]
    configs = {"offline": [], "streaming": ["--config", str(STREAMING_RECIPE)]}
    with quiet():
        clis = {name: fitting.build([*config, *common]) for name, config in configs.items()}
        data = clis["offline"].datamodule
        data.setup("fit")
        batches = training_batches(data, steps + 1)
        seconds = {name: fastest(plain_times(cli, passes(batches, passes_)), passes_) / steps for name, cli in clis.items()}
    return {"offline_step_s": seconds["offline"], "streaming_step_s": seconds["streaming"],
            "ratio": seconds["streaming"] / seconds["offline"]}


def table(results: dict) -> str:
    """The measurements as the lines docs/benchmarks.md takes."""
    lines = [f"CPU: {results['cpu']}; checkpoint {results['checkpoint']}"]
    for row in results.get("latency", []):
        lines.append(f"chunk {row['chunk_s']:g} s: algorithmic latency {row['algorithmic_s']:.3f} s, measured p50 "
                     f"{fmt(row['p50_s'])} s, p95 {fmt(row['p95_s'])} s")
    lines += [f"{row['model']}: WER {row['wer']:.4f}  CER {row['cer']:.4f}"
              + (f"  (algorithmic latency {row['algorithmic_s']:.3f} s)" if row.get("algorithmic_s") else "")
              for row in results.get("wer", [])]
    lines += [f"chunk {row['chunk_s']:g} s: real-time factor {row['rtf']:.4f} (one thread)" for row in results.get("rtf", [])]
    if "streams" in results:
        streams = results["streams"]
        lines += [level_line(row, streams["chunk_s"]) for row in streams["levels"]]
        lines.append(f"real-time streams held at {streams['chunk_s']:g} s with p95 <= {streams['target_s']:g} s: "
                     f"{streams['held']}")
    if "memory" in results:
        memory = results["memory"]
        lines.append(f"memory over {memory['audio_s']:g} s of one stream: " + ", ".join(
            f"{r['audio_s']} s {fmt(r['rss_mb'])} MB" for r in memory["readings"]) + f"; growth {fmt(memory['growth_mb'])} MB")
    if "train" in results:
        train = results["train"]
        lines.append(f"training step: offline {train['offline_step_s']:.3f} s, streaming {train['streaming_step_s']:.3f} s, "
                     f"ratio {train['ratio']:.2f}")
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.streaming", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--checkpoint", required=True, help="a streaming model's checkpoint")
    add("--manifest", required=True, help="utterances with text: WER, and the audio every stream replays")
    add("--offline", help="an offline model's checkpoint, whose WER the table adds (the default run's)")
    add("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to measure (default: all)")
    add("--chunks", type=float, nargs="+", default=list(CHUNKS), help="chunk seconds whose latency, WER and RTF are measured")
    add("--seconds", type=float, default=60.0, help="audio each latency stream replays, and each stream of each count")
    add("--streams_chunk", type=float, default=STREAMS_CHUNK, help="the chunk the server's capacity is measured at")
    add("--stream_counts", type=int, nargs="+", default=list(STREAM_COUNTS),
        help="concurrent real-time streams tried, in turn, until one count misses the latency target")
    add("--threads", type=int, help="the server's --threads: torch threads of its model thread (default: its own)")
    add("--memory_seconds", type=float, default=3600.0, help="audio of the long stream whose memory is read")
    add("--train_steps", type=int, default=20, help="training steps timed per recipe (0: the training cost is not measured)")
    add("--out", help="also write the results as JSON here")
    add("--quick", action="store_true", help="a few seconds of each, to check that every section runs (CI)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Measure ``--sections``, print the table, write ``--out``; returns the results."""
    args = parse_args(argv)
    if args.quick:
        args.seconds, args.stream_counts, args.memory_seconds, args.train_steps = 1.0, [1, 2], 4.0, 0
    utterances = [u for u in parse_manifest(args.manifest)[0]][: 4 if args.quick else None]
    transcriber = Transcriber.from_checkpoint(args.checkpoint, second_pass=0.0)
    chunks = chunk_frames_of(transcriber, tuple(args.chunks))
    audio = conversation(utterances, transcriber.sample_rate, args.seconds)
    results = {"cpu": cpu_name(), "checkpoint": args.checkpoint}
    if "wer" in args.sections:
        offline = Transcriber.from_checkpoint(args.offline) if args.offline else None
        results["wer"] = measure_wer(transcriber, utterances, chunks, offline)
    if "rtf" in args.sections:
        results["rtf"] = measure_rtf(transcriber, audio, chunks)
    if {"latency", "streams"} & set(args.sections):
        results |= asyncio.run(measure_server(args, transcriber, audio, chunks))
    if "memory" in args.sections:
        results["memory"] = measure_memory(transcriber, audio, args.memory_seconds, 1.0 if args.quick else SAMPLE_EVERY)
    if "train" in args.sections and args.train_steps:
        results["train"] = measure_train_cost(args.manifest, args.train_steps)
    print(table(results))
    if args.out:
        with write_atomically(Path(args.out)) as partial:
            partial.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
