"""Make the held-out other-voice set: the bundled corpus' domain, spoken by voices it never hears.

Usage:

    # the committed set; the defaults reproduce data/heldout exactly
    python scripts/make_heldout.py --out data/heldout --overwrite

    # judge a checkpoint on it (it reports WER, since the manifests hold the text)
    python -m asr.transcribe --checkpoint CKPT data/heldout/16k.jsonl
    python -m asr.transcribe --checkpoint CKPT data/heldout/8k.jsonl

Voices: festival's English voices (kal_diphone, ked_diphone, cmu_us_slt_arctic_hts; data/mini hears
only festival's voices of other languages), flite's kal16 and slt (flite speakers the corpus leaves
out), and the espeak-ng variants make_corpus.HELDOUT_VARIANTS. Transcripts come from the
templates of make_corpus.py, drawn only from the test share of its sentence partition, so no
training sentence is among them.

Output: OUT/16k.jsonl with OUT/audio/16k/<id>.flac (16 kHz), and OUT/8k.jsonl with
OUT/audio/8k/<id>.flac, the same utterances through a telephone channel (300-3400 Hz band,
8-bit mu-law, 8 kHz; stored as 16-bit FLAC). Same manifest fields as make_corpus.py.
Deterministic from --seed (the seed of the corpus whose training sentences it avoids).

Needs: apt-get install espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k
festvox-us-slt-hts sox
"""
import argparse
import os
import random
from pathlib import Path

import make_corpus as mc
import synthesizers as tts

SPLITS = ("16k", "8k")
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")
FLITE_VOICES = ("kal16", "slt")
# Shares of the set: festival, flite, the rest espeak-ng's held-out variants.
SHARES = {"festival": 0.45, "flite": 0.2}
DEFAULT_COUNT = 150


def pick_voice(rng):
    """(synth, speaker) of one held-out utterance."""
    u = rng.random()
    if u < SHARES["festival"]:
        return "festival", rng.choice(FESTIVAL_VOICES)
    if u < SHARES["festival"] + SHARES["flite"]:
        return "flite", rng.choice(FLITE_VOICES)
    return "espeak-ng", mc.espeak_voice(rng, mc.HELDOUT_VARIANTS)


def plan(seed, count):
    """``count`` distinct test-share sentences, each with its voice and speaking parameters."""
    rng = random.Random(f"heldout {seed}")  # another stream than the corpus' own draws
    texts = mc.distinct_sentences(rng, seed, "test", count)
    return [mc.utterance(rng, "16k", index, text, *pick_voice(rng), 16000)
            for index, text in enumerate(texts)]


def make_one(job):
    """Worker: one utterance at 16 kHz and its telephone copy -> [(split, record)] for both."""
    u, out = job
    wide = mc.synthesise(u)
    narrow = tts.telephone(wide, u.sample_rate, f"{u.uid} ({u.text!r})")
    return [("16k", mc.write_flac(out, "16k", u, wide, 16000)),
            ("8k", mc.write_flac(out, "8k", u, narrow, 8000))]


def write_readme(out, command, records):
    text = f"""# Held-out other-voice set

The bundled corpus' domain (digit strings and commands, the templates of
scripts/make_corpus.py) spoken by voices that no split of data/mini hears. **No tuning uses
this set**: not training, not choosing settings or checkpoints. It only judges a final model:

    python -m asr.transcribe --checkpoint CKPT data/heldout/16k.jsonl
    python -m asr.transcribe --checkpoint CKPT data/heldout/8k.jsonl

Made by `scripts/make_heldout.py` (festival, flite, espeak-ng {mc.espeak_version()}, sox);
regenerate it byte for byte with `{command}`

{mc.split_table(records)}

Voices: festival {", ".join(FESTIVAL_VOICES)} (its English voices: data/mini hears only
its voices of other languages; spoken at its own rate); flite {", ".join(FLITE_VOICES)} (speakers data/mini never uses); espeak-ng
variants {mc.variant_list(mc.HELDOUT_VARIANTS)} over its accents. Transcripts are drawn from
the test share of make_corpus.py's sentence partition, so none is a training sentence.

`16k.jsonl`: 16 kHz audio in `audio/16k/`. `8k.jsonl`: the same utterances through a
telephone channel (300-3400 Hz, 8-bit mu-law, 8 kHz) in `audio/8k/`, stored as 16-bit FLAC.
Manifest fields as in data/mini (`synth`, `speaker`, `rate`, `pitch`, `amplitude`).
"""
    (out / "README.md").write_text(text, encoding="utf-8")


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Make the held-out other-voice set (see the module docstring).")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the corpus to stay disjoint from")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help=f"utterances (default {DEFAULT_COUNT})")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--overwrite", action="store_true", help="replace the set already in --out")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    mc.check_tools(("espeak-ng", "flite", "festival"), FESTIVAL_VOICES)
    utterances = plan(args.seed, args.count)
    mc.prepare_out(args.out, args.overwrite, SPLITS)
    try:
        records = mc.write_corpus(utterances, args.out, args.workers, SPLITS, make_one)
    except tts.SynthError as err:
        mc.die(str(err))
    flags = ([f"--count {args.count}"] if args.count != DEFAULT_COUNT else []) + [f"--out {args.out}"]
    flags += [f"--seed {args.seed}"] if args.seed else []
    write_readme(args.out, " ".join(["python scripts/make_heldout.py"] + flags + ["--overwrite"]), records)
    for split in SPLITS:
        print(f"{split}: {len(records[split])} utterances, {sum(r['duration'] for r in records[split]):.1f} s")
    print(f"{args.out}: {mc.corpus_bytes(args.out) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
