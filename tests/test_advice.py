"""Every command's advice names flags that command accepts (issue 61: asr.shard's advice named asr.fit's
--data.filter.max_dropped_share, which asr.shard refuses). The messages that carry a flag are made as each command makes
them, and each flag is checked against the parser of the command it belongs to (tests/test_docs.py reads them): a flag
after ``python -m asr.X`` (up to a closing bracket or a comma) is asr.X's, any other the command's that says it."""

from __future__ import annotations

import json
import re
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import pytest

from asr.data import manifest as mf
from asr.data.shard_run import check_by_steps, shards_tokenizer
from asr.data.shards import EndlessShards, ShardIndex
from asr.data.stream_loader import Watch
from asr.inference.output import open_sink
from asr.tools import sharding as shard_command
from asr.train.finetune import FineTune
from asr.train.init_from import check_selection
from tests.conftest import row
from tests.data.test_shards import mini
from tests.test_docs import COMMAND, accepts, flags, home

SHARD, FIT, TRANSCRIBE = "asr.tools.sharding", "asr.train.fitting", "asr.transcribe"


def advised(message: str, command: str) -> list[tuple[str, str]]:
    """(module, flag) for each flag of ``message``, said by ``command``'s module (a sentence's full stop is not the
    flag's)."""
    flags_in = lambda text: [flag.rstrip(".") for flag in flags(text)]  # noqa: E731
    pairs, own, position = [], [], 0
    for match in COMMAND.finditer(message):
        name = f"python -m {match[1] or match[2]}" if match[1] or match[2] else f"asr {match[3]}"
        own.append(message[position:match.start()])
        rest = message[match.end():]
        end = re.search(r"[),;]|$", rest).start()
        pairs += [(home(name), flag) for flag in flags_in(rest[:end])]
        position = match.end() + end
    own.append(message[position:])
    return pairs + [(command, flag) for flag in flags_in("".join(own))]


def said(action) -> str:
    """The message of the error ``action`` raises."""
    with pytest.raises(Exception) as raised:
        action()
    return str(raised.value)


def shard_messages(tmp_path, monkeypatch) -> list[str]:
    """What python -m asr.shard says with a flag in it: bad lines, tokenizers, writers, cores, rates."""
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text(mini(tmp_path, 1).read_text() + json.dumps(row(str(tmp_path / "gone.flac"), "call")) + "\n")
    messages = [said(lambda: shard_command.shard(tmp_path / "a", [str(manifest)], say=print)),
                said(lambda: shard_command.shard(tmp_path / "b", [str(manifest)], on_bad_line="error", say=print)),
                said(lambda: shard_command.make_tokenizer(["call"], "unigram", 8, str(tmp_path / "none.model"))),
                said(lambda: shard_command.make_tokenizer(["call five two nine"], "unigram", 3, None))]

    class DyingPool(ProcessPoolExecutor):
        def map(self, *args, **kwargs):
            raise BrokenProcessPool("terminated abruptly")

    monkeypatch.setattr(shard_command, "ProcessPoolExecutor", DyingPool)
    messages.append(said(lambda: shard_command.write_shards(tmp_path / "c", [[], []], 16000, 2)))
    monkeypatch.setattr(shard_command, "usable_cores", lambda: 1)
    monkeypatch.setattr(shard_command, "write_shards", lambda *args: [])
    told: list[str] = []
    said(lambda: shard_command.shard(tmp_path / "d", [str(mini(tmp_path, 2))], jobs=4, say=told.append))
    shard_command.say_resampled({8000: 1}, 2, 16000, told.append)
    return messages + told


def fit_messages(tmp_path) -> list[str]:
    """What python -m asr.fit says with a flag in it about shards, their faults and stalls, and fine-tuning."""
    shard_command.shard(tmp_path / "one", [str(mini(tmp_path, 4, "one.jsonl"))], shard_size=2, say=print)
    shard_command.shard(tmp_path / "two", [str(mini(tmp_path, 4, "two.jsonl"))], shard_size=2,
                        tokenizer_type="unigram", tokenizer_vocab_size=40, say=print)
    one, two = (ShardIndex.read(str(tmp_path / name), "data.train_shards") for name in ("one", "two"))
    (tmp_path / "one" / "tokenizer.model").write_bytes(b"not one")
    trainer = SimpleNamespace(max_steps=-1, callbacks=[], val_check_interval=1.0)
    watch = Watch(1, 1.0, clock=iter([0.0, 5.0, 5.0, 5.0]).__next__)
    watch.hear([("reading", 0, "s3://b/recording.000001.tar"), ("fault", "s3://b/recording.000000.tar: lost", 2)])
    stalled_pass = Watch(1, 0.0)
    stalled_pass.hear([("fault", "s3://b/recording.000000.tar: lost", 2), ("pass", 0, "s3://b", 0)])
    from asr.data.faults import DataFaults
    faults = DataFaults("train", 4, 0.01, mend="Check or write the shards again (python -m asr.shard)")
    own = {"model.encoder.a": None, "model.head.b": None}
    return [said(lambda: faults.record(("s3://b/recording.000000.tar: lost",), (2,))),
            watch.stalled(), stalled_pass.stalled(),
            said(lambda: check_by_steps(trainer, validates=False)),
            said(lambda: check_by_steps(SimpleNamespace(**{**vars(trainer), "max_steps": 5}), validates=True)),
            said(lambda: shards_tokenizer([two, ShardIndex(two.root.replace("two", "one"), one.data)])),
            said(lambda: one.tokenizer()),
            said(lambda: EndlessShards(one.shards, 0, 4, 0, 2, "seed")),
            said(lambda: check_selection(own, [], FineTune(include="model.enocder.*"), "x.ckpt")),
            said(lambda: mf.report([mf.Problem("m.jsonl:1", "empty text", "")], "m.jsonl", 2, "skip")),
            said(lambda: mf.report([mf.Problem("m.jsonl:1", "empty text", "")], "m.jsonl", 2, "error"))]


def transcribe_messages() -> list[str]:
    return [said(lambda: open_sink(None, "out", "txt", ["a", "a"])),
            said(lambda: open_sink(None, None, "srt", ["a", "b"]))]


def test_every_flag_a_command_advises_is_one_it_accepts(tmp_path, monkeypatch):
    messages = [(SHARD, m) for m in shard_messages(tmp_path, monkeypatch)]
    monkeypatch.undo()
    messages += [(FIT, m) for m in fit_messages(tmp_path)] + [(TRANSCRIBE, m) for m in transcribe_messages()]
    pairs = [(module, flag, message) for command, message in messages for module, flag in advised(message, command)]
    reached = {(module, flag) for module, flag, _ in pairs}
    assert {(SHARD, "--max_dropped_share"), (SHARD, "--on_bad_line"), (SHARD, "--jobs"), (SHARD, "--shard_size"),
            (FIT, "--data.filter.max_dropped_share"), (FIT, "--data.shards.stall_seconds"),
            (FIT, "--model.finetune.allow_partial"), (TRANSCRIBE, "--output_dir")} <= reached, reached
    wrong = [f"{module} {flag}: {message}" for module, flag, message in pairs if not accepts(module, flag)]
    assert not wrong, "\n".join(wrong)
