"""Leave voices out of a corpus: a training manifest without them, and a development set of only them.

A model's error on voices it never heard is what carries over to the voices of users; a dev set of
voices the corpus holds does not measure it, and a held-out set that chooses settings stops being
held out. A fold measures it with the corpus' own voices: train on the fold's train.jsonl, score on
its other manifests.

Usage:

    python -m scripts.corpus.leave_voice_out data/mini --voice flite/rms --out folds/rms
    python -m asr.fit --data.train_manifest folds/rms/train.jsonl --data.val_manifest folds/rms/dev.jsonl \
        --trainer.logger.init_args.name fold-rms
    python -m asr.transcribe --checkpoint runs/fold-rms/version_0/checkpoints/last.ckpt folds/rms/other16k.jsonl
    python -m asr.transcribe --checkpoint ... folds/rms/other8k.jsonl   # the same, through a telephone line

A voice is `synth/speaker` as the manifests record it (scripts/corpus/make_corpus.py), for example `flite/rms`
or `festival/czech_dita`; --voice may be given more than once. Output in OUT:
- train.jsonl and dev.jsonl: CORPUS's without the voices' lines (so validation does not hear them either);
- other16k.jsonl: the voices' lines of CORPUS/train.jsonl and CORPUS/dev.jsonl (test stays for judging);
- other8k.jsonl with audio/8k/<n>.flac: the same utterances through the held-out set's telephone channel
  (300-3400 Hz, 8-bit mu-law, 8 kHz; scripts/corpus/synthesizers.py), stored as 16-bit FLAC.
Audio paths are absolute, so the manifests work from any folder. The manifests are written last, once every
line has been read and converted, so a bad line leaves no fold behind. Needs: apt-get install sox.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

import scripts.corpus.synthesizers as tts
SOURCE_SPLITS = ("train", "dev")  # test is the corpus' judge; a fold never reads it
OUTPUTS = ("train.jsonl", "dev.jsonl", "other16k.jsonl", "other8k.jsonl", "audio")


def die(message):
    """Exit with ``message``, named after the script that runs (this one, or scripts/corpus/telephone_copy.py)."""
    sys.exit(f"{Path(sys.argv[0]).name}: error: {message}")


def read(manifest: Path) -> list[tuple[str, dict]]:
    """(manifest:line, row) for each line of a manifest, audio paths made absolute; blank lines skipped."""
    if not manifest.is_file():
        die(f"{manifest}: no such manifest")
    rows = []
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["audio_filepath"] = str((manifest.parent / row["audio_filepath"]).resolve())
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            die(f"{manifest}:{number}: not a manifest line with an audio_filepath ({err})")
        rows.append((f"{manifest}:{number}", row))
    return rows


def voice(row: dict) -> str | None:
    """``synth/speaker``, or None for a line that records neither."""
    return f"{row['synth']}/{row['speaker']}" if "synth" in row and "speaker" in row else None


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def phone(where: str, row: dict, path: Path) -> dict:
    """The row's audio through the telephone channel, written to ``path``; errors name the manifest line."""
    try:
        samples, rate = sf.read(row["audio_filepath"], dtype="int16")
        if samples.ndim > 1:  # sox reads one channel
            samples = samples.mean(axis=1).astype("int16")
        sf.write(path, np.asarray(tts.telephone(samples, rate, row["audio_filepath"])), tts.TELEPHONE_RATE)
    except (sf.LibsndfileError, tts.SynthError, OSError) as err:
        die(f"{where}: {err}")
    return dict(row, audio_filepath=str(path.resolve()))


def make_fold(corpus: Path, voices: set[str], out: Path, overwrite: bool = False) -> tuple[int, int]:
    """Write OUT's fold; (training lines kept, other-voice lines)."""
    splits = {split: read(corpus / f"{split}.jsonl") for split in SOURCE_SPLITS}
    known = {voice(row) for rows in splits.values() for _, row in rows} - {None}
    if not known:
        die(f"{corpus}: its manifests record no synth and speaker, so no voice can be left out")
    if unknown := sorted(voices - known):
        die(f"--voice {', '.join(unknown)}: not a voice of {corpus} (synth/speaker, e.g. {min(known)})")
    kept = {split: [row for _, row in rows if voice(row) not in voices] for split, rows in splits.items()}
    if not kept["train"]:
        die(f"--voice: leaves no line of {corpus / 'train.jsonl'} to train on")
    if out.resolve() == corpus.resolve():
        die(f"--out {out}: is the corpus itself; a fold goes to a folder of its own")
    if (existing := [name for name in OUTPUTS if (out / name).exists()]) and not overwrite:
        die(f"--out {out} already holds a fold ({existing[0]}); pass --overwrite to replace it")
    for name in OUTPUTS:  # never a fold mixed from two runs
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink(missing_ok=True)
    (out / "audio" / "8k").mkdir(parents=True)
    other = [(where, row) for split in SOURCE_SPLITS for where, row in splits[split] if voice(row) in voices]
    phoned = [phone(where, row, out / "audio" / "8k" / f"{n:05d}.flac") for n, (where, row) in enumerate(other)]
    write(out / "other8k.jsonl", phoned)
    write(out / "other16k.jsonl", [row for _, row in other])
    write(out / "dev.jsonl", kept["dev"])
    write(out / "train.jsonl", kept["train"])
    return len(kept["train"]), len(other)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder with train.jsonl and dev.jsonl (e.g. data/mini)")
    parser.add_argument("--voice", action="append", required=True, help="synth/speaker to leave out; repeatable")
    parser.add_argument("--out", type=Path, required=True, help="folder for the fold's manifests and audio")
    parser.add_argument("--overwrite", action="store_true", help="replace a fold already in --out")
    args = parser.parse_args(argv)
    if missing := tts.missing_tools(()):
        die(f"needs sox: apt-get install {' '.join(missing)}")
    kept, other = make_fold(args.corpus, set(args.voice), args.out, args.overwrite)
    print(f"{args.out}: train.jsonl {kept} lines; other16k.jsonl and other8k.jsonl {other} lines")


if __name__ == "__main__":
    main()
