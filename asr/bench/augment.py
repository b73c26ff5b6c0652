"""The CPU cost of each waveform augmentation (asr.data.augment), per second of audio, in one data worker.

    python -m asr.bench.augment                       # the bundled corpus' training audio
    python -m asr.bench.augment --manifest data/fillets/train.jsonl --count 100

Each effect runs alone with probability 1 on the same utterances, on one thread as in a
DataLoader worker (which sets torch.set_num_threads(1)); it prints milliseconds of CPU per
second of audio and how many times faster than real time one worker keeps up.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from asr.data import manifest as mf
from asr.data.augment import Augmentation, Augmenter
from asr.data.dataset import ASRDataset, random_voice

EFFECTS = {  # name -> the settings that switch it (and only it) on
    "pitch": dict(pitch_prob=1.0),
    "tempo": dict(tempo_prob=1.0),
    "noise white": dict(noise_prob=1.0, noise_kinds=("white",)),
    "noise pink": dict(noise_prob=1.0, noise_kinds=("pink",)),
    "noise babble": dict(noise_prob=1.0, noise_kinds=("babble",)),
    "reverb": dict(reverb_prob=1.0),
    "gain": dict(gain_prob=1.0),
    "telephone": dict(telephone_prob=1.0),
    "all of them": dict(pitch_prob=1.0, tempo_prob=1.0, noise_prob=1.0, reverb_prob=1.0, gain_prob=1.0,
                        telephone_prob=1.0),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", default="data/mini/train.jsonl", help="utterances to augment")
    parser.add_argument("--count", type=int, default=50, help="how many of its utterances")
    parser.add_argument("--sample-rate", type=int, default=16000, help="Hz the audio is loaded at")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    utterances, _ = mf.parse_manifest(args.manifest)
    dataset = ASRDataset(utterances[: args.count], [[] for _ in utterances[: args.count]], args.sample_rate)
    waves = [dataset.load(i) for i in range(len(dataset))]
    seconds = sum(w.shape[0] for w in waves) / args.sample_rate
    print(f"{len(waves)} utterances, {seconds:.1f} s of audio at {args.sample_rate} Hz, 1 thread")
    voices = partial(random_voice, dataset)
    for name, settings in EFFECTS.items():
        augmenter = Augmenter(Augmentation(**settings), args.sample_rate, voices)
        generator = torch.Generator().manual_seed(0)
        start = time.process_time()
        for wave in waves:
            augmenter(wave, generator)
        cpu = time.process_time() - start
        print(f"{name:>14}: {1000 * cpu / seconds:7.2f} ms CPU per audio second ({seconds / max(cpu, 1e-9):6.0f}x real time)")


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
