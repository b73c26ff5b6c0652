"""Leave voices out of a corpus: a training manifest without them, and a development set of only them.

A model's error on voices it never heard is what carries over to the voices of users; a dev set of
voices the corpus holds does not measure it, and a held-out set that chooses settings stops being
held out. A fold measures it with the corpus' own voices: train on the fold's train.jsonl, score on
its other manifests.

Usage:

    python scripts/leave_voice_out.py data/mini --voice flite/rms --out folds/rms
    python -m asr.fit --data.train_manifest folds/rms/train.jsonl
    python -m asr.transcribe --checkpoint runs/default/version_0/checkpoints/last.ckpt folds/rms/other16k.jsonl
    python -m asr.transcribe --checkpoint ... folds/rms/other8k.jsonl   # the same, through a telephone line

A voice is `synth/speaker` as the manifests record it (scripts/make_corpus.py), for example `flite/rms`
or `festival/czech_dita`; --voice may be given more than once. Output in OUT:
- train.jsonl: CORPUS/train.jsonl without the voices' lines;
- other16k.jsonl: the voices' lines of CORPUS/train.jsonl and CORPUS/dev.jsonl (test stays for judging);
- other8k.jsonl with audio/8k/<n>.flac: the same utterances through the held-out set's telephone channel
  (300-3400 Hz, 8-bit mu-law, 8 kHz; scripts/synthesizers.py), stored as 16-bit FLAC.
Audio paths are absolute, so the manifests work from any folder. Needs: apt-get install sox.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

import synthesizers as tts

SOURCE_SPLITS = ("train", "dev")  # test is the corpus' judge; a fold never reads it
TELEPHONE_RATE = 8000


def read(manifest: Path) -> list[dict]:
    """Lines of a manifest, audio paths made absolute."""
    if not manifest.is_file():
        raise SystemExit(f"{manifest}: no such manifest")
    rows = []
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            row["audio_filepath"] = str((manifest.parent / row["audio_filepath"]).resolve())
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SystemExit(f"{manifest}:{number}: not a manifest line with an audio_filepath ({err})") from err
        rows.append(row)
    return rows


def voice(row: dict) -> str:
    return f"{row.get('synth')}/{row.get('speaker')}"


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_fold(corpus: Path, voices: set[str], out: Path) -> tuple[int, int]:
    """Write OUT's manifests; (training lines kept, other-voice lines)."""
    splits = {split: read(corpus / f"{split}.jsonl") for split in SOURCE_SPLITS}
    known = {voice(row) for rows in splits.values() for row in rows}
    if unknown := sorted(voices - known):
        raise SystemExit(f"--voice {', '.join(unknown)}: not a voice of {corpus} (synth/speaker, e.g. {min(known)})")
    train = [row for row in splits["train"] if voice(row) not in voices]
    other = [row for split in SOURCE_SPLITS for row in splits[split] if voice(row) in voices]
    (out / "audio" / "8k").mkdir(parents=True, exist_ok=True)
    write(out / "train.jsonl", train)
    write(out / "other16k.jsonl", other)
    phoned = []
    for n, row in enumerate(other):
        samples, rate = sf.read(row["audio_filepath"], dtype="int16")
        path = out / "audio" / "8k" / f"{n:05d}.flac"
        sf.write(path, np.asarray(tts.telephone(samples, rate, row["audio_filepath"])), TELEPHONE_RATE)
        phoned.append(dict(row, audio_filepath=str(path.resolve())))
    write(out / "other8k.jsonl", phoned)
    return len(train), len(other)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder with train.jsonl and dev.jsonl (e.g. data/mini)")
    parser.add_argument("--voice", action="append", required=True, help="synth/speaker to leave out; repeatable")
    parser.add_argument("--out", type=Path, required=True, help="folder for the fold's manifests and audio")
    args = parser.parse_args(argv)
    if missing := tts.missing_tools(()):
        raise SystemExit(f"needs sox: apt-get install {' '.join(missing)}")
    kept, other = make_fold(args.corpus, set(args.voice), args.out)
    print(f"{args.out}: train.jsonl {kept} lines; other16k.jsonl and other8k.jsonl {other} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
