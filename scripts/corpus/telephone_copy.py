"""A telephone copy of a manifest: the same utterances through the held-out set's 8 kHz telephone channel.

Settings meant for 8 kHz telephone audio are chosen on such a copy of a development split, so that the
held-out set (data/heldout/8k.jsonl) only judges:

    python -m scripts.corpus.telephone_copy data/mini/dev.jsonl --out devtel
    python -m asr.transcribe --checkpoint CKPT devtel/8k.jsonl

Output in OUT: 8k.jsonl, the manifest's lines in order with absolute paths to audio/<n>.flac, each the line's
audio through scripts/corpus/synthesizers.py's channel (300-3400 Hz, 8-bit mu-law, 8 kHz), stored as 16-bit FLAC.
A bad line (named MANIFEST:LINE) leaves OUT as it was: the audio goes to OUT/.partial until every line has
converted, and the manifest is written last. Needs sox.
"""
import argparse
import shutil
from pathlib import Path

import scripts.corpus.leave_voice_out as lvo
import scripts.corpus.synthesizers as tts
OUTPUTS = ("8k.jsonl", "audio")
PARTIAL = ".partial"  # where the audio is written until every line has converted


def make_copy(manifest: Path, out: Path, overwrite: bool = False) -> int:
    """Write OUT's copy of ``manifest``; the number of lines. Nothing in OUT changes unless every line converts."""
    rows = lvo.read(manifest)
    if not rows:
        lvo.die(f"{manifest}: no lines to copy")
    folder = out.resolve()
    if inside := next((row["audio_filepath"] for _, row in rows if folder in Path(row["audio_filepath"]).parents), None):
        lvo.die(f"--out {out}: holds the manifest's own audio ({inside}); a copy goes to a folder of its own")
    if (existing := [name for name in OUTPUTS if (out / name).exists()]) and not overwrite:
        lvo.die(f"--out {out} already holds a copy ({existing[0]}); pass --overwrite to replace it")
    partial = out / PARTIAL
    shutil.rmtree(partial, ignore_errors=True)  # left by a run that was killed
    (partial / "audio").mkdir(parents=True)
    try:
        phoned = [dict(lvo.phone(where, row, partial / "audio" / f"{n:05d}.flac"),
                       audio_filepath=str(folder / "audio" / f"{n:05d}.flac")) for n, (where, row) in enumerate(rows)]
    except SystemExit:  # a bad line: the copy already in OUT, if any, stays as it was
        shutil.rmtree(partial)
        raise
    for name in OUTPUTS:  # never a copy mixed from two runs
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink(missing_ok=True)
    (partial / "audio").rename(out / "audio")
    partial.rmdir()
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
