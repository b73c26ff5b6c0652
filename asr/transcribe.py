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
Word times come from CTC forced alignment snapped to the speech in the audio, confidences from
the alignment (asr/result.py); the formats are in
asr/formats.py, where results go (stdout, ``--output``, ``--output_dir``) in asr/output.py.

Resuming (a folder of many hours that was interrupted: run the same command again):
- ``--output_dir DIR``: one file per input, at the input's path relative to the folder or
  manifest it came from (a single file: its name), with the format's suffix (.json, .txt,
  .srt, .vtt). Each is written to a temporary file and renamed, so a file that exists is
  complete: an input whose output exists is skipped.
- ``--output FILE.jsonl``: one line per input, appended and flushed as each is done.
  An utterance (audio_filepath, offset) already in the file without an error is skipped; a
  last line without its newline (torn by the interruption) is dropped and redone.
The number skipped is printed. WER/CER cover the references of this run and, with
``--output``, of the lines already in the file; the real-time factor covers this run only.

Bad inputs (missing, empty, non-audio or corrupt files, unusable folders, manifest lines that
are not an utterance; a manifest needs only ``audio_filepath``) are each named on one line of
stderr and, with ``--output``, in a row with an ``error`` field; the others are transcribed
(``--on_error stop``: the first ends the run). The exit code is EXIT_CODES. The Python API
gives a failed file a Result with ``error`` set, or raises TranscriptionError if asked to.

The checkpoint is loaded with ``torch.load(weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from asr import manifest as mf
from asr.acoustic import CheckpointError  # noqa: F401  (Transcriber.from_checkpoint raises it: importable here)
from asr.acoustic import AcousticModel, CheckpointModel, load_model
from asr.audio import AudioError, check_finite, load_audio, resample
from asr.decoding import Decoder, greedy, make_decoder
from asr.formats import FORMATS
from asr.inputs import check_all, collect, failed, in_order
from asr.longform import segments, stitched
from asr.module import ASRModule
from asr.output import Sink, open_sink
from asr.result import Result, align, blank_frames, confident, loudness, words_of
from asr.sampler import BucketBatchSampler
from asr.scoring import score, score_line
from asr.tokenizer import Tokenizer

WINDOW_BATCHES = 16  # short files are batched within windows of this many batches, kept in input order
ON_ERROR = ("continue", "stop")
EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2  # see EXIT_CODES
EXIT_CODES = """exit codes:
  0  every input was transcribed (in this run, or already in --output / --output_dir)
  1  some inputs failed (each named on stderr, and a row with "error" in JSONL output); the others were transcribed
  2  nothing was transcribed: every input failed, --on_error stop met a bad input, or a flag, the checkpoint
     or the output cannot be used"""


class TranscriptionError(ValueError):
    """An input that cannot be transcribed, with on_error="stop"; the message names the file (and line)."""


class Transcriber:
    """A model ready to transcribe: ``Transcriber.from_checkpoint(path).transcribe(paths)``.

    Args:
        model: an AcousticModel, or an ASRModule (wrapped in CheckpointModel on ``device``).
        device: where an ASRModule runs; an AcousticModel places itself.
        max_batch_seconds: padded audio per model call (short files, or chunks of a long one).
        decoder: (log_probs (B, T', V), lengths (B,)) -> token ids per utterance; greedy by default.
        chunk_seconds: files longer than this are run in overlapping chunks of it; 0 = never chunk.
        overlap_seconds: audio shared by neighbouring chunks; half of it is context on each side.
        min_confidence: words whose confidence (the mean posterior of their frames, 0..1) is below this are
            dropped from the words and the text; 0 keeps every word.
    """

    def __init__(self, model: AcousticModel | ASRModule, device: str | torch.device = "cpu",
                 max_batch_seconds: float = 120.0, decoder: Decoder = greedy, chunk_seconds: float = 30.0,
                 overlap_seconds: float = 4.0, min_confidence: float = 0.0):
        self.model = CheckpointModel(model, device) if isinstance(model, ASRModule) else model
        if chunk_seconds and not 4 * self.model.frame_seconds <= overlap_seconds <= chunk_seconds / 2:
            raise ValueError(f"--overlap_seconds must be between 4 frames ({4 * self.model.frame_seconds:g} s) "
                             f"and half of --chunk_seconds ({chunk_seconds / 2:g} s), got {overlap_seconds:g}")
        self.max_batch_seconds, self.decoder = max_batch_seconds, decoder
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"--min_confidence must be between 0 and 1, got {min_confidence:g}")
        self.chunk_seconds, self.overlap_seconds = chunk_seconds, overlap_seconds
        self.min_confidence = min_confidence

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "cpu", **options) -> "Transcriber":
        """From a checkpoint of asr.fit or a model of asr.export (else CheckpointError); ``options`` as in
        the constructor."""
        return cls(load_model(path, device), device, **options)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def transcribe(self, paths: list[str | Path], on_error: str = "continue") -> list[str]:
        """Transcripts of the audio files ``paths``, in the same order; a file that cannot be transcribed
        gives "" and a warning naming it (``on_error="stop"``: TranscriptionError instead)."""
        return [r.text for r in self._warned(self.transcribe_results(paths, on_error))]

    def transcribe_utterances(self, utterances: list[mf.Utterance], on_error: str = "continue") -> list[str]:
        """Transcripts of manifest utterances (their text is ignored), in the same order; failures as in
        ``transcribe``."""
        return [r.text for r in self._warned(self.transcribe_results(utterances, on_error))]

    @staticmethod
    def _warned(results: list[Result]) -> list[Result]:
        for r in results:
            if r.error:
                warnings.warn(r.error, stacklevel=3)
        return results

    def transcribe_results(self, inputs: list[str | Path | mf.Utterance], on_error: str = "continue"
                           ) -> list[Result]:
        """Results (text, words with start/end/confidence, duration) of audio files or utterances, in order.

        An input that cannot be transcribed (missing, empty, not audio, corrupt) gives a Result whose
        ``error`` names it and the reason, and the others are transcribed; with ``on_error="stop"``
        the first such input raises TranscriptionError instead.
        """
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        utterances = [u if isinstance(u, mf.Utterance) else mf.Utterance(Path(u), 0.0, "", source=str(u))
                      for u in inputs]
        order, checked, _ = check_all(self.check, [(utt, "") for utt in utterances])
        unreadable = next((item for item in order if isinstance(item, Result)), None)
        if unreadable and on_error == "stop":
            raise TranscriptionError(unreadable.error)
        results = []
        for _, result in in_order(order, self.stream(checked)):
            if result.error and on_error == "stop":
                raise TranscriptionError(result.error)
            results.append(result)
        return results

    def check(self, utt: mf.Utterance) -> tuple[mf.Utterance | mf.Problem, dict]:
        """Read the audio's header: (the utterance with its real duration, or a Problem naming the file
        and reason; notes {"resampled", "stereo"}), as asr.manifest.check_audio."""
        return mf.check_audio(utt, self.sample_rate, "resample")

    def stream(self, checked: list[mf.Utterance], progress: Callable[[float], None] = lambda seconds: None
               ) -> Iterator[tuple[int, Result]]:
        """(index, Result) for utterances that passed ``check``, in input order, each as soon as it can be.

        A file that fails while being read (corrupt or truncated data) gives a Result with ``error``;
        it never stops the others. ``progress(seconds)`` is called as audio is transcribed.
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

    def _load(self, utt: mf.Utterance) -> torch.Tensor | Result:
        """The utterance's samples at the model's rate (n,) float32, or a failed Result naming it."""
        try:
            samples, rate = load_audio(utt.audio_filepath, utt.offset, utt.duration if utt.has_offset else None)
            check_finite(samples, str(utt.audio_filepath))
        except AudioError as err:  # load_audio's message names the file; a manifest line adds FILE:LINE
            return failed(utt, str(err) if utt.source == str(utt.audio_filepath) else f"{utt.source}: {err}")
        return resample(torch.from_numpy(samples), rate, self.sample_rate)

    @torch.inference_mode()
    def _batched(self, checked: list[mf.Utterance], indices: list[int], progress) -> Iterator[tuple[int, Result]]:
        """Results of utterances ``checked[i] for i in indices``, batched by length, yielded in that order."""
        utts = [checked[i] for i in indices]
        results: dict[int, Result] = {}
        for batch_indices in BucketBatchSampler([u.duration for u in utts], self.max_batch_seconds, shuffle=False):
            loaded = {j: self._load(utts[j]) for j in batch_indices}
            results |= {j: r for j, r in loaded.items() if isinstance(r, Result)}
            audio = {j: a for j, a in loaded.items() if isinstance(a, torch.Tensor)}
            if audio:
                padded = torch.nn.utils.rnn.pad_sequence(list(audio.values()), batch_first=True)  # (B, n)
                log_probs, lengths = self.model.log_probs(padded, torch.tensor([len(a) for a in audio.values()]))
                hyps = self.decoder(log_probs, lengths)
                for row, (j, ids, n) in enumerate(zip(audio, hyps, lengths.tolist())):
                    levels = loudness(audio[j], self.sample_rate, self.model.frame_seconds)
                    spans, blank = align(log_probs[row, :n], ids), blank_frames(log_probs[row, :n])
                    results[j] = self._result(utts[j], ids, spans, levels, blank / max(n, 1))
            progress(sum(utts[j].duration for j in batch_indices))
        for j, i in enumerate(indices):
            yield i, results[j]

    @torch.inference_mode()
    def _long(self, utt: mf.Utterance, progress) -> Result:
        """One utterance longer than chunk_seconds, in chunks (asr/longform.py); unreadable: a failed Result."""
        batch_chunks = max(1, int(self.max_batch_seconds // self.chunk_seconds))
        pieces = stitched(self.model, utt, self.chunk_seconds, self.overlap_seconds, batch_chunks, progress)
        levels: list[torch.Tensor] = []  # the loudness of the pieces read: 0.4 kB per second of audio
        ids, spans, blank, frames = [], [], 0, 0
        try:
            for first, log_probs in segments(heard(pieces, levels), round(self.chunk_seconds / self.model.frame_seconds)):
                segment_ids = self.decoder(log_probs[None], torch.tensor([len(log_probs)]))[0]
                ids += segment_ids
                spans += align(log_probs, segment_ids, first)
                blank, frames = blank + blank_frames(log_probs), frames + len(log_probs)
        except AudioError as err:  # found mid-file: nothing of it is kept
            return failed(utt, str(err))
        return self._result(utt, ids, spans, torch.cat(levels), blank / max(frames, 1))

    def _result(self, utt: mf.Utterance, ids: list[int], spans, levels: torch.Tensor, blank_share: float) -> Result:
        """``levels``: the utterance's loudness (asr.result), which its word times are snapped to."""
        tokenizer = self.model.tokenizer
        words = words_of(spans, tokenizer, self.model.frame_seconds, utt.duration, levels)
        text = tokenizer.decode(ids)
        if self.min_confidence:
            kept = confident(words, self.min_confidence)
            text = text if len(kept) == len(words) else " ".join(w.word for w in kept)
            words = kept
        return Result(str(utt.audio_filepath), utt.duration, text, words, utt.text,
                      utt.offset if utt.has_offset else None, blank_share=blank_share)


def heard(pieces: Iterator[tuple[torch.Tensor, torch.Tensor]], levels: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The log-probs of asr.longform.stitched's (log-probs, loudness) pieces; their loudness goes to ``levels``."""
    for log_probs, piece_levels in pieces:
        levels.append(piece_levels)
        yield log_probs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0],
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("inputs", nargs="+", help="audio files, folders of audio, or JSON-lines manifests (audio_filepath; "
        "text and duration optional)")
    add("--checkpoint", required=True, help="a .ckpt written by python -m asr.fit, or a model of asr.export")
    add("--output", help="append one JSON line per input to this file; a rerun skips what it holds, retries errors")
    add("--output_dir", help="write one file per input below this folder; a rerun skips existing files")
    add("--format", choices=FORMATS, default=None,  # FORMATS: every Format class, so a new one is listed too
        help=f"{', '.join(FORMATS)} (asr.formats); default: txt, or jsonl with --output")
    add("--on_error", choices=ON_ERROR, default="continue",
        help="continue: report a bad input on stderr (and in JSONL) and go on; stop: end the run at the first")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    own = inspect.signature(Transcriber).parameters  # the constructor owns these defaults
    add("--max_batch_seconds", type=float, default=own["max_batch_seconds"].default, help="padded audio per model call")
    add("--chunk_seconds", type=float, default=own["chunk_seconds"].default,
        help="longer files run in overlapping chunks of this; 0 = never")
    add("--overlap_seconds", type=float, default=own["overlap_seconds"].default,
        help="audio shared by neighbouring chunks")
    add("--min_confidence", type=float, default=own["min_confidence"].default,
        help="drop words whose confidence (0..1, the mean posterior of their frames) is below this; "
             "0 keeps all (docs/transcription.md: choosing it)")
    add("--beam_size", type=int, default=1, help="1 = greedy; more = beam search (asr.decoding.make_decoder)")
    add("--lm", help="KenLM model (.arpa or .bin) for beam search")
    add("--lm_weight", type=float, default=None, help="weight of the LM score (default: asr.decoding's)")
    add("--word_score", type=float, default=None, help="score added per word, or per character with a character LM (default: asr.decoding's)")
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
    if args.max_batch_seconds <= 0:
        parser.error(f"--max_batch_seconds must be > 0, got {args.max_batch_seconds}")
    return args


def build_decoder(args: argparse.Namespace, tokenizer: Tokenizer) -> Decoder:
    """asr.decoding.make_decoder from the flags; --lm_weight and --word_score default to its defaults."""
    options = {k: getattr(args, k) for k in ("lm_weight", "word_score") if getattr(args, k) is not None}
    return make_decoder(tokenizer, args.beam_size, args.lm, **options)


@dataclass
class Tally:
    """What a run of asr.transcribe did, for its closing lines and exit code."""

    done: int = 0  # inputs transcribed in this run
    failed: int = 0
    skipped: int = 0  # inputs already done in the output by an earlier run
    audio_seconds: float = 0.0  # of the inputs transcribed
    scored: list[tuple[str, str]] = field(default_factory=list)  # (reference, hypothesis), earlier runs' too
    unscored: int = 0  # transcribed without a reference text

    def add(self, result: Result) -> None:
        if result.error:
            self.failed += 1
            return
        self.done, self.audio_seconds = self.done + 1, self.audio_seconds + result.duration
        if result.reference:
            self.scored.append((result.reference, result.text))
        else:
            self.unscored += 1

    def summary(self, elapsed: float) -> str:
        """Files and audio transcribed, real-time factor (``elapsed`` s), failures, WER/CER of the references."""
        text = f"{self.done} files, {self.audio_seconds:.1f} s of audio in {elapsed:.2f} s"
        if self.audio_seconds:
            text += f": real-time factor {elapsed / self.audio_seconds:.4f}"
        if self.failed:
            text += f"\n{self.failed} of {self.done + self.failed} inputs failed (each named above)"
        if self.scored:
            text += "\n" + score_line(score(*map(list, zip(*self.scored))), len(self.scored))
            if self.unscored:
                text += f"; {self.unscored} without text not scored"
        return text


def transcribe_all(args: argparse.Namespace) -> int:
    """The run of ``main`` after parsing; returns the exit code (EXIT_CODES)."""
    model = load_model(args.checkpoint, args.device)
    transcriber = Transcriber(model, args.device, args.max_batch_seconds, build_decoder(args, model.tokenizer),
                              args.chunk_seconds, args.overlap_seconds, args.min_confidence)
    found = collect(args.inputs)
    sink = open_sink(args.output, args.output_dir, args.format,
                     [name for u, name in found if isinstance(u, mf.Utterance)])
    todo = [(u, name) for u, name in found if isinstance(u, mf.Problem)
            or not sink.is_done(str(u.audio_filepath), u.offset if u.has_offset else None, name)]
    out = sys.stdout if args.output or args.output_dir else sys.stderr  # stdout stays transcripts only
    tally = Tally(skipped=len(found) - len(todo), scored=[(r["reference"], r["text"]) for r in sink.rows
                                                          if r.get("reference")])
    if tally.skipped:
        print(f"skipped {tally.skipped} of {len(found)} utterances already in {args.output or args.output_dir}",
              file=out)
    order, checked, notes = check_all(transcriber.check, todo)
    mf.say_notes(notes, args.inputs[0] if len(args.inputs) == 1 else "inputs", transcriber.sample_rate,
                 lambda message: print(message, file=sys.stderr))
    failures = [item.error for item in order if isinstance(item, Result)]
    if failures and args.on_error == "stop":
        print("\n".join(failures) + f"\n--on_error stop: {len(failures)} of {len(todo)} inputs cannot be read; "
              "nothing was transcribed", file=sys.stderr)
        sink.close()
        return EXIT_FAILED
    start = time.perf_counter()
    stopped = write_results(transcriber, order, checked, sink, [name for _, name in todo], tally, args)
    if stopped:
        return EXIT_FAILED
    print(tally.summary(time.perf_counter() - start), file=out)
    return EXIT_OK if not tally.failed else EXIT_PARTIAL if tally.done or tally.skipped else EXIT_FAILED


def write_results(transcriber: Transcriber, order: list[Result | int], checked: list[mf.Utterance], sink: Sink,
                  names: list[str], tally: Tally, args: argparse.Namespace) -> bool:
    """Transcribe ``checked`` and write every input's result (failures: a line on stderr too) in input
    order, counting them in ``tally``; True if --on_error stop ended the run at a failure."""
    bar = tqdm(total=sum(u.duration for u in checked), file=sys.stderr,
               disable=None if args.progress is None else not args.progress,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} audio s [{elapsed}<{remaining}]")
    try:
        streamed = transcriber.stream(checked, lambda seconds: bar.update(min(seconds, bar.total - bar.n)))
        for position, result in in_order(order, streamed):
            if result.error:
                tqdm.write(result.error, file=sys.stderr)
            if result.error and args.on_error == "stop":
                print("--on_error stop: the run ends at this input; run again to resume", file=sys.stderr)
                return True
            tally.add(result)
            sink.write(result, names[position])
    finally:
        bar.close()
        sink.close()
    return False


def main(argv: list[str] | None = None) -> int:
    """``python -m asr.transcribe``; returns the exit code (EXIT_CODES). Bad flags exit with 2 (argparse)."""
    args = parse_args(argv)
    try:
        return transcribe_all(args)
    except (OSError, ValueError) as err:  # the checkpoint, an option or the output cannot be used
        print(f"python -m asr.transcribe: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
