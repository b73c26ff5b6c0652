"""Transcribe audio files, folders and manifests with a checkpoint written by asr.fit.

    python -m asr.transcribe --checkpoint runs/default/version_0/checkpoints/last.ckpt data/mini/audio/test/000001.flac
    python -m asr.transcribe --checkpoint CKPT data/mini/test.jsonl --output hyps.jsonl   # prints WER and CER too
    python -m asr.transcribe --checkpoint CKPT my_recordings/                          # every audio file below

Python:

    from asr.transcribe import Transcriber
    Transcriber.from_checkpoint("last.ckpt").transcribe(["a.flac", "b.wav"])  # -> ["text a", "text b"]

The checkpoint is loaded with ``torch.load(weights_only=True)``: no pickled code runs.
Utterances are batched by length (up to ``max_batch_seconds`` of padded audio) and
returned in input order; batching does not change any transcript.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from asr import manifest as mf
from asr.data import ASRDataset, BucketBatchSampler
from asr.module import ASRModule, error_counts

AUDIO_SUFFIXES = (".flac", ".wav", ".ogg", ".mp3", ".opus", ".aiff", ".aif")
MANIFEST_SUFFIXES = (".json", ".jsonl")


class Transcriber:
    """A trained model ready to transcribe: ``Transcriber.from_checkpoint(path).transcribe(paths)``."""

    def __init__(self, module: ASRModule, device: str | torch.device = "cpu", max_batch_seconds: float = 120.0):
        self.module = module.to(device).eval()
        self.device, self.max_batch_seconds = torch.device(device), max_batch_seconds

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "cpu", max_batch_seconds: float = 120.0) -> "Transcriber":
        return cls(ASRModule.from_checkpoint(path, map_location=device), device, max_batch_seconds)

    @property
    def sample_rate(self) -> int:
        return self.module.hparams.sample_rate

    def transcribe(self, paths: list[str | Path]) -> list[str]:
        """Transcripts of the audio files ``paths``, in the same order."""
        return self.transcribe_utterances([mf.Utterance(Path(p), 0.0, "", source=str(p)) for p in paths])

    def transcribe_utterances(self, utterances: list[mf.Utterance]) -> list[str]:
        """Transcripts of manifest utterances (their text is ignored), in the same order."""
        return self.decode([self.check(u) for u in utterances])

    @torch.inference_mode()
    def decode(self, checked: list[mf.Utterance]) -> list[str]:
        """Transcripts of utterances that passed ``check`` (their durations are real), in the same order."""
        dataset = ASRDataset(checked, [[] for _ in checked], self.sample_rate)
        sampler = BucketBatchSampler([u.duration for u in checked], self.max_batch_seconds, shuffle=False)
        texts: list[str] = [""] * len(checked)
        for indices in sampler:
            batch = dataset[indices]
            hyps = self.module.transcribe_batch(batch.audio.to(self.device), batch.audio_lengths.to(self.device))
            for i, text in zip(indices, hyps):
                texts[i] = text
        return texts

    def check(self, utt: mf.Utterance) -> mf.Utterance:
        """The utterance with its real duration; unreadable or empty audio raises ManifestError naming the file."""
        checked, _ = mf.check_audio(utt, self.sample_rate, "resample")
        if isinstance(checked, mf.Problem):
            raise mf.ManifestError(str(checked))
        return checked


def collect(inputs: list[str]) -> list[mf.Utterance]:
    """Audio files, folders (every audio file below, sorted) and manifests -> utterances."""
    utterances = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
            if not files:
                raise FileNotFoundError(f"{path}: no audio files ({', '.join(AUDIO_SUFFIXES)}) below this folder")
            utterances += [mf.Utterance(p, 0.0, "", source=str(p)) for p in files]
        elif path.suffix.lower() in MANIFEST_SUFFIXES:
            found, problems = mf.parse_manifest(path)
            mf.report(problems, path, len(found) + len(problems), "error")
            utterances += found
        elif path.is_file():
            utterances.append(mf.Utterance(path, 0.0, "", source=str(path)))
        else:
            raise FileNotFoundError(f"{path}: no such audio file, folder or manifest")
    return utterances


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asr.transcribe", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="audio files, folders of audio, or JSON-lines manifests")
    parser.add_argument("--checkpoint", required=True, help="a .ckpt written by python -m asr.fit")
    parser.add_argument("--output", help="write one JSON line per utterance here instead of printing text")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--max_batch_seconds", type=float, default=120.0, help="padded audio per batch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    transcriber = Transcriber.from_checkpoint(args.checkpoint, args.device, args.max_batch_seconds)
    utterances = collect(args.inputs)
    start = time.perf_counter()
    utterances = [transcriber.check(u) for u in utterances]
    hyps = transcriber.decode(utterances)
    elapsed = time.perf_counter() - start
    rows = [{"audio_filepath": str(u.audio_filepath), "duration": round(u.duration, 3), "text": h}
            for u, h in zip(utterances, hyps)]
    refs = [u.text for u in utterances]
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(dict(row, reference=ref) if ref else row) + "\n" for row, ref in zip(rows, refs))
    else:
        for row in rows:
            print(f"{row['audio_filepath']}\t{row['text']}")
    audio_seconds = sum(u.duration for u in utterances)
    summary = f"{len(rows)} files, {audio_seconds:.1f} s of audio in {elapsed:.2f} s: real-time factor {elapsed / audio_seconds:.4f}"
    scored = [(r, h) for r, h in zip(refs, hyps) if r]
    if scored:
        word_errors, words, char_errors, chars = error_counts(*map(list, zip(*scored))).tolist()
        summary += f"\nWER {word_errors / words:.4f}  CER {char_errors / chars:.4f}  ({len(scored)} references)"
    print(summary, file=sys.stdout if args.output else sys.stderr)  # stdout stays transcripts only


if __name__ == "__main__":
    main()
