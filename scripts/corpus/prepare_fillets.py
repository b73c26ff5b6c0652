"""Real Czech speech to develop on: the voice-acted dialogs of Fish Fillets NG, as train/dev/test manifests.

    sudo apt-get install fillets-ng-data-cs     # Debian/Ubuntu; ~1,700 clips, ~1.6 h usable
    python -m scripts.corpus.prepare_fillets data/fillets     # data/fillets is gitignored
    python -m asr.fit --data.train_manifest data/fillets/train.jsonl --data.val_manifest data/fillets/dev.jsonl \\
        --data.test_manifest data/fillets/test.jsonl

Transcripts are the ``dialogStr`` strings of ``script/<level>/dialogs_cs.lua`` (and of ``demo_`` and
``brief_dialogs_cs.lua``; each belongs to the ``dialogId`` before it, which names the clip); audio is ``sound/<level>/cs/<dialog id>.ogg``. Text
is normalised by ``import_corpus.normalise_text`` (lowercase, letters incl. Czech ones, no punctuation).

The split is by game level, so a level's sentences never reach two splits: the sorted levels are
shuffled with ``--seed`` and taken for test, then dev, until each holds ``--held-out`` of the
duration; the rest is train. A sentence that also occurs in test is dropped from dev and train, one in
dev from train. The test split is the held-out set no tuning should touch; OUT/splits.json lists the
levels of each split. With the default seed 0 the test levels are: alibaba, broom, cancan, columns,
engine, grail, hole, keys, puzzle, society, wreck.

Each line's ``speaker`` is ``small_fish`` or ``big_fish`` (one voice actor each, throughout the game),
``both_fish`` (one clip of the two at once), or ``other:<code>`` for the other characters, voiced by other
actors; ``speaker()`` says how the dialog's font and id tell them apart. ``--leave-voices-out other`` also
writes a split by voice, for settings that must carry over to voices never heard:

    python -m scripts.corpus.prepare_fillets data/fillets --convert --leave-voices-out other
    python -m asr.fit --data.train_manifest data/fillets/tune/train.jsonl \\
        --data.val_manifest data/fillets/tune/dev.jsonl --data.test_manifest data/fillets/heldout/test.jsonl

- ``tune/train.jsonl`` and ``tune/dev.jsonl``: the fishes' clips of train and dev (split by level as above;
  the test levels' fish stay out, so test.jsonl stays held out as well), less the sentences heldout holds;
  tune on these.
- ``heldout/test.jsonl``: every clip of the other characters, from all levels, and nothing of the fish: no
  choice ever looks at it. Train on tune/ only: train.jsonl holds most of these clips.

With the defaults (``--seed 0``, ``--held-out 0.1``, ``--max-duration 20``) the parts hold:

    train.jsonl           1293 clips  1.234 h    tune/train.jsonl     1044 clips  0.990 h  (fish)
    dev.jsonl              189 clips  0.215 h    tune/dev.jsonl        164 clips  0.164 h  (fish)
    test.jsonl             206 clips  0.169 h    heldout/test.jsonl    279 clips  0.300 h  (other characters)

Skipped and counted: clips with no transcript, transcripts with no clip, template text (``%1``, filled
in by the game), text with digits (how they are spoken is not written), clips longer than
``--max-duration``. By default ``audio_filepath`` points at the .ogg files, relative to OUT (soundfile
reads Ogg Vorbis; their 22.05/44.1 kHz is resampled on loading); ``--convert`` writes 16 kHz mono FLAC
under OUT/audio so the folder stands alone. Runs offline.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import soundfile
import torch

from asr.audio import load_audio, resample
from asr.data.manifest import FilterConfig
from asr.tools.import_corpus import audio_duration, normalise_text, write_manifest

DEFAULT_ROOT = Path("/usr/share/games/fillets-ng")  # where Debian installs fillets-ng-data(-cs)
CONVERT_RATE = 16000  # Hz of the FLAC files --convert writes
SPLITS = ("train", "dev", "test")
LEAVE_VOICE_OUT = {"train": "tune/train", "dev": "tune/dev", "test": "heldout/test"}  # --leave-voices-out's manifests
LUA_STRING = r'"((?:[^"\\]|\\.)*)"'  # a Lua double-quoted string, its content captured
# dialogId("id", "font", ...) or dialogStr("text"): the first argument may follow a newline
CALL = re.compile(rf"\b(dialogId|dialogStr)\s*\(\s*{LUA_STRING}(?:\s*,\s*{LUA_STRING})?", re.S)
# The game draws each line in its speaker's font: the lines level code plans with addm (on the small fish,
# script/share/prog_compatible.lua) are in font_small, those with addv (the big fish) in font_big; font_both is both
FISH_FONTS = {"font_small": "small_fish", "font_big": "big_fish", "font_both": "both_fish"}
FISH_CODES = {"m": "small_fish", "v": "big_fish"}  # speaker codes of dialog ids (speaker_code())
OTHER = "other"  # the prefix of every other character's speaker label, and the --leave-voices-out value


class Dialog(NamedTuple):
    text: str  # the raw Czech text, Lua escapes undone
    speaker: str  # speaker()'s label


def speaker_code(dialog_id: str) -> str:
    """The speaker field of a dialog id: the second of ``level-speaker-word`` (``zd2-x-hus0``: x), the first of
    ``speaker-word`` (``b1-voda1``: b1), none ("") in an id of one field. A code names a character within its
    level (x is whoever speaks there besides the fish), not an actor across levels."""
    fields = dialog_id.split("-")
    return fields[1] if len(fields) > 2 else fields[0] if len(fields) == 2 else ""


def speaker(dialog_id: str, font: str | None) -> str:
    """small_fish, big_fish, both_fish, or other:<code> for another character (``other`` if the id has no code).

    A line is a fish's when its font or its id's speaker code says so: the ids of 89 usable fish clips carry no
    fish code (``help1``, ``init-0-1``, ``semafor-v``), and no Czech dialog has a fish code in another font, so
    either alone would miss no fish line that the other names."""
    code = speaker_code(dialog_id)
    return FISH_FONTS.get(font) or FISH_CODES.get(code) or (f"{OTHER}:{code}" if code else OTHER)


def parse_dialogs(lua: Path) -> tuple[dict[str, Dialog], Counter]:
    """{dialog id: its Dialog} of one dialogs_cs.lua, and counts of lines it could not pair."""
    source = lua.read_text(encoding="utf-8")
    dialogs, skipped, current = {}, Counter(), None
    for match in CALL.finditer(source):
        value = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), match[2])  # Lua escapes
        if match[1] == "dialogId":
            current = (value, match[3])
        elif current is None or current[0] in dialogs:
            skipped["dialogStr without its own dialogId"] += 1
        else:
            dialogs[current[0]] = Dialog(value, speaker(*current))
    return dialogs, skipped


def collect(root: Path, max_duration: float) -> tuple[dict[str, list[dict]], Counter]:
    """{level: manifest rows (audio_filepath, duration, text, speaker)} of every usable clip under ``root``, and
    counts of what was skipped and why."""
    levels, skipped = {}, Counter()
    for level in sorted({lua.parent.name for lua in root.glob("script/*/*dialogs_cs.lua")}):
        dialogs = {}
        for lua in sorted((root / "script" / level).glob("*dialogs_cs.lua")):  # dialogs, demo_, brief_dialogs_cs
            found, unpaired = parse_dialogs(lua)
            skipped.update(unpaired)
            skipped["dialog id given twice"] += len(found.keys() & dialogs.keys())
            dialogs = {**found, **dialogs}
        clips = {ogg.stem: ogg for ogg in (root / "sound" / level / "cs").glob("*.ogg")}
        skipped["clip with no transcript"] += len(clips.keys() - dialogs.keys())
        skipped["transcript with no clip"] += len(dialogs.keys() - clips.keys())
        rows = []
        for dialog_id in sorted(dialogs.keys() & clips.keys()):
            raw, text = dialogs[dialog_id].text, normalise_text(dialogs[dialog_id].text)
            duration = round(audio_duration(clips[dialog_id]), 3)
            reason = ("template text" if "%" in raw else "text with digits" if re.search(r"\d", text)
                      else "empty text" if not text else "longer than --max-duration" if duration > max_duration
                      else None)
            if reason:
                skipped[reason] += 1
            else:
                rows.append({"audio_filepath": clips[dialog_id], "duration": duration, "text": text,
                             "speaker": dialogs[dialog_id].speaker})
        if rows:
            levels[level] = rows
    return levels, skipped


def split_levels(levels: dict[str, list[dict]], seed: int, held_out: float) -> dict[str, list[str]]:
    """{split: sorted level names}: shuffled levels fill test, then dev, to ``held_out`` of the duration each."""
    seconds = {level: sum(row["duration"] for row in rows) for level, rows in levels.items()}
    order = sorted(seconds)
    random.Random(seed).shuffle(order)
    splits, filled = {split: [] for split in SPLITS}, {split: 0.0 for split in SPLITS}
    for level in order:
        split = next((s for s in ("test", "dev") if filled[s] < held_out * sum(seconds.values())), "train")
        splits[split].append(level)
        filled[split] += seconds[level]
    return {split: sorted(names) for split, names in splits.items()}


def drop_repeats(rows: dict[str, list[dict]]) -> Counter:
    """Remove from dev and train the sentences test holds, and from train those of dev; counts per split."""
    dropped, seen = Counter(), set()
    for split in ("test", "dev", "train"):
        kept = [row for row in rows[split] if row["text"] not in seen]
        dropped[split] = len(rows[split]) - len(kept)
        rows[split] = kept
        seen |= {row["text"] for row in kept}
    return dropped


def leave_voices_out(levels: dict[str, list[dict]],
                     rows: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], Counter]:
    """The leave-voice-out manifests {tune/train, tune/dev, heldout/test: rows}, and the sentences dropped from each.

    heldout/test holds every clip of the other characters, from all ``levels``; tune/train and tune/dev the
    fishes' clips of the level split's ``rows["train"]`` and ``rows["dev"]`` (so its test stays held out too),
    less the sentences heldout/test holds, tune/train also less those of tune/dev."""
    voices = {split: [row for row in rows[split] if not row["speaker"].startswith(OTHER)] for split in ("train", "dev")}
    voices["test"] = [row for name in sorted(levels) for row in levels[name] if row["speaker"].startswith(OTHER)]
    dropped = drop_repeats(voices)
    return ({LEAVE_VOICE_OUT[split]: voices[split] for split in SPLITS},
            Counter({LEAVE_VOICE_OUT[split]: n for split, n in dropped.items()}))


def convert(manifests: dict[str, list[dict]], out: Path) -> dict[str, list[dict]]:
    """Write each clip of ``manifests`` once, as 16 kHz mono FLAC under ``out/audio/<level>/``; the manifests
    pointing at the copies."""
    flacs = {}
    for row in (row for rows in manifests.values() for row in rows):
        ogg = row["audio_filepath"]
        if ogg not in flacs:
            flacs[ogg] = out / "audio" / ogg.parent.parent.name / f"{ogg.stem}.flac"
            flacs[ogg].parent.mkdir(parents=True, exist_ok=True)
            samples, rate = load_audio(ogg)
            soundfile.write(flacs[ogg], resample(torch.from_numpy(samples), rate, CONVERT_RATE).numpy(), CONVERT_RATE)
    return {name: [{**row, "audio_filepath": flacs[row["audio_filepath"]]} for row in rows]
            for name, rows in manifests.items()}


def summary(name: str, rows: list[dict]) -> str:
    """``name: N utterances, H h, L levels`` of a manifest's rows, their audio still the game's .ogg files."""
    hours = sum(row["duration"] for row in rows) / 3600
    levels = {row["audio_filepath"].parent.parent.name for row in rows}
    return f"{name}: {len(rows)} utterances, {hours:.3f} h, {len(levels)} levels"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    max_duration = FilterConfig.max_duration  # the dataclass field's default
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for train.jsonl, dev.jsonl, test.jsonl and splits.json")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the installed game data (script/, sound/)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the levels before the split")
    parser.add_argument("--held-out", type=float, default=0.1, help="fraction of the duration in each of dev and test")
    parser.add_argument("--max-duration", type=float, default=max_duration,
                        help="skip longer clips (seconds; default: asr.data's data.filter.max_duration)")
    parser.add_argument("--convert", action="store_true", help="write 16 kHz mono FLAC copies under OUT/audio")
    parser.add_argument("--leave-voices-out", choices=[OTHER],
                        help="also write OUT/tune/train.jsonl and OUT/tune/dev.jsonl (the fishes' clips of train and "
                             "dev) and OUT/heldout/test.jsonl (every clip of the other characters)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not list(args.root.glob("sound/*/cs/*.ogg")):
        sys.exit(f"{args.root}: no sound/<level>/cs/*.ogg (install the Debian package fillets-ng-data-cs, or pass --root)")
    levels, skipped = collect(args.root, args.max_duration)
    splits = split_levels(levels, args.seed, args.held_out)
    manifests = {split: [row for level in splits[split] for row in levels[level]] for split in SPLITS}
    repeats = drop_repeats(manifests)
    if args.leave_voices_out:
        layout, dropped = leave_voices_out(levels, manifests)
        manifests |= layout
        repeats.update(dropped)
    skipped.update({f"sentence repeated from a held-out split ({name})": n for name, n in repeats.items()})
    for name, rows in manifests.items():
        print(summary(name, rows))
    for name, rows in (convert(manifests, args.out) if args.convert else manifests).items():
        write_manifest(rows, args.out / f"{name}.jsonl")
    (args.out / "splits.json").write_text(json.dumps({"seed": args.seed, **splits}, indent=1) + "\n")
    print(f"test levels (held out): {', '.join(splits['test'])}")
    print("skipped: " + (", ".join(f"{n} {why}" for why, n in skipped.most_common() if n) or "nothing"))


if __name__ == "__main__":
    main()
