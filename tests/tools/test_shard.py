"""``python -m asr.shard`` on a bad day (issue 61): lines given twice, audio at a lower rate, more --jobs than cores,
a full disk, Ctrl-C and a kill; tests/data/test_shards.py covers what it writes and how training reads it."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asr.data.shards import INDEX, TOKENIZER
from asr.tokenizer import Tokenizer
from asr.tools import sharding as command
from asr.tools.sharding import shard
from tests import REPO
from tests.conftest import row
from tests.data.test_shards import mini


def test_lines_given_twice_are_written_once_and_said(tmp_path):
    manifest, said = str(mini(tmp_path, 12)), []
    index = shard(tmp_path / "out", [manifest, manifest], shard_size=5, say=said.append)
    assert index.utterances == 12
    assert said == [f"12 manifest lines repeat an earlier line's audio file, offset and duration (e.g. {manifest}:1 "
                    f"repeats {manifest}:1): each utterance is written once"]


def test_audio_upsampled_to_the_shards_rate_is_said(tmp_path, write_audio):
    manifest = tmp_path / "mixed.jsonl"
    rows = [row(str(write_audio("narrow.flac", 1.0, rate=8000)), "call"),
            row(str(write_audio("wide.flac", 1.0, rate=16000)), "call")]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = []
    shard(tmp_path / "out", [str(manifest)], tokenizer_type="char", say=said.append)
    assert said == ["1 of 2 utterances are 8000 Hz audio, upsampled to --sample_rate 16000: they hold nothing above "
                    "4000 Hz. To train a 8000 Hz model, write its shards with --sample_rate 8000"]
    said.clear()
    shard(tmp_path / "narrow", [str(manifest)], sample_rate=8000, tokenizer_type="char", say=said.append)
    assert said == ["1 of 2 utterances are 16000 Hz audio, downsampled to --sample_rate 8000"]


def test_more_jobs_than_cores_are_capped_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "usable_cores", lambda: 1)
    started = []
    monkeypatch.setattr(command, "write_shards", lambda folder, chunks, rate, jobs: started.append(jobs) or
                        [command.write_shard(folder, n, chunk, rate) for n, chunk in enumerate(chunks)])
    said = []
    shard(tmp_path / "out", [str(mini(tmp_path, 6))], shard_size=2, jobs=64, say=said.append)
    assert started == [1] and said == ["--jobs 64: this process may use 1 cores, so 1 shards are written at a time"]


def test_a_disk_that_fills_while_the_tokenizer_is_written_leaves_no_half_file(tmp_path, monkeypatch):
    def half_then_full(self, path):
        Path(path).write_bytes(self.serialized[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Tokenizer, "save", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        shard(tmp_path / "out", [str(mini(tmp_path, 4))], say=lambda message: None)
    assert not (tmp_path / "out" / TOKENIZER).exists() and not (tmp_path / "out" / INDEX).exists()
    assert not list((tmp_path / "out").glob("*.partial"))


def writers_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` and that run asr's shard writers (multiprocessing's spawn children,
    not its resource tracker)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            command_line = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields.get("PPid", "0")) == pid and b"spawn_main" in command_line:
            found.append(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:\t")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def start_writing(tmp_path: Path, name: str) -> tuple[subprocess.Popen, list[int]]:
    """python -m asr.shard --jobs 2 on enough lines to be still writing once both writers have begun; returns the
    process (its own process group) and its writers' ids."""
    manifest = mini(tmp_path, 400, f"{name}.jsonl")
    process = subprocess.Popen([sys.executable, "-m", "asr.shard", str(tmp_path / name), str(manifest),
                                "--shard_size", "5", "--jobs", "2"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: os.sched_setaffinity(0, range(os.cpu_count())))  # not pytest's one core
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        writers = writers_of(process.pid)
        if len(writers) == 2 and len(list((tmp_path / name).glob("recording.*"))) >= 2:  # both are writing
            return process, writers
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"asr.shard did not start 2 writers: {process.communicate()[1][-2000:]}")


@pytest.mark.skipif(not Path("/proc/self/status").exists() or (os.cpu_count() or 1) < 2,
                    reason="reads the process table from /proc; 2 writers need 2 cores (--jobs is capped at them)")
def test_ctrl_c_ends_the_command_and_its_writers_with_one_message(tmp_path):
    process, writers = start_writing(tmp_path, "interrupted")
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == (
        f"python -m asr.shard: interrupted: {tmp_path / 'interrupted'} is unfinished (no index.json); run the same "
        "command again to finish it"), stderr[-2000:]
    assert not [pid for pid in writers if alive(pid)], "shard writers outlived the command"


def test_a_writer_ends_once_its_parent_is_gone(monkeypatch):
    """What a writer does when asr.shard is killed (SIGKILL: no handler of the command runs): it is given to another
    parent, and ends."""
    ended, stop = threading.Event(), threading.Event()
    monkeypatch.setattr(command, "PARENT_CHECK_SECONDS", 0.01)
    monkeypatch.setattr(command.os, "_exit", lambda code: ended.set())
    watcher = threading.Thread(target=command.end_with_parent, args=(os.getppid(), stop), daemon=True)
    watcher.start()
    assert not ended.wait(0.2)  # its parent is there
    monkeypatch.setattr(command.os, "getppid", lambda: 1)  # the parent was killed: init (or a subreaper) adopts it
    assert ended.wait(5)
    watcher.join(5)
