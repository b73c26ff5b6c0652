"""How far a model's word times fall from the words: utterances whose every word's time is known.

    python -m scripts.corpus.word_times --checkpoint runs/default/version_0/checkpoints/last.ckpt
    python -m scripts.corpus.word_times --checkpoint CKPT --seed 11 --gap 0.0 0.15 --snr 15
    python -m scripts.corpus.word_times --checkpoint CKPT --telephone     # 8 kHz, 300-3400 Hz, mu-law

Each utterance is 3-6 words of the bundled corpus spoken one at a time (flite and espeak-ng
voices, scripts/corpus/synthesizers.py), each cut to its sound (samples within 40 dB of its peak) and
joined by pauses drawn from ``--gap`` after a lead silence of 0.1-0.5 s; pink noise is added
``--snr`` dB below the speech. So every word's start and end are known. The model transcribes
them (asr.transcribe.Transcriber); the words it got right, matched in order (difflib), are
scored: the error of start and of end in seconds, as the median (signed: negative is early)
and the mean and 90th percentile of its size. Needs: apt-get install flite espeak-ng sox.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import torch

import scripts.corpus.synthesizers as synthesizers

from asr.data.augment import pink_noise  # noqa: E402
from asr.inference.transcriber import Transcriber  # noqa: E402

WORDS = ("one two three four five six seven eight nine zero oh call dial enter number go stop yes no help").split()
VOICES = [("flite", v) for v in ("kal", "slt", "rms", "awb")] + [
    ("espeak-ng", v) for v in ("en-us+m3", "en+f2", "en-gb+m1", "en-us+f4")]
RATE = 16000
SEED, GAP, SNR = 21, (0.02, 0.3), 25.0  # the flags' defaults: the set docs/benchmarks.md reports


@functools.cache
def spoken(synth: str, voice: str, word: str) -> np.ndarray:
    """``word`` at RATE, float32, cut to its sound and peaking at 0.5 (synthesised once)."""
    x = synthesizers.speak(synth, voice, word, 175, None if synth == "flite" else 50, 20, RATE, word) / 32768.0
    loud = np.nonzero(np.abs(x) > np.abs(x).max() * 10 ** (-40 / 20))[0]
    x = x[loud[0]: loud[-1] + 1]
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def utterances(count: int, seed: int, gap: tuple[float, float], snr: float):
    """(samples at RATE, [(word, start, end)]) of ``count`` utterances."""
    rng = random.Random(seed)
    for i in range(count):
        synth, voice = VOICES[i % len(VOICES)]
        t, pieces, times = rng.uniform(0.1, 0.5), [], []
        pieces.append(np.zeros(round(t * RATE), np.float32))
        for word in (rng.choice(WORDS) for _ in range(rng.randint(3, 6))):
            x = spoken(synth, voice, word)
            times.append((word, t, t + len(x) / RATE))
            pause = np.zeros(round(rng.uniform(*gap) * RATE), np.float32)
            pieces += [x, pause]
            t += (len(x) + len(pause)) / RATE
        speech = np.concatenate(pieces)
        noise = pink_noise(len(speech), torch.Generator().manual_seed(seed * 1000 + i)).numpy()
        power = np.mean(np.concatenate([s for s in pieces if s.any()]) ** 2)
        speech += noise * np.sqrt(power / 10 ** (snr / 10) / np.mean(noise ** 2))
        yield speech.astype(np.float32), times


def errors(words, times) -> tuple[list[float], list[float]]:
    """Start and end errors (s) of the transcribed words that match the spoken ones in order."""
    match = difflib.SequenceMatcher(a=[w.word for w in words], b=[w for w, _, _ in times], autojunk=False)
    starts, ends = [], []
    for a, b, size in match.get_matching_blocks():
        for w, (_, start, end) in zip(words[a: a + size], times[b: b + size]):
            starts.append(w.start - start)
            ends.append(w.end - end)
    return starts, ends


def summary(values: list[float]) -> str:
    if not values:
        return "no word recognised"
    size = sorted(abs(v) for v in values)
    return (f"median {statistics.median(values):+.3f} s, mean |error| {statistics.mean(size):.3f} s, "
            f"90th percentile {size[int(0.9 * len(size))]:.3f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a .ckpt of asr.fit (or asr.export's model)")
    parser.add_argument("--count", type=int, default=64, help="utterances")
    parser.add_argument("--seed", type=int, default=SEED, help="draws words, voices, pauses and noise")
    parser.add_argument("--gap", type=float, nargs=2, default=GAP, help="pause between words, s (range)")
    parser.add_argument("--snr", type=float, default=SNR, help="dB of speech over the pink noise")
    parser.add_argument("--telephone", action="store_true", help="send the audio through the 8 kHz channel")
    args = parser.parse_args(argv)
    if missing := synthesizers.missing_tools(("flite", "espeak-ng")):
        sys.exit(f"needs: apt-get install {' '.join(missing)}")
    transcriber = Transcriber.from_checkpoint(args.checkpoint)
    starts, ends, wrong = [], [], 0
    with tempfile.TemporaryDirectory() as folder:
        for i, (speech, times) in enumerate(utterances(args.count, args.seed, tuple(args.gap), args.snr)):
            path, rate = Path(folder) / f"{i:03d}.wav", RATE
            if args.telephone:
                speech = synthesizers.telephone((speech * 32767).astype(np.int16), RATE, path.name) / 32768.0
                rate = synthesizers.TELEPHONE_RATE
            soundfile.write(path, speech, rate)
            result = transcriber.transcribe_results([path])[0]
            s, e = errors(result.words, times)
            starts, ends, wrong = starts + s, ends + e, wrong + len(times) - len(s)
    print(f"{len(starts)} words matched, {wrong} not (misrecognised) of {len(starts) + wrong}")
    print(f"start: {summary(starts)}")
    print(f"end:   {summary(ends)}")


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
