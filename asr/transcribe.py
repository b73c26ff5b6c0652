"""Transcribe audio files, folders and manifests with a checkpoint written by asr.fit (or asr.export).

    python -m asr.transcribe --checkpoint CKPT data/mini/audio/test/000001.flac     # prints "path<TAB>text"
    python -m asr.transcribe --checkpoint CKPT data/mini/test.jsonl --output hyps.jsonl   # + WER, CER, S/D/I
    python -m asr.transcribe --checkpoint CKPT recordings/ --output_dir subs/ --format srt
    python -m asr.transcribe --checkpoint CKPT meeting.flac --format vtt > meeting.vtt
    python -m asr.transcribe --checkpoint CKPT data/mini/test.jsonl --beam_size 8 --lm lm.arpa

Python:

    from asr.transcribe import Transcriber
    t = Transcriber.from_checkpoint("last.ckpt")
    t.transcribe(["a.flac", "b.wav"])                # -> ["text a", "text b"]
    t.transcribe_results(["a.flac"])[0].words         # -> [Word("call", 0.32, 0.56, 0.97), ...]

Files up to ``--chunk_seconds`` long are batched by length (up to ``--max_batch_seconds``
of padded audio); batching does not change any transcript. Longer files are read and run
in overlapping chunks and decoded from the stitched frames in bounded memory (asr/longform.py).
Word times and confidences come from CTC forced alignment (asr/output.py).

Resuming (a folder of many hours that was interrupted: run the same command again):
- ``--output_dir DIR``: one file per input, at the input's path relative to the folder or
  manifest it came from (a single file: its name), with the format's suffix (.json, .txt,
  .srt, .vtt). Each is written to a temporary file and renamed, so a file that exists is
  complete: an input whose output exists is skipped.
- ``--output FILE.jsonl``: one line per utterance, appended and flushed as each is done.
  An utterance (audio_filepath, offset) already in the file is skipped; a last line without
  its newline (torn by the interruption) is dropped and redone.
The number skipped is printed. WER/CER cover the references of this run and, with
``--output``, of the lines already in the file; the real-time factor covers this run only.

The checkpoint is loaded with ``torch.load(weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from asr import export
from asr import manifest as mf
from asr.data import ASRDataset, BucketBatchSampler
from asr.decoding import Decoder, greedy, make_decoder
from asr.longform import segments, stitched
from asr.module import ASRModule
from asr.output import FORMATS, JsonlFile, OutputDir, Result, Stdout, align, score, score_line, words_of
from asr.tokenizer import Tokenizer

AUDIO_SUFFIXES = (".flac", ".wav", ".ogg", ".mp3", ".opus", ".aiff", ".aif")
MANIFEST_SUFFIXES = (".json", ".jsonl")
WINDOW_BATCHES = 16  # short files are batched within windows of this many batches, kept in input order


class AcousticModel(Protocol):
    """What the Transcriber needs from a model (a checkpoint, an exported model, or your own)."""

    sample_rate: int  # Hz of the audio log_probs expects
    tokenizer: Tokenizer  # output class i is tokenizer piece i; 0 is the CTC blank
    frame_seconds: float  # seconds per output frame: feature hop x subsampling

    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio (B, n) fp32 and lengths (B,) in samples -> log-probs (B, T', V) fp32 on the CPU, lengths (B,)."""
        ...


class CheckpointModel:
    """AcousticModel of an ASRModule (a checkpoint of asr.fit), in eval mode on ``device``."""

    def __init__(self, module: ASRModule, device: str | torch.device = "cpu"):
        self.module, self.device = module.to(device).eval(), torch.device(device)
        self.sample_rate: int = module.hparams.sample_rate
        self.tokenizer: Tokenizer = module.tokenizer
        self.frame_seconds: float = module.model.frame_seconds

    @torch.inference_mode()
    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs, out_lengths = self.module.model(audio.to(self.device), lengths.to(self.device))
        return log_probs.float().cpu(), out_lengths.cpu()


def load_model(path: str | Path, device: str = "cpu") -> AcousticModel:
    """A model written by asr.export, or a checkpoint of asr.fit."""
    if export.is_exported(path):
        return export.load(path, device)
    return CheckpointModel(ASRModule.from_checkpoint(path, map_location=device), device)


class Transcriber:
    """A model ready to transcribe: ``Transcriber.from_checkpoint(path).transcribe(paths)``.

    Args:
        model: an AcousticModel, or an ASRModule (wrapped in CheckpointModel on ``device``).
        device: where an ASRModule runs; an AcousticModel places itself.
        max_batch_seconds: padded audio per model call (short files, or chunks of a long one).
        decoder: (log_probs (B, T', V), lengths (B,)) -> token ids per utterance; greedy by default.
        chunk_seconds: files longer than this are run in overlapping chunks of it; 0 = never chunk.
        overlap_seconds: audio shared by neighbouring chunks; half of it is context on each side.
    """

    def __init__(self, model: AcousticModel | ASRModule, device: str | torch.device = "cpu",
                 max_batch_seconds: float = 120.0, decoder: Decoder = greedy, chunk_seconds: float = 30.0,
                 overlap_seconds: float = 4.0):
        self.model = CheckpointModel(model, device) if isinstance(model, ASRModule) else model
        if chunk_seconds and not 4 * self.model.frame_seconds <= overlap_seconds <= chunk_seconds / 2:
            raise ValueError(f"--overlap_seconds must be between 4 frames ({4 * self.model.frame_seconds:g} s) "
                             f"and half of --chunk_seconds ({chunk_seconds / 2:g} s), got {overlap_seconds:g}")
        self.max_batch_seconds, self.decoder = max_batch_seconds, decoder
        self.chunk_seconds, self.overlap_seconds = chunk_seconds, overlap_seconds

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "cpu", max_batch_seconds: float = 120.0,
                        **options) -> "Transcriber":
        """From a checkpoint of asr.fit or a model of asr.export; ``options`` as in the constructor."""
        return cls(load_model(path, device), device, max_batch_seconds, **options)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def transcribe(self, paths: list[str | Path]) -> list[str]:
        """Transcripts of the audio files ``paths``, in the same order."""
        return [r.text for r in self.transcribe_results(paths)]

    def transcribe_utterances(self, utterances: list[mf.Utterance]) -> list[str]:
        """Transcripts of manifest utterances (their text is ignored), in the same order."""
        return [r.text for r in self.transcribe_results(utterances)]

    def transcribe_results(self, inputs: list[str | Path | mf.Utterance]) -> list[Result]:
        """Results (text, words with start/end/confidence, duration) of audio files or utterances, in order."""
        utterances = [u if isinstance(u, mf.Utterance) else mf.Utterance(Path(u), 0.0, "", source=str(u))
                      for u in inputs]
        return [result for _, result in self.stream([self.check(u) for u in utterances])]

    def check(self, utt: mf.Utterance) -> mf.Utterance:
        """The utterance with its real duration; unreadable or empty audio raises ManifestError naming the file."""
        checked, _ = mf.check_audio(utt, self.sample_rate, "resample")
        if isinstance(checked, mf.Problem):
            raise mf.ManifestError(str(checked))
        return checked

    def stream(self, checked: list[mf.Utterance], progress: Callable[[float], None] = lambda seconds: None
               ) -> Iterator[tuple[int, Result]]:
        """(index, Result) for utterances that passed ``check``, in input order, each as soon as it can be.

        ``progress(seconds)`` is called as audio is transcribed.
        """
        window, seconds = [], 0.0  # short utterances waiting to be batched, and their audio
        for i, utt in enumerate(checked):
            if self.chunk_seconds and utt.duration > self.chunk_seconds:
                yield from self._batched(checked, window, progress)
                window, seconds = [], 0.0
                yield i, self._long(utt, progress)
            else:
                window.append(i)
                seconds += utt.duration
                if seconds >= WINDOW_BATCHES * self.max_batch_seconds:
                    yield from self._batched(checked, window, progress)
                    window, seconds = [], 0.0
        yield from self._batched(checked, window, progress)

    @torch.inference_mode()
    def _batched(self, checked: list[mf.Utterance], indices: list[int], progress) -> Iterator[tuple[int, Result]]:
        """Results of utterances ``checked[i] for i in indices``, batched by length, yielded in that order."""
        utts = [checked[i] for i in indices]
        dataset = ASRDataset(utts, [[] for _ in utts], self.sample_rate)
        results: dict[int, Result] = {}
        for batch_indices in BucketBatchSampler([u.duration for u in utts], self.max_batch_seconds, shuffle=False):
            batch = dataset[batch_indices]
            log_probs, lengths = self.model.log_probs(batch.audio, batch.audio_lengths)
            hyps = self.decoder(log_probs, lengths)
            for row, (j, ids, n) in enumerate(zip(batch_indices, hyps, lengths.tolist())):
                results[j] = self._result(utts[j], ids, align(log_probs[row, :n], ids))
            progress(sum(utts[j].duration for j in batch_indices))
        for j, i in enumerate(indices):
            yield i, results[j]

    @torch.inference_mode()
    def _long(self, utt: mf.Utterance, progress) -> Result:
        """One utterance longer than chunk_seconds, in chunks (asr/longform.py)."""
        batch_chunks = max(1, int(self.max_batch_seconds // self.chunk_seconds))
        pieces = stitched(self.model, utt, self.chunk_seconds, self.overlap_seconds, batch_chunks, progress)
        ids, spans = [], []
        for first, log_probs in segments(pieces, round(self.chunk_seconds / self.model.frame_seconds)):
            segment_ids = self.decoder(log_probs[None], torch.tensor([len(log_probs)]))[0]
            ids += segment_ids
            spans += align(log_probs, segment_ids, first)
        return self._result(utt, ids, spans)

    def _result(self, utt: mf.Utterance, ids: list[int], spans) -> Result:
        tokenizer = self.model.tokenizer
        return Result(str(utt.audio_filepath), utt.duration, tokenizer.decode(ids),
                      words_of(spans, tokenizer, self.model.frame_seconds, utt.duration),
                      utt.text, utt.offset if utt.has_offset else None)


def collect(inputs: list[str]) -> list[tuple[mf.Utterance, str]]:
    """Audio files, folders (every audio file below, sorted) and manifests -> (utterance, output name).

    The output name is the audio's path relative to the folder or manifest it came from (a file
    given on its own: its name), without the audio suffix; a manifest line with an offset adds "@offset".
    """
    found = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
            if not files:
                raise FileNotFoundError(f"{path}: no audio files ({', '.join(AUDIO_SUFFIXES)}) below this folder")
            found += [(mf.Utterance(p, 0.0, "", source=str(p)), output_name(p, path)) for p in files]
        elif path.suffix.lower() in MANIFEST_SUFFIXES:
            utterances, problems = mf.parse_manifest(path)
            mf.report(problems, path, len(utterances) + len(problems), "error")
            found += [(u, output_name(u.audio_filepath, path.parent, u.offset if u.has_offset else None))
                      for u in utterances]
        elif path.is_file():
            found.append((mf.Utterance(path, 0.0, "", source=str(path)), path.stem))
        else:
            raise FileNotFoundError(f"{path}: no such audio file, folder or manifest")
    return found


def output_name(audio: Path, root: Path, offset: float | None = None) -> str:
    try:
        relative = audio.resolve().relative_to(root.resolve())
    except ValueError:  # a manifest may name audio outside its own folder
        relative = Path(audio.name)
    return relative.with_suffix("").as_posix() + (f"@{offset:g}" if offset is not None else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("inputs", nargs="+", help="audio files, folders of audio, or JSON-lines manifests")
    add("--checkpoint", required=True, help="a .ckpt written by python -m asr.fit, or a model of asr.export")
    add("--output", help="append one JSON line per utterance to this file; a rerun skips what it holds")
    add("--output_dir", help="write one file per input below this folder; a rerun skips existing files")
    add("--format", choices=FORMATS, default=None, help="txt (default without --output), jsonl, srt or vtt")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    add("--max_batch_seconds", type=float, default=120.0, help="padded audio per model call")
    add("--chunk_seconds", type=float, default=30.0, help="longer files run in overlapping chunks of this; 0 = never")
    add("--overlap_seconds", type=float, default=4.0, help="audio shared by neighbouring chunks")
    add("--beam_size", type=int, default=1, help="1 = greedy; more = beam search (asr.decoding.make_decoder)")
    add("--lm", help="KenLM model (.arpa or .bin) for beam search")
    add("--lm_weight", type=float, default=None, help="weight of the LM score (default: asr.decoding's)")
    add("--word_score", type=float, default=None, help="score added per word (default: asr.decoding's)")
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar on stderr (default: when stderr is a terminal)")
    args = parser.parse_args(argv)
    if args.output and args.output_dir:
        parser.error("give --output (one JSONL file) or --output_dir (one file per input), not both")
    if args.output and args.format not in (None, "jsonl"):
        parser.error(f"--output writes JSON lines; for --format {args.format} use --output_dir")
    args.format = args.format or ("jsonl" if args.output else "txt")
    if args.beam_size < 1:
        parser.error(f"--beam_size must be >= 1, got {args.beam_size}")
    return args


def build_decoder(args: argparse.Namespace, tokenizer: Tokenizer) -> Decoder:
    """asr.decoding.make_decoder from the flags; --lm_weight and --word_score default to its defaults."""
    options = {k: getattr(args, k) for k in ("lm_weight", "word_score") if getattr(args, k) is not None}
    return make_decoder(tokenizer, args.beam_size, args.lm, **options)


def open_sink(args: argparse.Namespace, found: list[tuple[mf.Utterance, str]]):
    if args.output:
        return JsonlFile(args.output)
    if args.output_dir:
        names = [name for _, name in found]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise SystemExit(f"--output_dir: two inputs would both write {twice!r}; transcribe them separately")
        return OutputDir(args.output_dir, args.format)
    if args.format in ("srt", "vtt") and len(found) > 1:
        raise SystemExit(f"--format {args.format} of {len(found)} utterances needs --output_dir")
    return Stdout(args.format)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = load_model(args.checkpoint, args.device)
    transcriber = Transcriber(model, args.device, args.max_batch_seconds, build_decoder(args, model.tokenizer),
                              args.chunk_seconds, args.overlap_seconds)
    found = collect(args.inputs)
    sink = open_sink(args, found)
    todo = [(u, name) for u, name in found
            if not sink.is_done(str(u.audio_filepath), u.offset if u.has_offset else None, name)]
    out = sys.stdout if args.output or args.output_dir else sys.stderr  # stdout stays transcripts only
    if len(todo) < len(found):
        print(f"skipped {len(found) - len(todo)} of {len(found)} utterances already in "
              f"{args.output or args.output_dir}", file=out)
    checked = [transcriber.check(u) for u, _ in todo]
    audio_seconds = sum(u.duration for u in checked)
    scored = [(row["reference"], row["text"]) for row in sink.rows if row.get("reference")]
    bar = tqdm(total=audio_seconds, file=sys.stderr, disable=None if args.progress is None else not args.progress,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} audio s [{elapsed}<{remaining}]")
    start = time.perf_counter()
    try:
        for i, result in transcriber.stream(checked, lambda seconds: bar.update(min(seconds, bar.total - bar.n))):
            sink.write(result, todo[i][1])
            if result.reference:
                scored.append((result.reference, result.text))
    finally:
        bar.close()
        sink.close()
    elapsed = time.perf_counter() - start
    summary = f"{len(checked)} files, {audio_seconds:.1f} s of audio in {elapsed:.2f} s"
    if audio_seconds:
        summary += f": real-time factor {elapsed / audio_seconds:.4f}"
    if scored:
        summary += "\n" + score_line(score(*map(list, zip(*scored))), len(scored))
    print(summary, file=out)


if __name__ == "__main__":
    main()
