"""Generate a synthetic speech corpus with espeak-ng (manifests + FLAC audio).

Usage:

    # the bundled small-vocabulary corpus; the defaults reproduce data/mini exactly
    # (--overwrite replaces an existing copy; --workers N changes nothing but speed)
    python scripts/make_corpus.py mini --out data/mini --overwrite

    # the same domain, other sizes or another draw
    python scripts/make_corpus.py mini --out /tmp/mini --seed 1 --train 2000 --dev 150 --test 200

    # free text: N sentences drawn from a file (one per line), 8 or 16 kHz
    python scripts/make_corpus.py text --sentences sentences.txt --count 20000 \\
        --sample-rate 8000 --out /tmp/tts8k --seed 0 --dev-fraction 0.05 --test-fraction 0.05

Output layout (the manifest format of DESIGN.md, paths relative to the manifest):

    OUT/train.jsonl, OUT/dev.jsonl, OUT/test.jsonl, OUT/README.md
    OUT/audio/<split>/<id>.flac           mono 16-bit FLAC at the chosen rate
    {"audio_filepath": "audio/train/000123.flac", "duration": 2.41,
     "text": "call five two nine", "speaker": "en-gb+m4", "rate": 162, "pitch": 41, "amplitude": 18}

Every random choice (sentence, accent, voice variant, speaking rate, pitch,
level, silence margins) is drawn up front from --seed, so two runs produce
byte-identical files. The three splits never share a transcript, and the test
split also uses voice variants that train and dev never hear.

Needs: numpy, soundfile, and the espeak-ng and sox binaries (apt-get install espeak-ng sox).
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
import unicodedata
from pathlib import Path

import numpy as np
import soundfile as sf

SPLITS = ("train", "dev", "test")
# espeak-ng's own English accents (mbrola voices are a separate install; not used).
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd", "en-029", "en-us-nyc")
# Voice variants ("" = the accent's default voice). klatt* switch the synthesiser itself.
SEEN_VARIANTS = ("", "m1", "m2", "m4", "m5", "m6", "m7", "f1", "f2", "f4", "f5",
                 "klatt", "klatt2", "croak")
HELD_OUT_VARIANTS = ("m3", "m8", "f3")  # test split only
HELD_OUT_SHARE = 0.5                    # share of test utterances that use them
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
MINI_DEFAULTS = {"train": 270, "dev": 60, "test": 100}
# Share of distinct sentences each split may own: a partition, so splits stay disjoint.
MINI_PARTITION = {"train": 0.7, "dev": 0.12, "test": 0.18}


# One planned utterance: text is the transcript (what espeak-ng says), speaker an
# espeak-ng voice such as "en-gb+m4".
Utterance = collections.namedtuple("Utterance", "split uid text speaker rate "
                                   "pitch amplitude lead trail sample_rate")


class CorpusError(Exception):
    """Raised in pool workers (sys.exit there would hang the pool); main() reports it."""


def die(message):
    sys.exit(f"make_corpus.py: error: {message}")


def check_tools():
    """Fail early, with the fix, if a binary or a voice is missing."""
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            die(f"{tool} is not on PATH: install it with `apt-get install {tool}`.")
    listing = subprocess.run(["espeak-ng", "--voices"], capture_output=True, text=True).stdout
    languages = {line.split()[1] for line in listing.splitlines()[1:] if line.split()}
    variants = set(re.findall(r"!v/(\S+)", subprocess.run(
        ["espeak-ng", "--voices=variant"], capture_output=True, text=True).stdout))
    # espeak-ng silently falls back to the default voice for an unknown variant.
    missing = [a for a in ACCENTS if a not in languages]
    missing += [f"+{v}" for v in SEEN_VARIANTS + HELD_OUT_VARIANTS if v and v not in variants]
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


# ---------------------------------------------------------------- free text

SILENT_PUNCTUATION = re.compile(r"[.,;:!?\"()\[\]{}\-\u2010-\u2015/\u2026\u00ab\u00bb\u201c\u201d]")


def normalise(line):
    """(text, None) or (None, reason): lowercase a-z, apostrophe, single spaces."""
    s = unicodedata.normalize("NFKD", line)
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = s.replace("\u2019", "'").replace("\u2018", "'")
    if re.search(r"\d", s):
        return None, "digits"   # their spoken form is ambiguous ("1984", "1st", "2.5")
    s = SILENT_PUNCTUATION.sub(" ", s)
    bad = re.search(r"[^a-z' \t\r\n]", s)
    if bad:
        return None, f"unsupported characters:{bad.group()}"
    words = [w.strip("'") for w in s.split()]
    text = " ".join(w for w in words if w)
    return (text, None) if text else (None, "empty")


def read_sentences(path):
    """Distinct normalised sentences of a file, reporting the unusable lines."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        die(f"--sentences {path}: cannot read it ({err}).")
    kept, dropped, chars = {}, {}, set()
    for number, line in enumerate(lines, 1):
        text, reason = normalise(line)
        if text is None:
            reason, _, char = reason.partition(":")
            dropped.setdefault(reason, []).append(number)
            chars.update(char)
        else:
            kept.setdefault(text, number)
    total = sum(len(v) for v in dropped.values())
    print(f"{path}: {len(lines)} lines; dropped {total} as unusable; "
          f"{len(lines) - total - len(kept)} duplicates merged; "
          f"{len(kept)} distinct sentences kept", file=sys.stderr)
    for reason, numbers in sorted(dropped.items()):
        shown = ", ".join(map(str, numbers[:20])) + (", ..." if len(numbers) > 20 else "")
        detail = f" ({' '.join(sorted(chars))})" if reason.startswith("unsupported") else ""
        print(f"  {reason}{detail}: {len(numbers)} lines: {shown}", file=sys.stderr)
    return list(kept)


def draw_text(rng, sentences, count, dev_fraction, test_fraction):
    """count distinct sentences, cut into test / dev / train (hence disjoint)."""
    if count > len(sentences):
        die(f"--count {count} exceeds the {len(sentences)} distinct usable sentences "
            f"in --sentences.")
    chosen = rng.sample(sentences, count)
    n_test, n_dev = round(count * test_fraction), round(count * dev_fraction)
    parts = {"test": chosen[:n_test], "dev": chosen[n_test:n_test + n_dev],
             "train": chosen[n_test + n_dev:]}
    return parts


# ---------------------------------------------------------------- synthesis

def plan(rng, drawn, sample_rate):
    """Fix every utterance's voice and parameters before any audio is made."""
    utterances = []
    for split in SPLITS:
        for index, text in enumerate(drawn[split]):
            held_out = split == "test" and rng.random() < HELD_OUT_SHARE
            variant = rng.choice(HELD_OUT_VARIANTS if held_out else SEEN_VARIANTS)
            accent = rng.choice(ACCENTS)
            utterances.append(Utterance(
                split, f"{index:06d}", text,
                accent + (f"+{variant}" if variant else ""),
                rng.randint(*RATES), rng.randint(*PITCHES), rng.randint(*AMPLITUDES),
                round(rng.uniform(*MARGINS), 3), round(rng.uniform(*MARGINS), 3),
                sample_rate))
    return utterances


def run(command, data, what):
    result = subprocess.run(command, input=data, capture_output=True)
    if result.returncode != 0 or not result.stdout:
        raise CorpusError(f"{command[0]} failed on {what}: "
                          f"{result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def synthesise(u):
    """espeak-ng (22050 Hz) -> sox resample without dither -> trimmed int16 samples."""
    what = f"{u.split}/{u.uid} ({u.text!r})"
    espeak = ["espeak-ng", "-v", u.speaker, "-s", str(u.rate), "-p", str(u.pitch),
              "-a", str(u.amplitude), "--stdout", u.text]
    wav = run(espeak, None, what)
    raw = run(["sox", "-D", "-t", "wav", "-", "-t", "raw", "-e", "signed-integer", "-b", "16",
               "-c", "1", "-r", str(u.sample_rate), "-"], wav, what)
    return trim(np.frombuffer(raw, dtype="<i2"), u, what)


def trim(x, u, what):
    """Keep u.lead / u.trail seconds around the speech, padding with silence if short."""
    level = np.abs(x.astype(np.int32))
    # 40 dB below the peak still keeps weak edge consonants (the 'f' of 'five').
    loud = np.flatnonzero(level > max(level.max() // 100, 1))
    if loud.size == 0:
        raise CorpusError(f"espeak-ng produced silence for {what}.")
    lead, trail = round(u.lead * u.sample_rate), round(u.trail * u.sample_rate)
    start, end = loud[0] - lead, loud[-1] + 1 + trail
    head = np.zeros(max(0, -start), np.int16)
    tail = np.zeros(max(0, end - len(x)), np.int16)
    return np.concatenate([head, x[max(0, start):min(end, len(x))], tail])


def make_one(job):
    """Worker: synthesise one utterance, write its FLAC, return its manifest record."""
    u, out = job
    samples = synthesise(u)
    relative = f"audio/{u.split}/{u.uid}.flac"
    sf.write(os.path.join(out, relative), samples, u.sample_rate, format="FLAC",
             subtype="PCM_16", compression_level=1.0)
    return u.split, {"audio_filepath": relative,
                     "duration": round(len(samples) / u.sample_rate, 3),
                     "text": u.text, "speaker": u.speaker, "rate": u.rate,
                     "pitch": u.pitch, "amplitude": u.amplitude}


def prepare_out(out, overwrite):
    """Create OUT; never mix a new corpus with files left from an older one."""
    old = [out / f"{s}.jsonl" for s in SPLITS] + [out / "audio" / s for s in SPLITS]
    existing = [p for p in old if p.exists()]
    if existing and not overwrite:
        die(f"--out {out} already holds a corpus ({existing[0]}); pass --overwrite to replace it.")
    for path in existing:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for split in SPLITS:
        (out / "audio" / split).mkdir(parents=True, exist_ok=True)


def write_corpus(utterances, out, workers):
    records = {split: [] for split in SPLITS}
    jobs = [(u, str(out)) for u in utterances]
    with multiprocessing.Pool(max(1, workers)) as pool:
        # imap keeps the planned order, so manifests do not depend on timing.
        results = list(pool.imap(make_one, jobs, chunksize=8))
    for split, record in results:
        records[split].append(record)
    for split in SPLITS:
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[split])
    return records


def corpus_bytes(out):
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def espeak_version():
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"\d+\.\d+[\w.-]*", out)
    return match.group() if match else "(unknown version)"


def write_readme(out, command, records, sample_rate, description):
    seconds = {s: sum(r["duration"] for r in records[s]) for s in SPLITS}
    rows = [f"| {s} | {len(records[s])} | {seconds[s] / 60:.1f} | {seconds[s] / 3600:.3f} |"
            for s in SPLITS]
    seen = ", ".join("+" + v if v else "(none)" for v in SEEN_VARIANTS)
    text = f"""# Synthetic speech corpus

{description}

Made by `scripts/make_corpus.py` (espeak-ng {espeak_version()}, sox); regenerate it
byte for byte with `{command}`

| split | utterances | minutes | hours |
|---|---|---|---|
{chr(10).join(rows)}

Manifests `<split>.jsonl` (paths relative to this folder) also record each utterance's
`speaker` (espeak-ng accent+variant), `rate` (wpm), `pitch` and `amplitude` (-a).
Audio: mono 16-bit FLAC at {sample_rate} Hz in `audio/<split>/`. Accents: {", ".join(ACCENTS)}.
Variants in train and dev: {seen}. Test also uses the held-out variants
{", ".join("+" + v for v in HELD_OUT_VARIANTS)} (about {HELD_OUT_SHARE:.0%} of its utterances).
No transcript occurs in two splits.
"""
    (out / "README.md").write_text(text, encoding="utf-8")


MINI_DESCRIPTION = """A small-vocabulary command domain in the spirit of TIDIGITS and AN4:
digits (zero..nine, oh) and {n} command words ("call five two nine", "go left",
"erase three"), in sentences of 1-8 words ({v} words in all). All splits draw from the same templates, and every
word of dev and test occurs in train. Spelled letters are left
out: espeak's letter names (the b/d/e/p/t/v "e-set") cannot be learned from the few
minutes of audio that fit. Sized to stay under 10 MB: 16 kHz FLAC of espeak speech
costs about 16 kB per second of speech."""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Generate a synthetic espeak-ng speech corpus (see the module docstring).")
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
    return " ".join(["python scripts/make_corpus.py", args.mode] + options + ["--overwrite"])


def main(argv=None):
    args = parse_args(argv)
    check_tools()
    rng = random.Random(args.seed)
    if args.mode == "mini":
        counts = {s: getattr(args, s) for s in SPLITS}
        drawn, sample_rate = draw_mini(rng, counts, args.seed), 16000
        commands = len(set(SINGLE + DIRECTIONS + ("go",)))
        description = MINI_DESCRIPTION.format(n=commands, v=commands + len(DIGITS))
    else:
        sentences = read_sentences(args.sentences)
        drawn = draw_text(rng, sentences, args.count, args.dev_fraction, args.test_fraction)
        sample_rate = args.sample_rate
        description = f"{args.count} sentences drawn from `{args.sentences}`, spoken by espeak-ng."
    prepare_out(args.out, args.overwrite)
    try:
        records = write_corpus(plan(rng, drawn, sample_rate), args.out, args.workers)
    except CorpusError as err:
        die(str(err))
    write_readme(args.out, regenerate_command(args), records, sample_rate, description)
    for split in SPLITS:
        seconds = sum(r["duration"] for r in records[split])
        print(f"{split}: {len(records[split])} utterances, {seconds:.1f} s")
    print(f"{args.out}: {corpus_bytes(args.out) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
