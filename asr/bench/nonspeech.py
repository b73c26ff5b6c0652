"""How many words a model puts on audio with no speech in it.

    python -m asr.bench.nonspeech --checkpoint runs/default/version_0/checkpoints/last.ckpt

writes ``--per_kind`` clips (1-30 s) of every kind of asr.data.nonspeech at 8 and 16 kHz as 16-bit WAV, as a
recorder would, transcribes them and prints, per kind, per rate and in all, the clips with any word and
the words per minute of non-speech. The target (issue 38): no word on 95% of clips, at most 0.5 words a
minute. The clips' seed is not the training's: no clip here was trained on.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import soundfile
import torch

from asr.data.nonspeech import KINDS, clip, uniform
from asr.inference.focus import SECOND_PASS
from asr.inference.transcriber import Transcriber


def write_clips(folder: Path, per_kind: int, rates: tuple[int, ...], seed: int,
                seconds: tuple[float, float] = (1.0, 30.0)) -> list[tuple[Path, str, int, float]]:
    """``per_kind`` clips of each kind at each rate, log-uniform in length: [(path, kind, rate, seconds)]."""
    generator, made = torch.Generator().manual_seed(seed), []
    for rate in rates:
        for kind in KINDS:
            for i in range(per_kind):
                length = round(math.exp(uniform(generator, math.log(seconds[0]), math.log(seconds[1]))), 2)
                path = folder / f"{rate}" / f"{kind}-{i:02d}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                soundfile.write(path, clip(kind, length, rate, generator).clamp(-1, 1).numpy(), rate, subtype="PCM_16")
                made.append((path, kind, rate, length))
    return made


def words_on(texts: list[str], clips: list[tuple[Path, str, int, float]]) -> dict[str, dict]:
    """Per kind, per rate ("8000 Hz") and in all ("all"): clips, clips with words, words, minutes, words per
    minute, and the first two transcripts with words."""
    tally: dict[str, dict] = defaultdict(lambda: {"clips": 0, "with_words": 0, "words": 0, "minutes": 0.0, "seen": []})
    for (path, kind, rate, seconds), text in zip(clips, texts, strict=True):
        for key in (kind, f"{rate} Hz", "all"):
            row = tally[key]
            row["clips"] += 1
            row["with_words"] += bool(text.split())
            row["words"] += len(text.split())
            row["minutes"] += seconds / 60
            if text and len(row["seen"]) < 2:
                row["seen"].append(f"{rate}/{path.name}: {text[:50]}")
    for row in tally.values():
        row["words_per_minute"] = row["words"] / row["minutes"]
    return dict(tally)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="an asr.fit checkpoint or an asr.export model")
    parser.add_argument("--per_kind", type=int, default=8, help="clips of each kind at each rate")
    parser.add_argument("--rates", type=int, nargs="+", default=[8000, 16000])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--min_confidence", type=float, default=0.0, help="as asr.transcribe's")
    parser.add_argument("--second_pass", type=float, default=SECOND_PASS, help="as asr.transcribe's (0: one pass)")
    args = parser.parse_args(argv)
    transcriber = Transcriber.from_checkpoint(args.checkpoint, min_confidence=args.min_confidence,
                                              second_pass=args.second_pass)
    with tempfile.TemporaryDirectory() as folder:
        clips = write_clips(Path(folder), args.per_kind, tuple(args.rates), args.seed)
        tally = words_on(transcriber.transcribe([path for path, *_ in clips]), clips)
    print(f"{'kind':<10} {'clips':>5} {'with words':>10} {'words/min':>9}  e.g.")
    for kind in (*KINDS, *(f"{rate} Hz" for rate in args.rates), "all"):
        row = tally[kind]
        print(f"{kind:<10} {row['clips']:>5} {row['with_words']:>10} {row['words_per_minute']:>9.2f}  {' | '.join(row['seen'])}")
    return 0


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
