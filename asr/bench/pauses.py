"""How well a model keeps the words of speech that non-speech surrounds.

    python -m asr.bench.pauses --checkpoint runs/default/version_0/checkpoints/last.ckpt --manifest data/heldout/16k.jsonl

Real recordings seldom start at the first word: a call opens on a ring tone or a hold, a chunk of a long file
starts in a pause. For each of the manifest's first ``--utterances`` utterances this makes copies with
``--seconds`` of non-speech of each of ``--kinds`` (asr.data.nonspeech, from a seed no training draws) before
and after the speech, transcribes them and prints the WER of each kind and length, with the words deleted and
inserted, next to the speech alone (issue 38: speech with long pauses keeps its words). Every copy is a 16-bit
WAV at the utterance's own rate. ``--unit cer`` scores characters (a character model on an hour of data writes
few whole words right).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import torch

from asr.data.manifest import ManifestError, Utterance
from asr.data.nonspeech import KINDS, clip
from asr.data.sources import ManifestSource
from asr.inference.focus import SECOND_PASS
from asr.inference.transcriber import Transcriber
from asr.scoring import score

ALONE = "alone"  # the row of the speech as the manifest gives it


def framed(speech: np.ndarray, rate: int, kind: str, seconds: float, generator: torch.Generator) -> np.ndarray:
    """``speech`` with ``seconds`` of non-speech of ``kind`` (one level, continuous) before and after it."""
    pad = round(seconds * rate)
    around = clip(kind, 0, rate, generator, length=2 * pad).numpy()
    return np.concatenate([around[:pad], speech, around[pad:]]).clip(-1, 1)


def write_copies(folder: Path, source: ManifestSource, utterances: list[Utterance], kinds: list[str],
                 seconds: list[float], seed: int) -> dict[tuple[str, float], list[Path]]:
    """Per (kind, seconds), and (ALONE, 0.0): one WAV a utterance of ``source``, in the manifest's order. Each
    copy's non-speech is drawn from a seed of its own (``copy_seed``), so a kind's copies are the same whichever
    other kinds, lengths or utterances are asked for."""
    copies = {}
    for n, utt in enumerate(utterances):
        speech, rate = source.read(utt)
        for kind, length in [(ALONE, 0.0), *((k, s) for k in kinds for s in seconds)]:
            path = folder / f"{kind}-{length:g}" / f"{n:04d}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == ALONE:
                audio = speech
            else:
                generator = torch.Generator().manual_seed(copy_seed(seed, kind, n, length))
                audio = framed(speech, rate, kind, length, generator)
            soundfile.write(path, audio, rate, subtype="PCM_16")
            copies.setdefault((kind, length), []).append(path)
    return copies


def copy_seed(seed: int, kind: str, utterance: int, seconds: float) -> int:
    """The seed of one copy's non-speech: a function of the bench's seed and of the copy alone."""
    return ((seed * len(KINDS) + KINDS.index(kind)) * 1_000_000 + utterance) * 1_000_000 + round(seconds * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="an asr.fit checkpoint or an asr.export model")
    parser.add_argument("--manifest", required=True, help="a manifest with transcripts (JSON lines)")
    parser.add_argument("--utterances", type=int, default=24, help="the manifest's first N")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, metavar="KIND",
                        help=f"of asr.data.nonspeech: {', '.join(KINDS)} (default: all)")
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0],
                        help="non-speech before and after the speech, each side")
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("--unit", choices=("wer", "cer"), default="wer",
                        help="word or character error rate (a character model on little data: cer)")
    parser.add_argument("--second_pass", type=float, default=SECOND_PASS, help="as asr.transcribe's (0: one pass)")
    args = parser.parse_args(argv)
    source = ManifestSource(args.manifest, "--manifest")
    try:
        utterances = source.parse()[0][:args.utterances]
    except ManifestError as err:
        parser.error(str(err))
    if not utterances:
        parser.error(f"--manifest {args.manifest}: no usable line")
    references = [u.text for u in utterances]
    transcriber = Transcriber.from_checkpoint(args.checkpoint, second_pass=args.second_pass)
    with tempfile.TemporaryDirectory() as folder:
        copies = write_copies(Path(folder), source, utterances, args.kinds, args.seconds, args.seed)
        scores = {key: score(references, transcriber.transcribe(paths, on_error="stop")) for key, paths in copies.items()}
    unit = "words" if args.unit == "wer" else "characters"
    print(f"{args.unit.upper()} (deleted {unit}, inserted {unit}) of {len(utterances)} utterances of {args.manifest}, "
          f"alone: {cell(scores[ALONE, 0.0], args.unit)}; framed by non-speech of each kind, seconds before and after:")
    print(f"| kind | {' | '.join(f'{s:g} s' for s in args.seconds)} |\n|---|{'---|' * len(args.seconds)}")
    for kind in args.kinds:
        print(f"| {kind} | {' | '.join(cell(scores[kind, s], args.unit) for s in args.seconds)} |")
    return 0


def cell(scores: dict, unit: str = "wer") -> str:
    """asr.scoring.score's WER (or CER), with the words (characters) deleted and inserted: "0.1250 (3 D, 1 I)"."""
    edits = scores["words" if unit == "wer" else "chars"]
    return f"{scores[unit]:.4f} ({edits['deletions']} D, {edits['insertions']} I)"


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
