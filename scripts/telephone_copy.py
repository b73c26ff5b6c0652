"""A telephone copy of a manifest: the same utterances through the held-out set's 8 kHz telephone channel.

Settings meant for 8 kHz telephone audio are chosen on such a copy of a development split, so that the
held-out set (data/heldout/8k.jsonl) only judges:

    python scripts/telephone_copy.py data/mini/dev.jsonl --out devtel
    python -m asr.transcribe --checkpoint CKPT devtel/8k.jsonl

Output in OUT: 8k.jsonl, the manifest's lines in order with absolute paths to audio/<n>.flac, each the line's
audio through scripts/synthesizers.py's channel (300-3400 Hz, 8-bit mu-law, 8 kHz), stored as 16-bit FLAC.
The manifest is written last, so a bad line (named MANIFEST:LINE) leaves no copy behind. Needs sox.
"""
import argparse
import shutil
from pathlib import Path

import leave_voice_out as lvo
import synthesizers as tts

OUTPUTS = ("8k.jsonl", "audio")


def make_copy(manifest: Path, out: Path, overwrite: bool = False) -> int:
    """Write OUT's copy of ``manifest``; the number of lines."""
    rows = lvo.read(manifest)
    if (existing := [name for name in OUTPUTS if (out / name).exists()]) and not overwrite:
        lvo.die(f"--out {out} already holds a copy ({existing[0]}); pass --overwrite to replace it")
    for name in OUTPUTS:  # never a copy mixed from two runs
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink(missing_ok=True)
    (out / "audio").mkdir(parents=True)
    phoned = [lvo.phone(where, row, out / "audio" / f"{n:05d}.flac") for n, (where, row) in enumerate(rows)]
    lvo.write(out / "8k.jsonl", phoned)
    return len(phoned)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, help="a JSON-lines manifest (e.g. data/mini/dev.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="folder for 8k.jsonl and its audio")
    parser.add_argument("--overwrite", action="store_true", help="replace a copy already in --out")
    args = parser.parse_args(argv)
    if missing := tts.missing_tools(()):
        lvo.die(f"needs sox: apt-get install {' '.join(missing)}")
    count = make_copy(args.manifest, args.out, args.overwrite)
    print(f"{args.out / '8k.jsonl'}: {count} lines")


if __name__ == "__main__":
    main()
