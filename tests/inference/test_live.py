"""``python -m asr.transcribe --stream`` (asr.inference.live): 16-bit PCM from standard input, raw or with a WAV header
at another rate, or a file replayed; partial and final lines that say what Transcriber.stream says; clear refusals."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import wave

import numpy as np
import pytest
import soundfile
import torch

from asr.audio import resample
from asr.inference.live import paced, pcm_pieces
from asr.inference.transcriber import Transcriber
from asr.inference.transcribing import main
from tests.conftest import save_checkpoint
from tests.streams import RATE, speech_and_pauses, streaming_module


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
