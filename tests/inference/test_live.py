"""``python -m asr.transcribe --stream`` (asr.inference.live): 16-bit PCM from standard input, raw or with a WAV header
at another rate (its data size honoured), or a file replayed; partial and final lines that say what Transcriber.stream
says; Ctrl-C that still prints the last final line; clear refusals."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import wave

import numpy as np
import pytest
import soundfile
import torch

from asr.audio import resample
from asr.inference.live import paced, pcm_pieces
from asr.inference.transcriber import Transcriber
from asr.inference.transcribing import main
from tests import REPO
from tests.conftest import save_checkpoint
from tests.streams import RATE, speech_and_pauses, streaming_module

TIMEOUT = 60.0  # seconds a test waits for a process at each step


@pytest.fixture(scope="module")
def streaming_checkpoint(tmp_path_factory, char_tokenizer):
    return save_checkpoint(streaming_module(char_tokenizer), tmp_path_factory.mktemp("stream") / "streaming.ckpt")


@pytest.fixture(autouse=True)
def threads_restored(keep_threads):
    """--stream sets one thread for the process; the tests' other modules get theirs back."""


def pcm(audio: torch.Tensor) -> bytes:
    return (audio.clamp(-1, 1) * 32767).round().short().numpy().astype("<i2").tobytes()


def wav(audio: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> bytes:
    """A WAV file's bytes of int16 ``audio`` as a pipe gets it (``sox ... -t wav -``)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(channels), f.setsampwidth(width), f.setframerate(rate)
        f.writeframes(audio.tobytes())
    return out.getvalue()


def run_stream(monkeypatch, capsys, data: bytes, *args: str, exit_code: int = 0) -> tuple[list[str], str]:
    """stdout lines and stderr of ``asr.transcribe ARGS`` with ``data`` on standard input."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(list(args)) == exit_code
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


def test_raw_pcm_on_standard_input_prints_the_finals_of_the_api(streaming_checkpoint, monkeypatch, capsys):
    audio = speech_and_pauses()
    lines, err = run_stream(monkeypatch, capsys, pcm(audio), "--checkpoint", str(streaming_checkpoint), "--stream",
                            "-", "--endpoint_seconds", "0.4")
    heard = torch.from_numpy(np.frombuffer(pcm(audio), "<i2").astype(np.float32) / 32768)
    expected = [u.text for u in Transcriber.from_checkpoint(streaming_checkpoint).stream([heard], endpoint_seconds=0.4)
                if u.final]
    finals = [line.split("\t") for line in lines if line.startswith("final\t")]
    assert len(finals) >= 2 and [f[3] for f in finals] == expected
    assert any(line.startswith("partial\t") for line in lines) and "6.0 s of audio" in err
    assert all(float(a[2]) <= float(b[1]) for a, b in zip(finals, finals[1:]))  # start/end columns in order


def test_a_wav_header_says_the_rate_and_channels(streaming_checkpoint, monkeypatch, capsys):
    """A stereo WAV on standard input, --format jsonl: the protocol's messages, the finals the API gives for its mix."""
    mono = (speech_and_pauses().numpy() * 32767).astype("<i2")
    lines, err = run_stream(monkeypatch, capsys, wav(np.stack([mono, mono], axis=1), RATE, channels=2),
                            "--checkpoint", str(streaming_checkpoint), "--stream", "-", "--format", "jsonl")
    messages = [json.loads(line) for line in lines]
    heard = torch.from_numpy(mono.astype(np.float32) / 32768)
    expected = [u.to_json() for u in Transcriber.from_checkpoint(streaming_checkpoint).stream([heard]) if u.final]
    assert expected and [m for m in messages if m["type"] == "final"] == expected
    assert {m["type"] for m in messages} == {"partial", "final"} and "6.0 s of audio" in err


def test_a_wav_at_another_rate_is_resampled_as_it_streams():
    audio = (np.random.default_rng(0).standard_normal(8000) * 3000).astype("<i2")  # 1 s at 8 kHz
    samples = np.concatenate(list(pcm_pieces(io.BytesIO(wav(audio, 8000)), "pipe", RATE)))
    expected = resample(torch.from_numpy(audio.astype(np.float32) / 32768), 8000, RATE).numpy()
    np.testing.assert_allclose(samples, expected, atol=1e-5)


def test_pcm_pieces_keep_an_odd_byte_for_the_next_read():
    data = pcm(torch.linspace(-0.5, 0.5, 1001))

    class Trickle(io.BytesIO):  # a pipe that gives 333 bytes a read
        def read1(self, size=-1):
            return super().read1(333)

    samples = np.concatenate(list(pcm_pieces(Trickle(data), "pipe", RATE)))
    np.testing.assert_allclose(samples, np.frombuffer(data, "<i2") / 32768, atol=1e-7)


def test_realtime_replay_hands_out_audio_no_sooner_than_it_lasts():
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    for piece in paced([np.zeros(1600)] * 5, RATE, clock=lambda: now[0], sleep=sleep):
        now[0] += 0.03  # the model's time on each piece
    assert slept == pytest.approx([0.1, 0.07, 0.07, 0.07, 0.07])


def test_a_file_is_replayed_as_the_api_streams_it(streaming_checkpoint, tmp_path, capsys):
    path = tmp_path / "speech.flac"
    soundfile.write(path, speech_and_pauses().numpy(), RATE, subtype="PCM_16")
    assert main(["--checkpoint", str(streaming_checkpoint), "--stream", str(path), "--endpoint_seconds", "0.4"]) == 0
    finals = [line.split("\t")[3] for line in capsys.readouterr().out.splitlines() if line.startswith("final")]
    heard = torch.from_numpy(soundfile.read(path, dtype="float32")[0])
    assert finals == [u.text for u in Transcriber.from_checkpoint(streaming_checkpoint).stream(
        [heard], endpoint_seconds=0.4) if u.final]


def test_a_replayed_file_unreadable_on_the_way_ends_in_one_line_naming_it(streaming_checkpoint, tmp_path, capsys):
    """Corrupt data mid-file (asr.data.sources.UtteranceAudio reads the replay): exit 2 and one line, no traceback."""
    path = tmp_path / "corrupt.flac"
    soundfile.write(path, speech_and_pauses().numpy(), RATE, subtype="PCM_16")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + b"\xff" * 2000 + data[len(data) // 2 + 2000:])
    assert main(["--checkpoint", str(streaming_checkpoint), "--stream", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"python -m asr.transcribe: error: {path}: cannot read audio (")


@pytest.mark.parametrize("args, message", [
    (["--stream", "-", "a.flac"], "not both"), (["--stream", "a.flac", "--output", "x.jsonl"], "prints to stdout"),
    (["--stream", "-", "--realtime"], "--realtime replays a file")])
def test_stream_flags_that_do_not_go_together_are_refused(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", "c.ckpt", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_an_offline_checkpoint_or_a_24_bit_wav_ends_in_one_line(checkpoint, streaming_checkpoint, monkeypatch, capsys):
    _, err = run_stream(monkeypatch, capsys, b"", "--checkpoint", str(checkpoint), "--stream", "-", exit_code=2)
    assert "cannot stream" in err and "--model.encoder.streaming true" in err and len(err.splitlines()) == 1
    data = wav(np.zeros(300, np.uint8), RATE, width=3)
    _, err = run_stream(monkeypatch, capsys, data, "--checkpoint", str(streaming_checkpoint), "--stream", "-",
                        exit_code=2)
    assert "24-bit samples" in err and "16-bit PCM" in err


def test_a_real_pipe_is_read_as_it_fills(streaming_checkpoint, monkeypatch, capsys):
    """An OS pipe on standard input, written in uneven pieces by another thread, as ``sox ... - |`` writes it."""
    data = pcm(speech_and_pauses())
    read_end, write_end = os.pipe()

    def writer():
        with open(write_end, "wb", buffering=0) as f:
            for at in range(0, len(data), 3333):
                f.write(data[at: at + 3333])

    thread = threading.Thread(target=writer)
    thread.start()
    with open(read_end, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(pipe))
        assert main(["--checkpoint", str(streaming_checkpoint), "--stream", "-", "--endpoint_seconds", "0.4"]) == 0
    thread.join(timeout=30)
    captured = capsys.readouterr()
    heard = torch.from_numpy(np.frombuffer(data, "<i2").astype(np.float32) / 32768)
    expected = [u.text for u in Transcriber.from_checkpoint(streaming_checkpoint).stream([heard], endpoint_seconds=0.4)
                if u.final]
    assert [line.split("\t")[3] for line in captured.out.splitlines() if line.startswith("final")] == expected
    assert "6.0 s of audio" in captured.err


def test_a_wav_header_s_data_size_is_honoured_unless_a_pipe_writer_left_it_open():
    """A complete WAV with a LIST chunk after its data: only the data is audio. With the size a pipe's writer leaves
    (0 or 2^32 - 1) everything to the end is read, as it must be for sox or arecord writing to a pipe."""
    audio = (np.random.default_rng(0).standard_normal(1600) * 3000).astype("<i2")
    data = wav(audio, RATE) + b"LIST" + struct.pack("<I", 400) + bytes(range(200)) * 2
    samples = np.concatenate(list(pcm_pieces(io.BytesIO(data), "pipe", RATE)))
    np.testing.assert_allclose(samples, audio.astype(np.float32) / 32768, atol=1e-7)
    size_at = data.index(b"data") + 4
    for open_size in (0, 0xFFFFFFFF):
        streamed = data[:size_at] + struct.pack("<I", open_size) + data[size_at + 4:]
        samples = np.concatenate(list(pcm_pieces(io.BytesIO(streamed), "pipe", RATE)))
        assert len(samples) == len(audio) + 408 // 2  # the LIST chunk, read as audio: nothing said where it ends


def test_a_short_fmt_chunk_or_a_rate_too_odd_to_resample_ends_in_one_line_naming_the_input(
        streaming_checkpoint, monkeypatch, capsys, tmp_path):
    short_fmt = b"RIFF" + struct.pack("<I", 28) + b"WAVE" + b"fmt " + struct.pack("<I", 8) + bytes(8) + b"data" + bytes(4)
    _, err = run_stream(monkeypatch, capsys, short_fmt, "--checkpoint", str(streaming_checkpoint), "--stream", "-",
                        exit_code=2)
    assert err.splitlines() == [
        "python -m asr.transcribe: error: standard input: a WAV fmt chunk of 8 bytes (PCM's has 16)"]
    odd = wav(np.zeros(1600, "<i2"), 16001)  # 16001 -> 16000 Hz would build a resampling filter of 2 GB
    _, err = run_stream(monkeypatch, capsys, odd, "--checkpoint", str(streaming_checkpoint), "--stream", "-",
                        exit_code=2)
    assert err.startswith("python -m asr.transcribe: error: standard input: 16001 Hz cannot be resampled to 16000 Hz")
    assert len(err.splitlines()) == 1
    path = tmp_path / "odd.wav"  # a file replayed: the same rule, naming it
    soundfile.write(path, np.zeros(1600, np.float32), 16001, subtype="PCM_16")
    assert main(["--checkpoint", str(streaming_checkpoint), "--stream", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"python -m asr.transcribe: error: {path}: 16001 Hz cannot be resampled")


class Interrupted(io.BytesIO):
    """Standard input that gives its bytes, then Ctrl-C (KeyboardInterrupt) where a pipe would wait for more."""

    def read1(self, size=-1):
        data = super().read1(size)
        if not data:
            raise KeyboardInterrupt
        return data


def test_ctrl_c_ends_a_stream_with_the_final_line_of_its_last_segment(streaming_checkpoint, monkeypatch, capsys):
    audio = speech_and_pauses()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(Interrupted(pcm(audio))))
    assert main(["--checkpoint", str(streaming_checkpoint), "--stream", "-", "--endpoint_seconds", "0.4"]) == 130
    captured = capsys.readouterr()
    heard = torch.from_numpy(np.frombuffer(pcm(audio), "<i2").astype(np.float32) / 32768)
    expected = [u.text for u in Transcriber.from_checkpoint(streaming_checkpoint).stream([heard], endpoint_seconds=0.4)
                if u.final]
    assert [line.split("\t")[3] for line in captured.out.splitlines() if line.startswith("final")] == expected
    assert captured.out.splitlines()[-1].startswith("final\t") and "6.0 s of audio" in captured.err
    assert captured.err.splitlines()[-1].startswith("interrupted: the stream ended") and "again" not in captured.err


def unread(pipe) -> int:
    """Bytes written to ``pipe`` that its reader has not read yet (FIONREAD, which Linux answers on either end)."""
    return struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def test_ctrl_c_on_the_documented_command_prints_the_last_final_and_exits_130(streaming_checkpoint):
    """``... | python -m asr.transcribe --checkpoint C --stream -``, then Ctrl-C (SIGINT, as a terminal sends it) once
    the process has read all the audio: its last segment's final line, exit status 130, no advice to resume."""
    data = pcm(speech_and_pauses())
    process = subprocess.Popen([sys.executable, "-m", "asr.transcribe", "--checkpoint", str(streaming_checkpoint),
                                "--stream", "-", "--format", "jsonl"], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored
    writer = threading.Thread(target=lambda: (process.stdin.write(data), process.stdin.flush()), daemon=True)
    try:
        writer.start()
        deadline = time.monotonic() + TIMEOUT
        while (writer.is_alive() or unread(process.stdin)) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the last 0.1 s piece read is stepped (milliseconds); then the process waits on its pipe
        process.send_signal(signal.SIGINT)
        process.wait(timeout=TIMEOUT)
        out, err = (stream.read().decode() for stream in (process.stdout, process.stderr))
    finally:
        process.kill()
        process.wait(timeout=TIMEOUT)
        for pipe in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                pipe.close()
    assert process.returncode == 130, err[-2000:]
    last = json.loads(out.splitlines()[-1])
    assert last["type"] == "final" and last["end"] >= 5.9 and last["text"]  # the segment that ends the audio
    assert "6.0 s of audio" in err and "Traceback" not in err and "run the same command again" not in err
