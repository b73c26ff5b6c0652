"""Shards (python -m asr.shard, asr.data.shards): every line checked once when written, read back by slot without
overlap, batched like the manifest path, from a folder, an https:// server and an s3:// server on localhost."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import subprocess
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import SimpleNamespace

import pytest
import soundfile
import torch
from torch.utils.data import DataLoader

from asr.audio import AudioError
from asr.data.augment import Augmentation
from asr.data.shard_run import check_partition, shards_tokenizer
from asr.data.shards import (INDEX, CutBatcher, EndlessShards, ShardIndex, ShardsError, ShardStream, decode,
                             equal_duration_bins)
from asr.tools.sharding import ShardError, shard
from tests import MINI, REPO
from tests.servers import s3_server, web_server


def mini(tmp: Path, count: int, name: str = "train.jsonl", start: int = 0) -> Path:
    """``count`` lines of the bundled training set from line ``start``, with absolute paths."""
    rows = [json.loads(line) for line in (MINI / "train.jsonl").read_text().splitlines()[start:start + count]]
    path = tmp / name
    path.write_text("".join(json.dumps(dict(r, audio_filepath=str(MINI / r["audio_filepath"]))) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """60 bundled utterances in 6 shards of 10."""
    tmp = tmp_path_factory.mktemp("shards")
    shard(tmp / "train", [str(mini(tmp, 60))], shard_size=10, jobs=2, tokenizer_type="char")
    return tmp / "train"


def texts_of(folder: Path) -> Counter:
    return Counter(json.loads(line)["supervisions"][0]["text"] for path in folder.glob("cuts.*.jsonl.gz")
                   for line in gzip.open(path, "rt"))


def batcher(index: ShardIndex, speeds=(1.0,), augmentation=Augmentation.off(), unusable=lambda utt, ids, speed: None):
    return CutBatcher(index.tokenizer(), 16000, speeds, augmentation, unusable)


def test_the_command_writes_every_line_once_with_an_index_and_a_tokenizer(shards):
    index = ShardIndex.read(str(shards), "data.train_shards")
    assert index.utterances == 60 and len(index.shards) == 6
    manifest = [json.loads(line) for line in (shards.parent / "train.jsonl").read_text().splitlines()]
    assert texts_of(shards) == Counter(r["text"] for r in manifest)
    assert index.seconds == pytest.approx(sum(r["duration"] for r in manifest), abs=0.05)
    assert set(index.tokenizer().sp.id_to_piece(i) for i in range(index.tokenizer().vocab_size)) >= {"c", "a"}


def test_bad_lines_are_listed_and_not_written_and_a_finished_folder_is_not_overwritten(tmp_path, write_audio):
    manifest = mini(tmp_path, 20)
    short = write_audio("short.flac", 0.5)
    with open(manifest, "a") as f:
        f.write(json.dumps({"audio_filepath": str(tmp_path / "gone.flac"), "duration": 1.0, "text": "call"}) + "\n")
        f.write(json.dumps({"audio_filepath": str(short), "duration": 2.0, "text": "call"}) + "\n")
        f.write("{not json\n")
    with pytest.raises(Exception, match="3 of 23 lines are unusable"):  # 13% > the 1% that training allows
        shard(tmp_path / "strict", [str(manifest)], shard_size=8)
    assert not (tmp_path / "strict" / INDEX).exists()
    shard(tmp_path / "out", [str(manifest)], shard_size=8, max_dropped_share=0.2)
    listed = (tmp_path / "out" / "bad_lines.txt").read_text()
    assert f"{manifest}:21" in listed and f"{manifest}:22" in listed and f"{manifest}:23" in listed
    assert "holds 0.500 s, 2.000 s expected" in listed
    assert sum(texts_of(tmp_path / "out").values()) == 20
    with pytest.raises(ShardError, match="already holds shards"):
        shard(tmp_path / "out", [str(manifest)])


def test_the_command_line_says_what_it_wrote(tmp_path):
    result = subprocess.run([sys.executable, "-m", "asr.shard", str(tmp_path / "out"), str(mini(tmp_path, 12)),
                             "--shard_size", "5"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "12 utterances, 0.01 h in 3 shards, tokenizer of" in result.stdout


def test_a_writer_that_dies_names_jobs_and_the_same_command_then_finishes_the_folder(tmp_path, monkeypatch):
    class DyingPool(ProcessPoolExecutor):  # what the parent sees when the kernel kills a writer (out of memory)
        def map(self, *args, **kwargs):
            raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    manifest = str(mini(tmp_path, 12))
    monkeypatch.setattr("asr.tools.sharding.ProcessPoolExecutor", DyingPool)
    monkeypatch.setattr("asr.tools.sharding.usable_cores", lambda: 2)  # --jobs 2 is capped at the cores: a pool needs 2
    with pytest.raises(ShardError, match=r"out: a shard writer process died .* again, with fewer --jobs"):
        shard(tmp_path / "out", [manifest], shard_size=5, jobs=2)
    assert not (tmp_path / "out" / INDEX).exists()
    monkeypatch.undo()
    assert shard(tmp_path / "out", [manifest], shard_size=5, jobs=2).utterances == 12


def test_a_folder_without_its_index_is_refused_by_name(tmp_path):
    (tmp_path / "cuts.000000.jsonl.gz").write_bytes(b"")
    with pytest.raises(ShardsError, match=f"data.train_shards: {tmp_path} has no index.json"):
        ShardIndex.read(str(tmp_path), "data.train_shards")


def test_slots_split_each_pass_without_overlap_and_each_pass_is_a_new_order(shards):
    listed = ShardIndex.read(str(shards), "x").shards
    readers = [EndlessShards(listed, slot, 3, 0, 1, "seed") for slot in range(3)]
    passes = [list(itertools.islice(reader.passes(), 3)) for reader in readers]
    for number in range(3):
        taken = [s["cuts"] for reader in passes for s in reader[number]]
        assert sorted(taken) == sorted(s["cuts"] for s in listed)  # every shard once per pass, by one slot
    assert passes[0][0] != passes[0][1] or passes[0][1] != passes[0][2]
    with pytest.raises(ShardsError, match="x: 6 shards for 8 readers \\(2 ranks x 4 data workers\\)"):
        EndlessShards(listed, 0, 2, 0, 4, "seed", "x")
    # ranks of different worker counts still split the corpus: rank 0 with 1 worker, rank 1 with 2
    split = [s["cuts"] for s in next(EndlessShards(listed, 0, 2, 0, 1, "s").passes())] + \
        [s["cuts"] for w in range(2) for s in next(EndlessShards(listed, 1, 2, w, 2, "s").passes())]
    assert sorted(split) == sorted(s["cuts"] for s in listed)


def test_two_workers_read_every_utterance_of_a_pass_in_batches_of_similar_length(shards):
    index = ShardIndex.read(str(shards), "x")
    stream = ShardStream([index], [1.0], batcher(index), max_batch_seconds=8.0, seed=0, rank=0, world=1, buffer=100)
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    seen, padded, audio = Counter(), 0, 0
    for batch in itertools.islice(loader, 100):
        seen.update(batch.texts)
        padded += batch.audio.numel()
        audio += int(batch.audio_lengths.sum())
        assert batch.audio.shape[0] * batch.audio.shape[1] <= 8.0 * 16000 * 1.3
    assert set(seen) == set(texts_of(shards))  # 100 batches are several passes: every text came
    assert 1 - audio / padded < 0.15


def test_a_reader_buffers_at_most_one_pass_of_its_shards(shards, monkeypatch):
    """data.shards.buffer's 10,000 cuts are more than 60 utterances hold: the first batch comes after one pass over
    the reader's shards, not after reading them again and again to fill the buffer with copies of the same cuts."""
    from asr.data import shards as module

    index, real, reads = ShardIndex.read(str(shards), "x"), module.read_shard, Counter()

    def counted(shard, *args, **kwargs):
        reads[shard["cuts"]] += 1
        yield from real(shard, *args, **kwargs)

    monkeypatch.setattr(module, "read_shard", counted)
    stream = ShardStream([index], [1.0], batcher(index), 8.0, seed=0, rank=1, world=2, buffer=10_000)
    assert stream.buffer_size(0, 1) == 30  # rank 1 of 2 reads 3 of the 6 shards of 10 in a pass
    assert next(iter(stream)).texts
    assert 3 <= sum(reads.values()) <= 4 and max(reads.values()) == 1, reads  # 10,000 cuts: 1,000 reads


def test_a_resumed_stream_is_reseeded_from_its_step_and_repeatable(shards):
    index = ShardIndex.read(str(shards), "x")

    def first(start: int) -> list[list[str]]:
        stream = ShardStream([index], [1.0], batcher(index), 8.0, seed=0, rank=0, world=1, buffer=100, start=start)
        return [b.texts for b in itertools.islice(stream, 3)]

    assert first(0) == first(0)
    assert first(500) == first(500) != first(0)


def test_ranks_read_different_shards(shards):
    """Rank r of 2 (one worker each) is slot r: in a pass, the two read disjoint halves of the corpus."""
    index = ShardIndex.read(str(shards), "x")
    passes = [{cut.id for cut in itertools.islice(ShardStream([index], [1.0], batcher(index), 8.0, 0, rank, 2, 100)
                                                  .cuts(0, 1), 30)} for rank in range(2)]
    assert not passes[0] & passes[1] and len(passes[0] | passes[1]) == 60


def test_corpora_mix_in_proportion_to_their_weights(tmp_path, shards):
    shard(tmp_path / "other", [str(mini(tmp_path, 30, "other.jsonl", start=300))], shard_size=10,
          tokenizer_model=str(shards / "tokenizer.model"))
    a, b = ShardIndex.read(str(shards), "x"), ShardIndex.read(str(tmp_path / "other"), "x")
    theirs = set(texts_of(tmp_path / "other"))
    stream = ShardStream([a, b], [1.0, 3.0], batcher(a), 8.0, seed=0, rank=0, world=1, buffer=20)
    texts = [t for batch in itertools.islice(stream, 60) for t in batch.texts]
    share = sum(t in theirs for t in texts) / len(texts)
    assert 0.6 < share < 0.9  # 3 of 4
    assert shards_tokenizer([a, b]).serialized == a.tokenizer().serialized


def test_corpora_with_different_tokenizers_are_refused(tmp_path, shards):
    shard(tmp_path / "other", [str(mini(tmp_path, 10))], shard_size=10, tokenizer_type="unigram")
    with pytest.raises(ShardsError, match="different tokenizers"):
        shards_tokenizer([ShardIndex.read(str(shards), "x"), ShardIndex.read(str(tmp_path / "other"), "x")])


def test_a_text_too_long_for_its_audio_is_dropped_by_name_not_silently(shards):
    index = ShardIndex.read(str(shards), "x")
    refuse = "call"

    def unusable(utt, ids, speed):
        from asr.data.manifest import Problem
        return Problem(utt.source, "too short for its transcript", "test") if utt.text.startswith(refuse) else None

    stream = ShardStream([index], [1.0], batcher(index, unusable=unusable), 8.0, 0, 0, 1, 100)
    batches = list(itertools.islice(stream, 30))
    assert not any(t.startswith(refuse) for b in batches for t in b.texts)
    dropped = [note[1] for note in stream.notes.heard() if note[0] == "fault"]
    assert dropped and all("train.jsonl:" in d and "too short for its transcript" in d for d in dropped)


def test_speeds_are_drawn_before_bucketing_and_checked_with_tempo_as_in_the_manifest_path(shards):
    index = ShardIndex.read(str(shards), "x")
    checked = []
    tempo = Augmentation.off(tempo_prob=1.0, tempo_factors=(1.2, 1.2))
    stream = ShardStream([index], [1.0], batcher(index, speeds=(0.9, 1.1), augmentation=tempo,
                                                 unusable=lambda utt, ids, speed: checked.append(speed)), 8.0, 0, 0, 1, 100)
    torch.manual_seed(0)
    cuts = list(itertools.islice(stream.cuts(0, 1), 60))
    assert {c.custom["speed"] for c in cuts} == {0.9, 1.1}
    originals = {json.loads(line)["id"]: json.loads(line)["duration"] for path in shards.glob("cuts.*.jsonl.gz")
                 for line in gzip.open(path, "rt")}
    assert all(c.duration == pytest.approx(originals[c.id] / c.custom["speed"]) for c in cuts)
    assert {round(speed, 6) for speed in checked} == {round(0.9 * 1.2, 6), round(1.1 * 1.2, 6)}  # x the fastest tempo


def test_non_speech_augmentation_applies_as_in_the_manifest_path(shards):
    index = ShardIndex.read(str(shards), "x")
    torch.manual_seed(0)
    stream = ShardStream([index], [1.0], batcher(index, augmentation=Augmentation.off(nonspeech_prob=0.5)), 8.0, 0, 0,
                         1, 100)
    batches = list(itertools.islice(stream, 20))
    assert any(t == "" for b in batches for t in b.texts)  # non-speech: no words
    assert any(t != "" for b in batches for t in b.texts)


def test_a_bad_utterance_counts_once_over_many_passes_and_a_lost_shard_as_its_utterances(shards, tmp_path,
                                                                                         monkeypatch):
    import shutil
    import tarfile

    from asr.data import shards as module
    from asr.data.faults import DataFaults
    from asr.data.stream_loader import StreamLoader
    monkeypatch.setattr(module, "RETRY_SECONDS", 0.0)
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    tar = broken / "recording.000002.tar"  # ends cleanly after 4 of its 10 utterances: no read error at all
    with tarfile.open(tar) as whole:
        members = [(m, whole.extractfile(m).read()) for m in whole.getmembers()[:8]]
    with tarfile.open(tar, "w") as short:
        for member, data in members:
            short.addfile(member, io.BytesIO(data))
    index = ShardIndex.read(str(broken), "x")
    refused = next(json.loads(line)["supervisions"][0]["text"] for line in gzip.open(broken / "cuts.000000.jsonl.gz",
                                                                                      "rt"))
    unusable = (lambda utt, ids, speed: __import__("asr.data.manifest", fromlist=["Problem"]).Problem(
        utt.source, "too short for its transcript", "test") if utt.text == refused else None)
    loader = StreamLoader(ShardStream([index], [1.0], batcher(index, unusable=unusable), 8.0, 0, 0, 1, 20),
                          batch_size=None)
    loader.faults = DataFaults("train", 60, max_share=0.5)
    with pytest.warns(UserWarning, match="no longer loads") as named:
        list(itertools.islice(loader, 60))  # several passes over the 60: each meets both again
    assert loader.faults.passes == 1 and loader.faults.lost == 1 + 6
    counted = sorted(loader.faults.in_pass.values(), key=lambda item: item[1])
    assert [count for _, count in counted] == [1, 6] and "too short for its transcript" in counted[0][0]
    assert counted[1][0].startswith(f"{tar}: shard unreadable after 3 tries, its last 6 utterances skipped")
    assert len([w for w in named if "no longer loads" in str(w.message)]) == 2  # each named once


def test_equal_duration_bins_give_each_bucket_the_same_seconds():
    durations = sorted([1.0] * 50 + [4.0] * 50)
    assert equal_duration_bins(durations, 2) == [4.0]
    assert equal_duration_bins([1.0, 2.0, 3.0, 4.0], 1) == []


@pytest.mark.parametrize("server", ["https", "s3"])
def test_shards_stream_from_a_server_on_localhost(server, shards):
    """Both through lhotse's reader (smart_open): an https server with a certificate of its own, and an
    S3-compatible server (moto)."""
    with (web_server(shards.parent) if server == "https" else s3_server(shards)) as (address, _):
        root = f"{address}/{shards.name}" if server == "https" else address
        index = ShardIndex.read(root, "data.train_shards")
        assert index.digest == ShardIndex.read(str(shards), "x").digest
        stream = ShardStream([index], [1.0], batcher(index), 8.0, 0, 0, 1, 100)
        texts = {t for b in itertools.islice(stream, 20) for t in b.texts}
        assert texts <= set(texts_of(shards)) and len(texts) > 20
        with pytest.raises(ShardsError, match="data.train_shards: cannot read .*/nothing/index.json"):
            ShardIndex.read(root.rsplit("/", 1)[0] + "/nothing", "data.train_shards")


def test_ranks_that_read_different_indexes_are_stopped_naming_their_digests(shards, tmp_path, monkeypatch):
    """Each rank gathers the others' index digests (one all_gather_object), never their files."""
    shard(tmp_path / "other", [str(mini(tmp_path, 10))], shard_size=10)
    ours, theirs = ShardIndex.read(str(shards), "x"), ShardIndex.read(str(tmp_path / "other"), "x")

    def gather(gathered, digests):  # rank 1 was given the other folder
        gathered[0], gathered[1] = digests, [theirs.digest]

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_gather_object", gather)
    trainer = type("Trainer", (), {"world_size": 2})()
    with pytest.raises(ShardsError, match=f"0: {ours.digest}; 1: {theirs.digest}"):
        check_partition(lambda: [ours], trainer)
    monkeypatch.setattr(torch.distributed, "all_gather_object",
                        lambda gathered, digests: gathered.__setitem__(slice(None), [digests, digests]))
    check_partition(lambda: [ours], trainer)

    def unreadable():
        raise ShardsError("data.train_shards: cannot read s3://gone/index.json")

    with pytest.raises(ShardsError, match="rank 0: data.train_shards: cannot read s3://gone"):
        check_partition(unreadable, trainer)  # it still gathered: the other ranks stop too


def test_a_shard_that_breaks_mid_read_is_named_and_the_stream_goes_on(shards, tmp_path):
    """A tar cut short (a failed copy, a dropped connection): its first utterances are read, the rest is named once
    as skipped, and the other shards stream on."""
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    tar = broken / "recording.000003.tar"
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    index = ShardIndex.read(str(broken), "x")
    from asr.data import shards as module
    cuts = list(module.read_shard(index.shards[3], tries=2))
    assert 0 < len(cuts) - 1 < 10 and "shard unreadable after 2 tries" in cuts[-1].custom["problem"]
    stream = ShardStream([index], [1.0], batcher(index), 8.0, 0, 0, 1, 10)
    batches = list(itertools.islice(stream, 40))
    said = [note[1] for note in stream.notes.heard() if note[0] == "fault"]
    assert said and all(d.startswith(f"{tar}: shard unreadable after 3 tries, its last ") for d in said)
    assert len({t for b in batches for t in b.texts}) > 20  # the other shards streamed on


@pytest.mark.parametrize("train_shards, settings, message", [
    (["a", "b"], {"weights": [1.0]}, "one positive weight per data.train_shards entry"),
    ("a", {"weights": [0.0]}, "data.shards.weights must be positive"),
    ("a", {"buffer": 0}, "data.shards.buffer must be at least 1"),
    ("a", {"stall_seconds": -1.0}, r"data.shards.stall_seconds must be >= 0 \(0: wait for ever\)"),
])
def test_shard_settings_out_of_range_are_refused_by_name(train_shards, settings, message):
    from asr.data.datamodule import ASRDataModule
    from asr.data.shard_run import ShardsConfig
    with pytest.raises(ValueError, match=message):
        ASRDataModule(train_shards=train_shards, shards=ShardsConfig(**settings))


def test_an_index_that_does_not_add_up_or_a_tokenizer_that_is_not_one_is_refused_by_name(shards, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    index = json.loads((broken / INDEX).read_text())
    (broken / INDEX).write_text(json.dumps({**index, "utterances": 65}))
    with pytest.raises(ShardsError, match=rf"x: {broken}/index.json says 65 utterances \(.* s\), but its 6 shards hold "
                                          "60 .*: it was changed since python -m asr.shard wrote it"):
        ShardIndex.read(str(broken), "x")
    (broken / INDEX).write_text(json.dumps(index))
    (broken / "tokenizer.model").write_bytes(b"\x08\x01 not a sentencepiece model")
    with pytest.raises(ShardsError, match=f"data.train_shards: {broken}/tokenizer.model is not a tokenizer of asr"):
        ShardIndex.read(str(broken), "x").tokenizer()


def test_a_recording_that_does_not_decode_is_named_by_its_line_as_a_file_would_be(tmp_path):
    """A shard's recording is read as every audio file is (asr.audio.AudioFile): its bytes decoded in memory, the
    error in the files' wording, naming the utterance's manifest line; a good one gives its samples and rate."""
    def cut(data: bytes):
        return SimpleNamespace(recording=SimpleNamespace(sources=[SimpleNamespace(source=data)]))

    with pytest.raises(AudioError, match=r"^train.jsonl:7: cannot read audio \("):
        decode(cut(b"not audio at all"), "train.jsonl:7")
    flac = io.BytesIO()
    soundfile.write(flac, [[0.25, -0.25]] * 800, 8000, format="FLAC")  # stereo: mixed to mono as files are
    wave, rate = decode(cut(flac.getvalue()), "train.jsonl:8")
    assert rate == 8000 and wave.shape == (800,) and float(wave.abs().max()) < 1e-6
