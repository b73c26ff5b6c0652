"""asr.transcribe on the files people really have: bad inputs are named on one line each and never
stop the others; odd but valid audio transcribes; exit codes say success, partial success, failure.

Two tables drive the tests: BAD (each input, and the message it must give) and ODD (valid audio
in unusual formats, rates, channel counts and lengths). Every test runs them all in one run,
mixed, through the CLI (``main``, once as a real subprocess) and through the Python API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from asr.inference.transcriber import Transcriber, TranscriptionError
from asr.inference.transcribing import main
from tests.conftest import sine


def write(path: Path, seconds: float, rate: int = 16000, channels: int = 1, **options) -> None:
    soundfile.write(path, sine(seconds, rate, channels), rate, **options)


def mangled(seconds: float, how) -> callable:
    """A maker of an audio file of ``seconds`` (its format from its name) whose bytes ``how(data)`` then spoils."""

    def make(path: Path) -> None:
        write(path, seconds, subtype="PCM_16")
        path.write_bytes(how(path.read_bytes()))

    return make


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def corrupt(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + b"\xff" * 2000 + data[middle + 2000:]


# name -> (how to make it under the folder, the message it must give). Manifest lines are in m.jsonl.
BAD = {
    "empty.wav": (lambda p: p.write_bytes(b""), "empty.wav: unreadable audio: empty file (0 bytes)"),
    "text.wav": (lambda p: p.write_text("not audio\n"), "text.wav: unreadable audio: Format not recognised"),
    "header_only.wav": (lambda p: p.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt "), "header_only.wav: unreadable audio"),
    "truncated.flac": (mangled(1.0, truncate), "truncated.flac: truncated audio: its header promises 16000 frames"),
    "truncated.wav": (mangled(1.0, lambda data: data[:60]), "truncated.wav: truncated audio: its header promises "
                      "16000 frames (1.000 s), the file holds 8 (0.001 s): cut short"),
    "corrupt.flac": (mangled(1.0, corrupt), "corrupt.flac: cannot read audio"),
    "corrupt_long.flac": (mangled(5.0, corrupt), "corrupt_long.flac: cannot read audio"),  # the chunked path
    "nan.wav": (lambda p: soundfile.write(p, np.full(8000, np.nan, np.float32), 16000, subtype="FLOAT"),
                "nan.wav: NaN or infinite values in 8000 samples"),
    "nan_long.wav": (lambda p: soundfile.write(p, np.r_[sine(3.0, 16000), np.nan, sine(2.0, 16000)], 16000,
                                               subtype="FLOAT"), "nan_long.wav: NaN or infinite values in 1 samples"),
}
BAD_LINES = [  # (manifest line, message)
    ({"audio_filepath": "audio/missing.flac", "text": "call nine"}, "m.jsonl:2: missing audio file"),
    ("{not json", "m.jsonl:3: malformed json"),
    ({"text": "call nine"}, "m.jsonl:4: missing key: no audio_filepath"),
    ({"audio_filepath": "audio/plain.flac", "offset": 9.0}, "m.jsonl:5: empty audio"),
    ({"audio_filepath": "audio/plain.flac", "offset": -1}, "m.jsonl:6: bad number"),
    ({"audio_filepath": "audio/plain.flac", "offset": 0.2, "duration": 1.5}, "m.jsonl:7: audio shorter than its line"),
]
GOOD_LINES = [  # a reference, none, no duration: all fine for transcription
    {"audio_filepath": "audio/plain.flac", "duration": 1.0, "text": "call five two nine"},
    {"audio_filepath": "audio/stereo.flac"},
]


ODD = {
    "plain.flac": lambda p: write(p, 1.0),
    "stereo.flac": lambda p: write(p, 1.0, channels=2),
    "six_channels.wav": lambda p: write(p, 0.5, channels=6),
    "8khz.wav": lambda p: write(p, 1.0, 8000),
    "22khz.wav": lambda p: write(p, 0.7, 22050),
    "44khz.flac": lambda p: write(p, 0.7, 44100),
    "48khz.wav": lambda p: write(p, 0.7, 48000),
    "16001hz.wav": lambda p: write(p, 0.7, 16001),  # a filter of 256 million values to 16 kHz: resampled without one
    "11127hz.wav": lambda p: write(p, 0.7, 11127),  # old Macintosh audio
    "u8.wav": lambda p: write(p, 0.5, subtype="PCM_U8"),
    "pcm24.wav": lambda p: write(p, 0.5, subtype="PCM_24"),
    "pcm32.wav": lambda p: write(p, 0.5, subtype="PCM_32"),
    "float.wav": lambda p: write(p, 0.5, subtype="FLOAT"),
    "speech.mp3": lambda p: write(p, 1.0, format="MP3", subtype="MPEG_LAYER_III"),
    "speech.ogg": lambda p: write(p, 1.0, format="OGG", subtype="VORBIS"),
    "speech.opus": lambda p: write(p, 1.0, 48000, format="OGG", subtype="OPUS"),
    "silence_around.flac": lambda p: soundfile.write(
        p, np.concatenate([np.zeros(8000), sine(0.5, 16000), np.zeros(8000)]).astype(np.float32), 16000),
    "all_silence.flac": lambda p: soundfile.write(p, np.zeros(16000, np.float32), 16000),
    "100_samples.wav": lambda p: soundfile.write(p, sine(100 / 16000, 16000), 16000),
    "248_samples_44khz.wav": lambda p: soundfile.write(p, sine(248 / 44100, 44100), 44100),  # 90 at 16 kHz
    "long.flac": lambda p: write(p, 5.0),  # chunked: the run uses --chunk_seconds 2
}
CHUNKS = ["--chunk_seconds", "2", "--overlap_seconds", "0.5"]


@pytest.fixture
def inputs(tmp_path) -> dict:
    """tmp_path/audio holds every ODD and BAD file, tmp_path/m.jsonl the GOOD and BAD lines; also a
    missing path and a folder without audio. Returns {"args": CLI inputs, "bad": {input: message}}."""
    audio = tmp_path / "audio"
    audio.mkdir()
    for name, make in ODD.items():
        make(audio / name)
    for name, (make, _) in BAD.items():
        make(audio / name)
    lines = [GOOD_LINES[0], *(line for line, _ in BAD_LINES), GOOD_LINES[1]]
    (tmp_path / "m.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    (tmp_path / "no_audio").mkdir()
    (tmp_path / "no_audio" / "notes.txt").write_text("nothing to hear")
    bad = {str(audio / name): message for name, (_, message) in BAD.items()}
    bad |= {f"m.jsonl:{i}": message for i, (_, message) in enumerate(BAD_LINES, start=2)}
    bad |= {"nope.wav": "nope.wav: missing input", str(tmp_path / "no_audio"): "no_audio: no audio: no audio files"}
    args = [str(audio), str(tmp_path / "m.jsonl"), str(tmp_path / "nope.wav"), str(tmp_path / "no_audio")]
    return {"args": args, "bad": bad, "good": len(ODD) + len(GOOD_LINES), "audio": audio}


def run(checkpoint, *args: str, capsys) -> tuple[int, str, str]:
    code = main(["--checkpoint", str(checkpoint), *CHUNKS, "--no-progress", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_each_bad_input_is_one_line_and_one_error_row_and_the_good_ones_are_transcribed(
        checkpoint, inputs, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    code, printed, err = run(checkpoint, *inputs["args"], "--output", str(out), capsys=capsys)
    assert code == 1  # partial
    assert "Traceback" not in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == inputs["good"] + len(inputs["bad"])  # one row per input, in input order:
    names = [row["audio_filepath"] and Path(row["audio_filepath"]).name for row in rows]
    lines = ["plain.flac", "missing.flac", None, None, "plain.flac", "plain.flac", "plain.flac", "stereo.flac"]  # m.jsonl
    assert names == sorted([*ODD, *BAD]) + lines + ["nope.wav", "no_audio"]
    errors = [row["error"] for row in rows if "error" in row]
    assert len(errors) == len(inputs["bad"])
    for message in inputs["bad"].values():
        assert sum(message in e for e in errors) == 1, message
        assert sum(message in line for line in err.splitlines()) == 1, message  # one stderr line each
    good = [row for row in rows if "error" not in row]
    assert {Path(row["audio_filepath"]).name for row in good} >= set(ODD)
    assert all(isinstance(row["text"], str) and row["duration"] > 0 for row in good)
    assert next(r for r in good if r["audio_filepath"].endswith("100_samples.wav"))["duration"] < 0.01
    assert f"{len(inputs['bad'])} of {len(rows)} inputs failed" in printed
    assert "(1 references" in printed and f"{len(rows) - len(errors) - 1} without text not scored" in printed


def test_odd_formats_are_said_once_per_run(checkpoint, inputs, capsys):
    code, printed, err = run(checkpoint, str(inputs["audio"]), capsys=capsys)
    assert code == 1
    resampled = [line for line in err.splitlines() if "resampled to 16000 Hz" in line]
    mixed = [line for line in err.splitlines() if "several channels" in line]
    assert len(resampled) == 1 and len(mixed) == 1 and "2 of" in mixed[0]
    transcribed = dict(line.split("\t") for line in printed.splitlines() if "\t" in line)
    assert {Path(p).name for p in transcribed} == set(ODD)  # stdout: transcripts only, every odd file


def test_a_rerun_skips_what_was_done_and_retries_what_failed(checkpoint, inputs, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    run(checkpoint, *inputs["args"], "--output", str(out), capsys=capsys)
    first = len(out.read_text().splitlines())
    write(inputs["audio"] / "empty.wav", 1.0)  # the user fixes one file
    code, printed, err = run(checkpoint, *inputs["args"], "--output", str(out), capsys=capsys)
    assert code == 1 and f"skipped {inputs['good']} of" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()[first:]]
    assert len(rows) == len(inputs["bad"])  # the failures, retried; nothing done twice
    fixed = [r for r in rows if (r["audio_filepath"] or "").endswith("empty.wav")]
    assert len(fixed) == 1 and "error" not in fixed[0] and "empty.wav" not in err


def test_exit_codes_all_good_all_bad_and_stop(checkpoint, inputs, tmp_path, capsys):
    audio = inputs["audio"]
    assert run(checkpoint, str(audio / "plain.flac"), str(audio / "100_samples.wav"), capsys=capsys)[0] == 0
    code, printed, err = run(checkpoint, str(audio / "empty.wav"), str(tmp_path / "nope.wav"), capsys=capsys)
    assert code == 2 and printed == "" and len(err.splitlines()) == 2 + 2  # two errors, then the summary
    out = tmp_path / "strict.jsonl"
    code, _, err = run(checkpoint, str(audio), "--on_error", "stop", "--output", str(out), capsys=capsys)
    assert code == 2 and "empty.wav: unreadable audio" in err and "nothing was transcribed" in err
    assert out.read_text() == ""  # the headers stop it before anything is transcribed
    code, _, err = run(checkpoint, str(audio / "plain.flac"), str(audio / "corrupt.flac"), "--on_error", "stop",
                       capsys=capsys)
    assert code == 2 and "corrupt.flac: cannot read audio" in err and "run ends at this input" in err


def test_bad_checkpoints_and_flags_are_one_line_and_exit_2(checkpoint, inputs, tmp_path, capsys):
    audio = str(inputs["audio"] / "plain.flac")
    (tmp_path / "text.ckpt").write_text("hello")
    (tmp_path / "cut.ckpt").write_bytes(Path(checkpoint).read_bytes()[:2000])
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    for name, message in [("none.ckpt", "no such file"), ("text.ckpt", "not a checkpoint of asr.fit"),
                          ("cut.ckpt", "not a checkpoint of asr.fit"), ("other.ckpt", "no tokenizer inside")]:
        assert main(["--checkpoint", str(tmp_path / name), audio]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and name in err and message in err, err
    for flag in ("--second_pass", "--min_confidence"):  # the Transcriber's own checks reach the command line
        assert main(["--checkpoint", str(checkpoint), audio, flag, "1.5"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"{flag} must be between 0 and 1, got 1.5" in err, err
    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", str(checkpoint), audio, "--no_such_flag"])
    assert exit_.value.code == 2 and "unrecognized arguments: --no_such_flag" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "exit codes:\n  0  every input" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_a_device_this_machine_lacks_is_named_as_the_device_not_the_checkpoint(checkpoint, inputs, capsys):
    assert main(["--checkpoint", str(checkpoint), "--device", "cuda", str(inputs["audio"] / "plain.flac")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--device cuda: " in err and "not a checkpoint" not in err, err


def test_a_folder_that_cannot_be_read_is_named_and_the_rest_is_transcribed(checkpoint, inputs, monkeypatch, capsys):
    """As root, chmod cannot make a folder unreadable: the listing refuses it as the OS would."""
    locked = inputs["audio"] / "locked"
    locked.mkdir()
    scandir = os.scandir

    def refusing(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    code, printed, err = run(checkpoint, str(inputs["audio"]), capsys=capsys)
    assert code == 1 and f"{locked}: unreadable folder: Permission denied" in err.splitlines()
    assert len([line for line in printed.splitlines() if "\t" in line]) == len(ODD)


def test_the_documented_command_exits_with_its_code_and_no_traceback(checkpoint, inputs):
    result = subprocess.run([sys.executable, "-m", "asr.transcribe", "--checkpoint", str(checkpoint),
                             *inputs["args"]], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len([line for line in result.stdout.splitlines() if "\t" in line]) == inputs["good"]


def test_python_api_reports_errors_per_file_and_raises_only_when_asked(checkpoint, inputs):
    transcriber = Transcriber.from_checkpoint(checkpoint, chunk_seconds=2.0, overlap_seconds=0.5)
    files = sorted(str(p) for p in inputs["audio"].iterdir())
    results = transcriber.transcribe_results(files)
    assert [r.audio_filepath for r in results] == files
    bad = {f: m for f, m in inputs["bad"].items() if f in files}
    for f, r in zip(files, results):
        assert (bad[f] in r.error) if f in bad else (not r.error and isinstance(r.text, str)), (f, r.error)
    with pytest.warns(UserWarning) as warned:
        texts = transcriber.transcribe(files)
    assert texts == [r.text for r in results]  # "" for each bad file, and one warning naming it
    assert sorted(str(w.message) for w in warned) == sorted(r.error for r in results if r.error)
    with pytest.raises(TranscriptionError, match="corrupt.flac: cannot read audio"):
        transcriber.transcribe_results([str(inputs["audio"] / "plain.flac"), str(inputs["audio"] / "corrupt.flac")],
                                       on_error="stop")
