"""``python -m asr.shard OUT MANIFEST...`` (also ``asr shard``): JSON-lines manifests -> Lhotse Shar shards.

Every line's audio is read once, here, offline: mixed to mono, checked (readable, finite, as long as its line says),
resampled to ``--sample_rate`` and written as FLAC into ``recording.NNNNNN.tar`` beside its cut in
``cuts.NNNNNN.jsonl.gz`` (Lhotse's Shar layout: ``lhotse.CutSet.from_shar(fields=...)`` reads them with the
lists from the index; ``in_dir=`` would take index.json for a field), ``--shard_size``
utterances a shard, ``--jobs`` shards at a time (at most one per core; each writer ends with this process). A line
that repeats an earlier one (the same audio file, offset and duration) is written once, and said so; audio upsampled
to ``--sample_rate`` is said too (it holds nothing above its own rate's half). Bad lines follow training's rule
(``--on_bad_line``, ``--max_dropped_share``) and are listed in ``OUT/bad_lines.txt``. The tokenizer is trained once on the
manifests' texts, before any audio is read (``OUT/tokenizer.model``) and ``OUT/index.json`` is written last (asr.data.shards.ShardIndex): a
folder without it is unfinished, and training refuses it. Training reads the shards with ``--data.train_shards OUT``
(a folder, or the same files at an ``https://`` or ``s3://`` address) and opens no other file at start-up.

    python -m asr.shard shards/train data/mini/train.jsonl --shard_size 100
    python -m asr.fit --data.train_shards shards/train --trainer.max_steps 2000 --trainer.val_check_interval 200
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import multiprocessing
import os
import random
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import soundfile
import torch

from asr.atomic import write_atomically
from asr.audio import AudioError, resample
from asr.data import manifest as mf
from asr.data.datamodule import BAD_LINES_FILE
from asr.data.shards import BUCKETS, INDEX, TOKENIZER, ShardIndex, equal_duration_bins
from asr.data.sources import ManifestSource, read_utterance
from asr.hardware import usable_cores
from asr.tokenizer import DEFAULT_MODEL_TYPE, DEFAULT_VOCAB_SIZE, MODEL_TYPES, Tokenizer

QUANTILES = 200  # durations kept in the index, so that mixtures of corpora get buckets without reading cuts
PARENT_CHECK_SECONDS = 1.0  # how often a shard writer looks whether the command that started it is still there


class ShardError(ValueError):
    """A shard folder that cannot be written: the message names the flag or file."""


def cut_line(cut_id: str, seconds: float, sample_rate: int, samples: int, text: str, source: str) -> dict:
    """One line of ``cuts.NNNNNN.jsonl.gz``: a Lhotse MonoCut whose recording is the tar's next FLAC file."""
    recording = {"id": cut_id, "sources": [{"type": "shar", "channels": [0], "source": ""}],
                 "sampling_rate": sample_rate, "num_samples": samples, "duration": seconds, "channel_ids": [0]}
    supervision = {"id": cut_id, "recording_id": cut_id, "start": 0.0, "duration": seconds, "channel": 0,
                   "text": text}
    return {"id": cut_id, "start": 0.0, "duration": seconds, "channel": 0, "supervisions": [supervision],
            "recording": recording, "custom": {"source": source}, "type": "MonoCut"}


def read_checked(utt: mf.Utterance, sample_rate: int) -> tuple[torch.Tensor, int]:
    """The utterance's audio at ``sample_rate``, and the rate the file holds; AudioError naming its line if
    unreadable, not finite or short (asr.data.sources.read_utterance)."""
    samples, rate = read_utterance(utt)
    return resample(torch.from_numpy(samples), rate, sample_rate), rate


def write_shard(folder: Path, number: int, utterances: list[mf.Utterance], sample_rate: int) -> dict:
    """Write shard ``number`` (its tar, then its cuts, each whole or not at all); returns its index entry, with
    the problems met, the durations written and how many utterances came at each other rate (resampled)."""
    from lhotse.shar.writers.tar import TarWriter  # lhotse is imported only where shards are made or read

    names = {"cuts": f"cuts.{number:06d}.jsonl.gz", "recording": f"recording.{number:06d}.tar"}
    problems, lines, durations, resampled = [], [], [], Counter()
    with write_atomically(folder / names["recording"]) as tar_path:
        with TarWriter(str(tar_path), shard_size=None) as tar:
            for i, utt in enumerate(utterances):
                try:
                    wave, rate = read_checked(utt, sample_rate)
                except AudioError as err:
                    problems.append(mf.Problem(utt.source, "unusable audio", str(err).split(": ", 1)[-1]))
                    continue
                resampled[rate] += rate != sample_rate
                cut_id, flac = f"{number:06d}-{i:06d}", io.BytesIO()
                soundfile.write(flac, wave.numpy(), sample_rate, format="FLAC")
                line = cut_line(cut_id, len(wave) / sample_rate, sample_rate, len(wave), utt.text, utt.source)
                tar.write(f"{cut_id}.flac", io.BytesIO(flac.getvalue()))
                tar.write(f"{cut_id}.json", io.BytesIO(json.dumps(line["recording"]).encode()), count=False)
                lines.append(line)
                durations.append(line["duration"])
    with write_atomically(folder / names["cuts"]) as cuts_path, gzip.open(cuts_path, "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return {**names, "utterances": len(lines), "seconds": round(sum(durations), 3), "problems": problems,
            "durations": durations, "resampled": +resampled}


def write_shards(folder: Path, chunks: list[list[mf.Utterance]], sample_rate: int, jobs: int) -> list[dict]:
    """``write_shard`` for each chunk, in order: in this process for one job, else in ``jobs`` spawned processes.
    Not forked: a fork of a process that runs threads (torch's, a test runner's, a notebook's) can die or hang in
    the child. A writer that dies (out of memory, killed) is a ShardError naming --jobs; the shards written stay
    whole and the folder unfinished (no index.json), so the same command can be run again. The writers end with
    this process: when it stops on an error or Ctrl-C (``stop``), and when it is killed (``end_with_parent``). They
    are born ignoring Ctrl-C (SIGINT), which a terminal sends to each: it is this process's to handle, with one
    message, not a traceback per process."""
    if jobs <= 1:
        return [write_shard(folder, number, chunk, sample_rate) for number, chunk in enumerate(chunks)]
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=writer_started, initargs=(os.getpid(), stop))
    try:
        with ctrl_c_ignored():  # map submits every shard now, which starts the writers: they inherit it
            written = pool.map(write_shard, [folder] * len(chunks), range(len(chunks)), chunks,
                               [sample_rate] * len(chunks))
        return list(written)
    except BrokenProcessPool as err:
        raise ShardError(f"{folder}: a shard writer process died ({err}); the folder is unfinished: run the same "
                         f"command again, with fewer --jobs if memory ran out") from err
    except BaseException:  # Ctrl-C, or an error: the writers stop now instead of finishing their shards
        stop.set()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


@contextlib.contextmanager
def ctrl_c_ignored():
    """SIGINT ignored while the block runs (in the main thread; elsewhere Python lets no thread change it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def writer_started(parent: int, stop) -> None:
    """A shard writer's first act: a thread that ends it when ``stop`` is set (its parent stopped on Ctrl-C or an
    error) or the parent is gone (killed)."""
    threading.Thread(target=end_with_parent, args=(parent, stop), daemon=True).start()


def end_with_parent(parent: int, stop) -> None:
    """Return only by ending this process, once ``stop`` is set or process ``parent`` is no longer its parent."""
    while not stop.wait(PARENT_CHECK_SECONDS) and os.getppid() == parent:
        pass
    os._exit(1)


def make_tokenizer(texts: list[str], model_type: str, vocab_size: int, given: str | None) -> Tokenizer:
    """The shards' tokenizer, made before any audio is read: ``given`` (--tokenizer_model), or one trained on the
    manifests' texts; ShardError naming the flag if it cannot be."""
    try:
        return Tokenizer.load(given) if given else Tokenizer.train(texts, model_type, vocab_size)
    except (OSError, ValueError, RuntimeError) as err:  # missing, not a model, or sentencepiece's trainer refusing
        flag = f"--tokenizer_model {given}" if given else f"--tokenizer_vocab_size {vocab_size} ({model_type})"
        raise ShardError(f"{flag}: {' '.join(str(err).split())[:200]}") from err


def read_manifests(manifests: list[str], say: Callable[[str], None]) -> tuple[list[mf.Utterance], list[mf.Problem]]:
    """Every manifest's utterances, each once (a line that repeats an earlier one's audio file, offset and duration,
    in the same manifest or another, or a manifest given twice, is left out, and ``say`` says how many), and its bad
    lines; ShardError naming a manifest that cannot be read."""
    utterances, problems, first, repeats = [], [], {}, []
    for path in manifests:
        try:
            good, bad = ManifestSource(path, "manifest").parse()
        except mf.ManifestError as err:
            raise ShardError(f"manifest {path}: {err.__cause__ or err}") from err
        for utt in good:
            key = (os.path.abspath(utt.audio_filepath), utt.offset, utt.duration)
            if key in first:
                repeats.append((utt.source, first[key]))
            else:
                first[key] = utt.source
                utterances.append(utt)
        problems += bad
    if repeats:
        say(f"{len(repeats)} manifest lines repeat an earlier line's audio file, offset and duration (e.g. "
            f"{repeats[0][0]} repeats {repeats[0][1]}): each utterance is written once")
    return utterances, problems


def say_resampled(resampled: Counter, written: int, sample_rate: int, say: Callable[[str], None]) -> None:
    """Say how many of the ``written`` utterances came at another rate than ``sample_rate``, by rate; upsampled
    audio is named as such: it holds nothing above its own rate's half, which a model of ``sample_rate`` learns
    from."""
    for rate, count in sorted(resampled.items()):
        change = "upsampled" if rate < sample_rate else "downsampled"
        said = f"{count} of {written} utterances are {rate} Hz audio, {change} to --sample_rate {sample_rate}"
        if rate < sample_rate:
            said += (f": they hold nothing above {rate // 2} Hz. To train a {rate} Hz model, write its shards with "
                     f"--sample_rate {rate}")
        say(said)


def shard(folder: Path, manifests: list[str], shard_size: int = 1000, sample_rate: int = 16000, jobs: int = 1,
          seed: int = 0, tokenizer_type: str = DEFAULT_MODEL_TYPE, tokenizer_vocab_size: int = DEFAULT_VOCAB_SIZE,
          tokenizer_model: str | None = None, on_bad_line: str = "skip", max_dropped_share: float = 0.01,
          say: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> ShardIndex:
    """Write the shards, the tokenizer and the index of ``manifests`` into ``folder`` (see the module's doc); ``say``
    tells what the user should know (lines written once, resampled audio, --jobs above the cores)."""
    if (folder / INDEX).exists():
        raise ShardError(f"{folder} already holds shards ({INDEX}); write them elsewhere or remove it first")
    folder.mkdir(parents=True, exist_ok=True)
    utterances, problems = read_manifests(manifests, say)
    tokenizer = make_tokenizer([u.text for u in utterances], tokenizer_type, tokenizer_vocab_size, tokenizer_model)
    random.Random(seed).shuffle(utterances)  # each shard a sample of the whole: speakers and lengths mixed
    chunks = [utterances[i:i + shard_size] for i in range(0, len(utterances), shard_size)]
    cores = usable_cores()
    if jobs > cores:
        say(f"--jobs {jobs}: this process may use {cores} cores, so {cores} shards are written at a time")
    written = write_shards(folder, chunks, sample_rate, min(jobs, cores, len(chunks)))
    lines = len(utterances) + len(problems)
    problems += [p for entry in written for p in entry.pop("problems")]
    listing = folder / BAD_LINES_FILE
    listing.unlink(missing_ok=True)
    mf.report(problems, ", ".join(manifests), lines, on_bad_line, max_dropped_share, listing, settings="")
    durations = sorted(d for entry in written for d in entry.pop("durations"))
    if not durations:
        raise ShardError(f"{', '.join(manifests)}: no usable utterance to write")
    say_resampled(sum((entry.pop("resampled") for entry in written), Counter()), len(durations), sample_rate, say)
    with write_atomically(folder / TOKENIZER) as path:  # a full disk leaves no half tokenizer
        tokenizer.save(path)
    index = {"format": ShardIndex.FORMAT, "sample_rate": sample_rate, "utterances": len(durations),
             "seconds": round(sum(durations), 3), "tokenizer": TOKENIZER, "made_from": list(manifests),
             "duration_bins": equal_duration_bins(durations, BUCKETS),
             "durations": [durations[round(q * (len(durations) - 1) / (QUANTILES - 1))] for q in range(QUANTILES)],
             "shards": [entry for entry in written if entry["utterances"]]}
    with write_atomically(folder / INDEX) as path:
        path.write_text(json.dumps(index, indent=1) + "\n")
    return ShardIndex(str(folder), index)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.shard", description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the folder to write the shards, tokenizer.model and index.json into")
    parser.add_argument("manifests", nargs="+", help="JSON-lines manifests (asr.data.manifest), written together")
    parser.add_argument("--shard_size", type=int, default=1000, help="utterances per shard (1000 of 10 s: ~300 MB)")
    parser.add_argument("--sample_rate", type=int, default=16000, help="Hz the audio is stored at (the model's)")
    parser.add_argument("--jobs", type=int, default=1, help="shards written at a time (processes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle that spreads lines over shards")
    parser.add_argument("--tokenizer_type", choices=MODEL_TYPES, default=DEFAULT_MODEL_TYPE)
    parser.add_argument("--tokenizer_vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--tokenizer_model", help="store this tokenizer (.model or checkpoint) instead of training one")
    parser.add_argument("--on_bad_line", choices=mf.BAD_LINE_POLICIES, default="skip")
    parser.add_argument("--max_dropped_share", type=float, default=0.01)
    args = parser.parse_args(argv)
    if args.shard_size < 1 or args.jobs < 1 or args.sample_rate < 1:
        parser.error("--shard_size, --jobs and --sample_rate must be positive")
    try:
        index = shard(Path(args.output), args.manifests, args.shard_size, args.sample_rate, args.jobs, args.seed,
                      args.tokenizer_type, args.tokenizer_vocab_size, args.tokenizer_model, args.on_bad_line,
                      args.max_dropped_share)
    except (ShardError, mf.ManifestError, OSError) as err:
        sys.exit(f"{parser.prog}: error: {err}")
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted: {args.output} is unfinished (no {INDEX}); run the same command again to "
              "finish it", file=sys.stderr)
        sys.exit(130)
    print(f"{args.output}: {index.utterances} utterances, {index.seconds / 3600:.2f} h in {len(index.shards)} shards, "
          f"tokenizer of {index.tokenizer().vocab_size} pieces")


def run() -> None:
    """The command, as ``asr shard`` and ``python -m asr.shard`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
