"""Real Czech speech to develop on: the voice-acted dialogs of Fish Fillets NG, as train/dev/test manifests.

    sudo apt-get install fillets-ng-data-cs     # Debian/Ubuntu; ~1,700 clips, ~1.6 h usable
    python -m scripts.corpus.prepare_fillets data/fillets
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

Skipped and counted: clips with no transcript, transcripts with no clip, template text (``%1``, filled
in by the game), text with digits (how they are spoken is not written), clips longer than
``--max-duration``. By default ``audio_filepath`` points at the .ogg files, relative to OUT (soundfile
reads Ogg Vorbis; their 22.05/44.1 kHz is resampled on loading); ``--convert`` writes 16 kHz mono FLAC
under OUT/audio so the folder stands alone. Runs offline.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import soundfile
import torch

from asr.audio import load_audio, resample
from asr.data.module import ASRDataModule
from asr.tools.import_corpus import audio_duration, normalise_text, write_manifest

DEFAULT_ROOT = Path("/usr/share/games/fillets-ng")  # where Debian installs fillets-ng-data(-cs)
CONVERT_RATE = 16000  # Hz of the FLAC files --convert writes
SPLITS = ("train", "dev", "test")
# dialogId("id", ...) or dialogStr("text"): the first argument, a Lua double-quoted string, may follow a newline
CALL = re.compile(r'\b(dialogId|dialogStr)\s*\(\s*"((?:[^"\\]|\\.)*)"', re.S)


def parse_dialogs(lua: Path) -> tuple[dict[str, str], Counter]:
    """{dialog id: raw Czech text} of one dialogs_cs.lua, and counts of lines it could not pair."""
    source = lua.read_text(encoding="utf-8")
    texts, skipped, current = {}, Counter(), None
    for match in CALL.finditer(source):
        value = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), match[2])  # Lua escapes
        if match[1] == "dialogId":
            current = value
        elif current is None or current in texts:
            skipped["dialogStr without its own dialogId"] += 1
        else:
            texts[current] = value
    return texts, skipped


def collect(root: Path, max_duration: float) -> tuple[dict[str, list[dict]], Counter]:
    """{level: manifest rows} of every usable clip under ``root``, and counts of what was skipped and why."""
    levels, skipped = {}, Counter()
    for level in sorted({lua.parent.name for lua in root.glob("script/*/*dialogs_cs.lua")}):
        texts = {}
        for lua in sorted((root / "script" / level).glob("*dialogs_cs.lua")):  # dialogs, demo_, brief_dialogs_cs
            found, unpaired = parse_dialogs(lua)
            skipped.update(unpaired)
            skipped["dialog id given twice"] += len(found.keys() & texts.keys())
            texts = {**found, **texts}
        clips = {ogg.stem: ogg for ogg in (root / "sound" / level / "cs").glob("*.ogg")}
        skipped["clip with no transcript"] += len(clips.keys() - texts.keys())
        skipped["transcript with no clip"] += len(texts.keys() - clips.keys())
        rows = []
        for dialog_id in sorted(texts.keys() & clips.keys()):
            raw, text = texts[dialog_id], normalise_text(texts[dialog_id])
            duration = round(audio_duration(clips[dialog_id]), 3)
            reason = ("template text" if "%" in raw else "text with digits" if re.search(r"\d", text)
                      else "empty text" if not text else "longer than --max-duration" if duration > max_duration
                      else None)
            if reason:
                skipped[reason] += 1
            else:
                rows.append({"audio_filepath": clips[dialog_id], "duration": duration, "text": text})
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


def convert(rows: list[dict], out: Path) -> list[dict]:
    """Write each row's audio as 16 kHz mono FLAC under ``out/audio/<level>/``; rows pointing at the copies."""
    converted = []
    for row in rows:
        ogg = row["audio_filepath"]
        flac = out / "audio" / ogg.parent.parent.name / f"{ogg.stem}.flac"
        flac.parent.mkdir(parents=True, exist_ok=True)
        samples, rate = load_audio(ogg)
        soundfile.write(flac, resample(torch.from_numpy(samples), rate, CONVERT_RATE).numpy(), CONVERT_RATE)
        converted.append({**row, "audio_filepath": flac})
    return converted


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    max_duration = inspect.signature(ASRDataModule).parameters["max_duration"].default
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for train.jsonl, dev.jsonl, test.jsonl and splits.json")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the installed game data (script/, sound/)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the levels before the split")
    parser.add_argument("--held-out", type=float, default=0.1, help="fraction of the duration in each of dev and test")
    parser.add_argument("--max-duration", type=float, default=max_duration,
                        help="skip longer clips (seconds; default: asr.data's data.max_duration)")
    parser.add_argument("--convert", action="store_true", help="write 16 kHz mono FLAC copies under OUT/audio")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not list(args.root.glob("sound/*/cs/*.ogg")):
        sys.exit(f"{args.root}: no sound/<level>/cs/*.ogg (install the Debian package fillets-ng-data-cs, or pass --root)")
    levels, skipped = collect(args.root, args.max_duration)
    splits = split_levels(levels, args.seed, args.held_out)
    rows = {split: [row for level in splits[split] for row in levels[level]] for split in SPLITS}
    repeats = drop_repeats(rows)
    for split in SPLITS:
        skipped[f"sentence repeated from a held-out split ({split})"] += repeats[split]
        rows[split] = convert(rows[split], args.out) if args.convert else rows[split]
        write_manifest(rows[split], args.out / f"{split}.jsonl")
        hours = sum(row["duration"] for row in rows[split]) / 3600
        print(f"{split}: {len(rows[split])} utterances, {hours:.3f} h, {len(splits[split])} levels")
    (args.out / "splits.json").write_text(json.dumps({"seed": args.seed, **splits}, indent=1) + "\n")
    print(f"test levels (held out): {', '.join(splits['test'])}")
    print("skipped: " + (", ".join(f"{n} {why}" for why, n in skipped.most_common() if n) or "nothing"))


if __name__ == "__main__":
    main()
