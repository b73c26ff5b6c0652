"""Transcribe audio files, folders and manifests with a checkpoint written by asr.fit (or asr.export).

    python -m asr.transcribe --checkpoint CKPT data/mini/audio/test/000001.flac     # prints "path<TAB>text"
    python -m asr.transcribe --checkpoint CKPT data/mini/test.jsonl --output hyps.jsonl   # + WER, CER, S/D/I
    python -m asr.transcribe --checkpoint CKPT recordings/ --output_dir subs/ --format srt
    python -m asr.transcribe --checkpoint CKPT meeting.flac --format vtt > meeting.vtt
    python -m asr.transcribe --checkpoint CKPT data/mini/test.jsonl --beam_size 8 --lm lm.arpa
    arecord -f S16_LE -r 16000 -t raw | python -m asr.transcribe --checkpoint CKPT --stream -   # live, a streaming model
    python -m asr.transcribe --checkpoint CKPT --stream meeting.flac --realtime                 # a file, at real speed

The library is asr.inference.transcriber (Transcriber); this module is its command line, run by the stub
asr/transcribe.py.

Files up to ``--chunk_seconds`` long are batched by length (up to ``--max_batch_seconds``
of padded audio; asr.inference.transcriber says when batching can change a transcript). A file
whose decoded speech spans under ``--second_pass`` of it is run again with the statistics of
that span (asr/inference/focus.py). Longer files are read and run in overlapping chunks and
decoded from the stitched frames in bounded memory (asr/inference/longform.py).
Word times come from the objective's forced alignment (CTC's, or a transducer's Viterbi path) snapped to the speech
in the audio, confidences from the alignment (asr/inference/result.py); the formats are in
asr/inference/formats.py, where results go (stdout, ``--output``, ``--output_dir``) in asr/inference/output.py.

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

``--stream SOURCE`` (a streaming model, --model.encoder.streaming): audio as it arrives, 16-bit PCM (raw at the
model's rate, or with a WAV header) from standard input (``-``) or a file replayed (``--realtime``: at real speed),
printed as partial and final lines (asr/inference/live.py, asr/inference/streaming.py).

The checkpoint is loaded with ``torch.load(weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from dataclasses import dataclass, field

import torch

from tqdm import tqdm

from asr.data import manifest as mf
from asr.inference.acoustic import AcousticModel, load_model
from asr.inference.formats import FORMATS
from asr.inference.inputs import check_all, collect, in_order
from asr.inference.live import Printer, file_pieces, paced, pcm_pieces
from asr.inference.output import Sink, open_sink, to_stdout
from asr.inference.result import Result
from asr.inference.streaming import ENDPOINT_SECONDS, MAX_CHUNK_SECONDS
from asr.inference.transcriber import ON_ERROR, Transcriber
from asr.models.ctc_decoding import Decoder
from asr.models.objectives import CTC
from asr.scoring import score, score_line

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 130  # see EXIT_CODES
EXIT_CODES = """exit codes:
  0  every input was transcribed (in this run, or already in --output / --output_dir)
  1  some inputs failed (each named on stderr, and a row with "error" in JSONL output); the others were transcribed
  2  nothing was transcribed: every input failed, --on_error stop met a bad input, or a flag, the checkpoint
     or the output cannot be used
  130  interrupted (Ctrl-C); with --stream, after the final line of the stream so far"""



def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0],
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("inputs", nargs="*", help="audio files, folders of audio, or JSON-lines manifests (audio_filepath; "
        "text and duration optional)")
    add("--checkpoint", required=True, help="a .ckpt written by python -m asr.fit, or a model of asr.export")
    add("--output", help="append one JSON line per input to this file; a rerun skips what it holds, retries errors; "
        "- : the lines on standard output")
    add("--output_dir", help="write one file per input below this folder; a rerun skips existing files")
    add("--format", choices=FORMATS, default=None,  # FORMATS: every Format class, so a new one is listed too
        help=f"{', '.join(FORMATS)} (asr.inference.formats); default: txt, or jsonl with --output")
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
    add("--second_pass", type=float, default=own["second_pass"].default,
        help="transcribe a file again on its speech alone where the speech the first pass found spans under this "
             "share of it (non-speech around it moved the features' statistics); 0 = one pass (asr.inference.focus)")
    add("--beam_size", type=int, default=1, help="1 = greedy; more = beam search: CTC's (asr.models.ctc_decoding."
        "make_decoder), a transducer's modified beam search (asr.models.transducer_decoding)")
    add("--lm", help="KenLM model (.arpa or .bin) for CTC's beam search")
    add("--lm_weight", type=float, default=None, help="weight of the LM score (default: asr.models.ctc_decoding's)")
    add("--word_score", type=float, default=None, help="score added per word, or per character with a character LM (default: asr.models.ctc_decoding's)")
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress bar on stderr (default: when stderr is a terminal)")
    add("--stream", metavar="SOURCE", help="transcribe live with a streaming model: 16-bit PCM from standard input "
        "(-: raw at the model's rate, or with a WAV header) or an audio file, printing partial and final lines")
    add("--realtime", action="store_true", help="--stream FILE: replay the file at real speed, not as fast as it can")
    add("--stream_chunk", type=float, metavar="SECONDS", help="--stream: audio per encoder step, a whole number "
        f"of the model's frames, at most {MAX_CHUNK_SECONDS:g} s: the latency (default: the model's "
        "model.encoder.chunk_frames)")
    add("--endpoint_seconds", type=float, default=ENDPOINT_SECONDS,
        help="--stream: silence after words that ends a segment with a final line")
    args = parser.parse_args(argv)
    if bool(args.inputs) == bool(args.stream):
        parser.error("give audio inputs, or --stream SOURCE (- for standard input), not both")
    if args.stream and (args.output or args.output_dir or args.format not in (None, "txt", "jsonl")):
        parser.error("--stream prints to stdout, as txt or jsonl lines")
    if args.realtime and args.stream in (None, "-"):
        parser.error("--realtime replays a file: --stream FILE")
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


def build_decoder(args: argparse.Namespace, model: AcousticModel) -> Decoder:
    """The decoder of the model's objective from the flags (CTC's for a model without one: asr.models.ctc_decoding.
    make_decoder, whose defaults --lm_weight and --word_score keep; a transducer's refuses an LM)."""
    options = {k: getattr(args, k) for k in ("lm_weight", "word_score") if getattr(args, k) is not None}
    objective = getattr(model, "objective", None) or CTC()
    return objective.decoder(model.tokenizer, args.beam_size, args.lm, **options)


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


def stream_all(args: argparse.Namespace) -> int:
    """``--stream``: one stream's partial and final lines on stdout, then its audio and real-time factor on stderr."""
    model = load_model(args.checkpoint, args.device)
    transcriber = Transcriber(model, args.device, decoder=build_decoder(args, model),
                              min_confidence=args.min_confidence)
    session = transcriber.open_stream(args.stream_chunk, args.endpoint_seconds)
    torch.set_num_threads(1)  # a stream's steps are small: more threads only wait for each other (asr.serve's too)
    if args.stream == "-":
        pieces = pcm_pieces(sys.stdin.buffer, "standard input", transcriber.sample_rate)
    else:
        pieces = file_pieces(args.stream, transcriber.sample_rate)
        pieces = paced(pieces, transcriber.sample_rate) if args.realtime else pieces
    show, start, interrupted = Printer(args.format, sys.stdout), time.perf_counter(), False
    try:
        for piece in pieces:
            for update in session.feed(piece):
                show(update)
    except KeyboardInterrupt:  # Ctrl-C ends the stream where it is: its last segment still gets its final line
        interrupted = True
    for update in session.finish():
        show(update)
    elapsed = time.perf_counter() - start
    print(f"{session.seconds:.1f} s of audio in {elapsed:.2f} s: real-time factor "
          f"{elapsed / max(session.seconds, 1e-9):.4f}; {show.finals} final lines", file=sys.stderr)
    if interrupted:
        print("interrupted: the stream ended with the audio read so far (its final lines are above)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def transcribe_all(args: argparse.Namespace) -> int:
    """The run of ``main`` after parsing; returns the exit code (EXIT_CODES)."""
    model = load_model(args.checkpoint, args.device)
    transcriber = Transcriber(model, args.device, args.max_batch_seconds, build_decoder(args, model),
                              args.chunk_seconds, args.overlap_seconds, args.min_confidence, args.second_pass)
    found = collect(args.inputs)
    sink = open_sink(args.output, args.output_dir, args.format,
                     [name for u, name in found if isinstance(u, mf.Utterance)])
    todo = [(u, name) for u, name in found if isinstance(u, mf.Problem)
            or not sink.is_done(str(u.audio_filepath), u.offset if u.has_offset else None, name)]
    out = sys.stderr if to_stdout(args.output, args.output_dir) else sys.stdout  # stdout stays transcripts only
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
        streamed = transcriber.checked_results(checked, lambda seconds: bar.update(min(seconds, bar.total - bar.n)))
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
        return stream_all(args) if args.stream else transcribe_all(args)
    except (OSError, ValueError) as err:  # the checkpoint, an option or the output cannot be used
        print(f"python -m asr.transcribe: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # a stream catches its own (stream_all): a second Ctrl-C while it finishes lands here
        print("interrupted" if args.stream else "interrupted: run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
