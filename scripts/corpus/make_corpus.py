"""Generate a synthetic speech corpus with espeak-ng, flite and festival (manifests + FLAC audio).

Usage:

    # the bundled small-vocabulary corpus; the defaults reproduce data/mini exactly
    # (--overwrite replaces an existing copy; --workers N changes nothing but speed)
    python -m scripts.corpus.make_corpus mini --out data/mini --overwrite

    # the same domain, other sizes or another draw
    python -m scripts.corpus.make_corpus mini --out /tmp/mini --seed 1 --train 2000 --dev 150 --test 200

    # free text: N sentences drawn from a file (one per line), 8 or 16 kHz
    python -m scripts.corpus.make_corpus text --sentences sentences.txt --count 20000 \\
        --sample-rate 8000 --out /tmp/tts8k --seed 0 --dev-fraction 0.05 --test-fraction 0.05

Output layout (the manifest format of DESIGN.md, paths relative to the manifest):

    OUT/train.jsonl, OUT/dev.jsonl, OUT/test.jsonl, OUT/README.md
    OUT/audio/<split>/<id>.flac           mono 16-bit FLAC at the chosen rate
    {"audio_filepath": "audio/train/000123.flac", "duration": 2.41,
     "text": "call five two nine", "synth": "espeak-ng", "speaker": "en-gb+m4", "rate": 162,
     "pitch": 41, "amplitude": 18}

Every random choice (sentence, synthesiser, accent, voice variant, speaking rate, pitch,
level, silence margins) is drawn up front from --seed, so two runs produce
byte-identical files. The three splits never share a transcript; dev and test also use
voice variants of their own that train never hears, and scripts/corpus/make_heldout.py makes a
set of voices (festival's English voices, flite's and espeak-ng's others) that none of these splits hears.

Needs: numpy, soundfile, and the binaries (apt-get install espeak-ng flite sox); the mini corpus
also festival and its voices of other languages (scripts/corpus/accents.py names their packages).
"""
import argparse
import collections
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

import scripts.corpus.accents as accents
import scripts.corpus.sentences as free_text
import scripts.corpus.synthesizers as tts
SPLITS = ("train", "dev", "test")
# espeak-ng's own English accents (mbrola voices are a separate install; not used).
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd", "en-029", "en-us-nyc")
# Every voice variant espeak-ng 1.51 ships ("" = the accent's default voice); klatt* switch
# the synthesiser itself. Each is heard by one group only: train, dev, test or the held-out set.
VARIANTS = (
    "", "adam", "Alex", "Alicia", "Andrea", "Andy", "Annie", "antonio", "aunty", "belinda",
    "benjamin", "boris", "caleb", "david", "Demonic", "Denis", "Diogo", "ed", "edward", "edward2",
    "Gene", "Gene2", "gustave", "announcer", "Henrique", "Hugo", "iven", "iven2", "iven3", "iven4",
    "Jacky", "john", "kaukovalta", "Lee", "linda", "marcelo", "Marco", "Mario", "max", "Michael",
    "michel", "miguel", "Mike", "Mr", "Nguyen", "pablo", "paul", "pedro", "quincy", "RicishayMax",
    "RicishayMax2", "RicishayMax3", "rob", "robert", "robosoft", "robosoft2", "robosoft3",
    "robosoft4", "robosoft5", "robosoft6", "robosoft7", "robosoft8", "steph", "steph2", "steph3",
    "Storm", "Tweaky", "UniRobot", "zac", "anika", "anikaRobot", "AnxiousAndy", "fast", "whisper",
    "whisperf", "grandpa", "grandma", "croak", "norbert", "sandro", "shelby", "travis", "victor",
    "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6",
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5")
DEV_VARIANTS = ("m7", "f4", "klatt6", "belinda", "david", "Hugo")          # dev only
TEST_VARIANTS = ("m8", "f5", "klatt5", "linda", "benjamin", "Jacky")      # test only
HELDOUT_VARIANTS = ("m3", "f3", "klatt4", "Annie", "Michael", "grandma",  # scripts/corpus/make_heldout.py only
                    "victor", "Alicia", "norbert", "kaukovalta")
SEEN_VARIANTS = tuple(v for v in VARIANTS if v not in DEV_VARIANTS + TEST_VARIANTS + HELDOUT_VARIANTS)
UNSEEN_SHARE = 0.5   # share of dev and test utterances spoken by their own variants
# flite's statistical voices: other synthesisers than espeak's formants, heard in every split.
# Its kal, kal16 and slt speakers are the held-out set's (festival has them too): never here.
FLITE_VOICES = ("awb", "rms")
FLITE_SHARE = 0.30  # 0.15, then 0.35 until 2026-11-23 (night): docs/benchmarks.md, "accented voices in the bundled corpus"
# festival's voices of other languages, reading the English words in their own spelling (accented
# speakers, from recordings of real people): the mini corpus only, heard in every split. festival's
# English voices are the held-out set's.
FESTIVAL_VOICES = tuple(accents.VOICES)
FESTIVAL_SHARE = 0.25
# awb's intonation follows flite's int_f0_target_mean (rms's does not): its mean F0 in Hz is drawn
# from this range, so awb speaks at other pitches with its own vocal tract (formants), which
# asr.augment's pitch shift, that moves both, cannot make.
FLITE_F0_VOICES = ("awb",)
FLITE_F0 = (80, 220)
RATES = (140, 190)       # words per minute
PITCHES = (30, 70)       # espeak 0-99 scale, relative to the variant's own pitch
# espeak's -a 100 hits full scale; 10-30 puts peaks near -30..-12 dBFS (median -18),
# a usual recording level, and quieter audio makes smaller FLAC (mini has a 10 MB cap).
AMPLITUDES = (10, 30)
MARGINS = (0.10, 0.20)   # seconds of silence kept before and after the speech

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "oh")
DIRECTIONS = ("left", "right", "up", "down", "back")
SINGLE = ("erase", "repeat", "stop", "start", "yes", "no", "help", "rubout", "cancel",
          "enter", "back", "number", "call", "dial")
COMMANDS = tuple(sorted(set(SINGLE + DIRECTIONS + ("go",))))
MINI_DEFAULTS = {"train": 620, "dev": 80, "test": 100}
# Share of distinct sentences each split may own: a partition, so splits stay disjoint.
MINI_PARTITION = {"train": 0.7, "dev": 0.12, "test": 0.18}


# One planned utterance: text is the transcript, synth the synthesiser (scripts/corpus/synthesizers.py),
# speaker its voice: an espeak-ng accent+variant such as "en-gb+m4", or a flite/festival voice.
Utterance = collections.namedtuple("Utterance", "split uid text synth speaker rate "
                                   "pitch amplitude lead trail sample_rate")


def die(message):
    sys.exit(f"make_corpus.py: error: {message}")


def check_tools(synths=("espeak-ng", "flite"), festival_voices=()):
    """Fail early, with the fix, if a binary or a voice is missing."""
    missing = tts.missing_tools(synths, festival_voices)
    if missing:
        die(f"missing synthesisers or voices: install them with `apt-get install {' '.join(missing)}`.")
    listing = subprocess.run(["espeak-ng", "--voices"], capture_output=True, text=True).stdout
    languages = {line.split()[1] for line in listing.splitlines()[1:] if line.split()}
    variants = set(re.findall(r"!v/(\S+)", subprocess.run(
        ["espeak-ng", "--voices=variant"], capture_output=True, text=True).stdout))
    # espeak-ng silently falls back to the default voice for an unknown variant.
    missing = [a for a in ACCENTS if a not in languages]
    missing += [f"+{v}" for v in VARIANTS if v and v not in variants]
    if missing:
        die(f"espeak-ng lacks the voices {', '.join(missing)}: install the full "
            f"`espeak-ng-data` package (apt-get install espeak-ng).")


# ---------------------------------------------------------------- mini domain

def mini_sentence(rng):
    """One sentence from the command/digit templates, as a word list."""
    digits = lambda lo, hi: [rng.choice(DIGITS) for _ in range(rng.randint(lo, hi))]
    templates = [
        (14, lambda: [rng.choice(("call", "dial"))] + digits(3, 7)),
        (8, lambda: ["enter"] + digits(1, 7)),
        (5, lambda: ["enter", "number"] + digits(1, 6)),
        (3, lambda: ["number"] + digits(1, 7)),
        (4, lambda: ["repeat"] + rng.choice((["number"], digits(1, 5)))),
        (5, lambda: [rng.choice(("erase", "rubout"))] + digits(1, 3)),
        (6, lambda: [rng.choice(SINGLE)]),
        (5, lambda: ["go", rng.choice(DIRECTIONS)] + rng.choice(([], digits(1, 1)))),
        (4, lambda: [rng.choice(DIRECTIONS[:4])] + digits(1, 2)),
        (5, lambda: [rng.choice(("yes", "no"))] + rng.choice(
            ([rng.choice(SINGLE)], ["call"] + digits(3, 5), ["go", rng.choice(DIRECTIONS)]))),
        (3, lambda: [rng.choice(("stop", "start", "cancel", "help"))]
         + rng.choice((["call"], ["number"], [rng.choice(("yes", "no"))]))),
        # Command words are few beside the digits: phrases of them keep each one frequent.
        (12, lambda: rng.sample(COMMANDS, rng.randint(2, 4)) + rng.choice(([], digits(1, 2)))),
    ]
    weights = [w for w, _ in templates]
    words = rng.choices([t for _, t in templates], weights)[0]()
    return words[:8]


def owner_split(text, seed, partition):
    """The one split allowed to use this transcript (a seeded hash partition)."""
    digest = hashlib.sha256(f"{seed}\n{text}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2 ** 64
    bounds = itertools.accumulate(partition[s] for s in SPLITS)
    return next((s for s, b in zip(SPLITS, bounds) if u < b), SPLITS[-1])


def distinct_sentences(rng, seed, split, count):
    """``count`` different sentences that the partition gives to ``split`` (no test set of 12 "help"s)."""
    chosen = {}
    for _ in range(1000 * max(count, 1)):
        if len(chosen) == count:
            return list(chosen)
        text = " ".join(mini_sentence(rng))
        if owner_split(text, seed, MINI_PARTITION) == split:
            chosen.setdefault(text, None)
    die(f"could not draw {count} distinct {split} sentences; ask for fewer.")


def draw_mini(rng, counts, seed):
    """Distinct sentences per split, all from the same templates; no sentence is in two splits.

    Every split draws from one distribution, so train holds sentences as long as test's
    (a model that never saw 7-digit numbers in training stops early on them). Every word
    of dev and test must occur in train, else the draw is refused.
    """
    drawn = {split: distinct_sentences(rng, seed, split, counts[split]) for split in SPLITS}
    heard = {word for text in drawn["train"] for word in text.split()}
    unheard = sorted({w for split in ("dev", "test") for text in drawn[split] for w in text.split()} - heard)
    if unheard:
        die(f"dev/test use words train never has ({', '.join(unheard)}): raise --train or change --seed.")
    return drawn


# ---------------------------------------------------------------- synthesis

def espeak_voice(rng, variants):
    """An espeak-ng accent+variant such as "en-gb+m4" (the accent alone for variant "")."""
    variant, accent = rng.choice(variants), rng.choice(ACCENTS)
    return accent + (f"+{variant}" if variant else "")


def pick_voice(rng, split, festival_share):
    """(synth, speaker) of one utterance of ``split``: dev and test also use their own variants."""
    u = rng.random()
    if u < FLITE_SHARE:
        return "flite", rng.choice(FLITE_VOICES)
    if u < FLITE_SHARE + festival_share:
        return "festival", rng.choice(FESTIVAL_VOICES)
    own = {"dev": DEV_VARIANTS, "test": TEST_VARIANTS}.get(split)
    return "espeak-ng", espeak_voice(rng, own if own and rng.random() < UNSEEN_SHARE else SEEN_VARIANTS)


def utterance(rng, split, index, text, synth, speaker, sample_rate):
    """Draw the speaking parameters (rate, pitch, level, margins) of one utterance."""
    rate, pitch, amplitude = rng.randint(*RATES), rng.randint(*PITCHES), rng.randint(*AMPLITUDES)
    if synth == "flite" and speaker in FLITE_F0_VOICES:  # the same draw, mapped onto FLITE_F0 in Hz
        pitch = round(FLITE_F0[0] + (pitch - PITCHES[0]) * (FLITE_F0[1] - FLITE_F0[0]) / (PITCHES[1] - PITCHES[0]))
    elif synth != "espeak-ng":
        pitch = None
    return Utterance(split, f"{index:06d}", text, synth, speaker,
                     None if synth == "festival" else rate, pitch,
                     amplitude, round(rng.uniform(*MARGINS), 3), round(rng.uniform(*MARGINS), 3),
                     sample_rate)


def plan(rng, drawn, sample_rate, festival_share):
    """Fix every utterance's voice and parameters before any audio is made."""
    return [utterance(rng, split, index, text, *pick_voice(rng, split, festival_share), sample_rate)
            for split in SPLITS for index, text in enumerate(drawn[split])]


def synthesise(u):
    """The synthesiser -> sox resample without dither -> trimmed int16 samples."""
    what = f"{u.split}/{u.uid} ({u.text!r}, {u.synth} {u.speaker})"
    samples = tts.speak(u.synth, u.speaker, u.text, u.rate, u.pitch, u.amplitude, u.sample_rate, what)
    return trim(samples, u, what)


def trim(x, u, what):
    """Keep u.lead / u.trail seconds around the speech, padding with silence if short."""
    level = np.abs(x.astype(np.int32))
    # 40 dB below the peak still keeps weak edge consonants (the 'f' of 'five').
    loud = np.flatnonzero(level > max(level.max() // 100, 1))
    if loud.size == 0:
        raise tts.SynthError(f"silence for {what}.")
    lead, trail = round(u.lead * u.sample_rate), round(u.trail * u.sample_rate)
    start, end = loud[0] - lead, loud[-1] + 1 + trail
    head = np.zeros(max(0, -start), np.int16)
    tail = np.zeros(max(0, end - len(x)), np.int16)
    return np.concatenate([head, x[max(0, start):min(end, len(x))], tail])


def write_flac(out, split, u, samples, sample_rate):
    """Write audio/<split>/<uid>.flac under ``out``; return its manifest record."""
    relative = f"audio/{split}/{u.uid}.flac"
    sf.write(os.path.join(out, relative), samples, sample_rate, format="FLAC",
             subtype="PCM_16", compression_level=1.0)
    return {"audio_filepath": relative, "duration": round(len(samples) / sample_rate, 3),
            "text": u.text, "synth": u.synth, "speaker": u.speaker, "rate": u.rate,
            "pitch": u.pitch, "amplitude": u.amplitude}


def make_one(job):
    """Worker: synthesise one utterance, write its FLAC, return [(split, manifest record)]."""
    u, out = job
    return [(u.split, write_flac(out, u.split, u, synthesise(u), u.sample_rate))]


def prepare_out(out, overwrite, splits=SPLITS):
    """Create OUT; never mix a new corpus with files left from an older one."""
    old = [out / f"{s}.jsonl" for s in splits] + [out / "audio" / s for s in splits]
    existing = [p for p in old if p.exists()]
    if existing and not overwrite:
        die(f"--out {out} already holds a corpus ({existing[0]}); pass --overwrite to replace it.")
    for path in existing:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for split in splits:
        (out / "audio" / split).mkdir(parents=True, exist_ok=True)


def write_corpus(utterances, out, workers, splits=SPLITS, worker=make_one):
    """Run ``worker`` on every utterance in a pool; write and return the manifests of ``splits``."""
    records = {split: [] for split in splits}
    jobs = [(u, str(out)) for u in utterances]
    with multiprocessing.Pool(max(1, workers)) as pool:
        # imap keeps the planned order, so manifests do not depend on timing.
        results = list(pool.imap(worker, jobs, chunksize=8))
    for split, record in itertools.chain.from_iterable(results):
        records[split].append(record)
    for split in splits:
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[split])
    return records


def corpus_bytes(out):
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def espeak_version():
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"\d+\.\d+[\w.-]*", out)
    return match.group() if match else "(unknown version)"


def split_table(records):
    """Markdown rows: utterances, minutes and hours of each split, and its voices by synthesiser."""
    rows = ["| split | utterances | minutes | hours | utterances by synthesiser |", "|---|---|---|---|---|"]
    for split, rows_of in records.items():
        seconds = sum(r["duration"] for r in rows_of)
        synths = collections.Counter(r["synth"] for r in rows_of)
        rows.append(f"| {split} | {len(rows_of)} | {seconds / 60:.1f} | {seconds / 3600:.3f} | "
                    + ", ".join(f"{k} {n}" for k, n in sorted(synths.items())) + " |")
    return "\n".join(rows)


def variant_list(variants):
    return ", ".join("+" + v if v else "(none)" for v in variants)


def write_readme(out, command, records, sample_rate, description):
    heard = {r["synth"] for rows in records.values() for r in rows}
    synths = [s for s in ("espeak-ng", "flite", "festival") if s in heard]
    tools = [f"espeak-ng {espeak_version()}" if s == "espeak-ng" else s for s in synths] + ["sox"]
    festival = sorted({r["speaker"] for rows in records.values() for r in rows if r["synth"] == "festival"})
    festival = (f", and festival's voices of other languages {', '.join(festival)} ({FESTIVAL_SHARE:.0%}), "
                f"which read the English words in their own spelling (scripts/accents.py)" if festival else "")
    text = f"""# Synthetic speech corpus

{description}

Made by `scripts/make_corpus.py` ({", ".join(tools)}); regenerate it
byte for byte with `{command}`

{split_table(records)}

Manifests `<split>.jsonl` (paths relative to this folder) also record each utterance's
`synth` ({" or ".join(synths)}), `speaker` (espeak-ng accent+variant, or the voice),
`rate` (wpm; null for festival, which speaks at each voice's own rate), `pitch` (espeak-ng's 0-99; flite {", ".join(FLITE_F0_VOICES)}'s mean F0 in Hz,
{FLITE_F0[0]}-{FLITE_F0[1]}; else null) and `amplitude` (espeak-ng's -a; flite and festival
audio is levelled to the same peak). Audio: mono 16-bit FLAC at {sample_rate} Hz in
`audio/<split>/`.

Voices: espeak-ng accents {", ".join(ACCENTS)}, each with a voice variant, and
flite's voices {", ".join(FLITE_VOICES)} ({FLITE_SHARE:.0%} of every split){festival}. Train hears the
variants {variant_list(SEEN_VARIANTS)}. Dev and test also use variants of their own (about
{UNSEEN_SHARE:.0%} of their espeak-ng utterances), which no other split hears: dev
{variant_list(DEV_VARIANTS)}; test {variant_list(TEST_VARIANTS)}. The variants
{variant_list(HELDOUT_VARIANTS)}, flite's kal, kal16 and slt and festival's English voices are kept for the held-out set
(scripts/make_heldout.py) and occur in no split here. No transcript occurs in two splits.
"""
    (out / "README.md").write_text(text, encoding="utf-8")


MINI_DESCRIPTION = """A small-vocabulary command domain in the spirit of TIDIGITS and AN4:
digits (zero..nine, oh) and {n} command words ("call five two nine", "go left",
"erase three"), in sentences of 1-8 words ({v} words in all). All splits draw from the same templates, and every
word of dev and test occurs in train. Spelled letters are left
out: espeak's letter names (the b/d/e/p/t/v "e-set") cannot be learned from the few
minutes of audio that fit. Sized to stay near 20 MB: 16 kHz FLAC of synthetic speech
costs about 25 kB per utterance."""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Generate a synthetic speech corpus (see the module docstring).")
    modes = parser.add_subparsers(dest="mode", required=True)
    mini = modes.add_parser("mini", help="the bundled small-vocabulary corpus")
    text = modes.add_parser("text", help="speak sentences drawn from a text file")
    for sub in (mini, text):
        sub.add_argument("--out", type=Path, required=True, help="output folder")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
        sub.add_argument("--overwrite", action="store_true",
                         help="replace the manifests and audio already in --out")
    for split, n in MINI_DEFAULTS.items():
        mini.add_argument(f"--{split}", type=int, default=n, help=f"utterances (default {n})")
    text.add_argument("--sentences", required=True, help="UTF-8 text file, one sentence a line")
    text.add_argument("--count", type=int, required=True, help="utterances in all splits")
    text.add_argument("--sample-rate", type=int, choices=(8000, 16000), default=16000)
    text.add_argument("--dev-fraction", type=float, default=0.05)
    text.add_argument("--test-fraction", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.mode == "text" and (args.count < 1 or min(args.dev_fraction, args.test_fraction) < 0
                                or args.dev_fraction + args.test_fraction >= 1):
        parser.error("need --count >= 1, and --dev-fraction, --test-fraction >= 0 summing below 1")
    if args.mode == "mini" and min(args.train, args.dev, args.test) < 0:
        parser.error("--train, --dev and --test must be >= 0")
    return args


def regenerate_command(args):
    """The command line that reproduces this corpus (--workers changes nothing)."""
    if args.mode == "text":
        flags = ["sentences", "count", "sample_rate", "dev_fraction", "test_fraction"]
    else:
        flags = [s for s in SPLITS if getattr(args, s) != MINI_DEFAULTS[s]]
    flags += ["out"] + (["seed"] if args.seed else [])
    options = [f"--{f.replace('_', '-')} {getattr(args, f)}" for f in flags]
    return " ".join(["python -m scripts.corpus.make_corpus", args.mode] + options + ["--overwrite"])


def main(argv=None):
    args = parse_args(argv)
    rng = random.Random(args.seed)
    if args.mode == "mini":
        counts = {s: getattr(args, s) for s in SPLITS}
        drawn, sample_rate = draw_mini(rng, counts, args.seed), 16000
        commands = len(set(SINGLE + DIRECTIONS + ("go",)))
        description = MINI_DESCRIPTION.format(n=commands, v=commands + len(DIGITS))
        check_tools(("espeak-ng", "flite", "festival"), FESTIVAL_VOICES)
        festival_share = FESTIVAL_SHARE
    else:
        try:
            lines = free_text.read_sentences(args.sentences)
            drawn = free_text.draw_text(rng, lines, args.count, args.dev_fraction, args.test_fraction)
        except ValueError as err:
            die(str(err))
        sample_rate = args.sample_rate
        description = f"{args.count} sentences drawn from `{args.sentences}`, spoken by espeak-ng and flite."
        check_tools()
        festival_share = 0.0  # festival's voices of other languages know the mini domain's words only
    prepare_out(args.out, args.overwrite)
    try:
        records = write_corpus(plan(rng, drawn, sample_rate, festival_share), args.out, args.workers)
    except tts.SynthError as err:
        die(str(err))
    write_readme(args.out, regenerate_command(args), records, sample_rate, description)
    for split in SPLITS:
        seconds = sum(r["duration"] for r in records[split])
        print(f"{split}: {len(records[split])} utterances, {seconds:.1f} s")
    print(f"{args.out}: {corpus_bytes(args.out) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
