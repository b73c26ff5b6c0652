"""``python -m asr.bench.loader --shards DIR --manifest FILE``: audio-seconds per second that one data worker gives
(here the main process: a worker's work without the training step), from shards and from files, with the default
run's augmentation and speeds and without augmentation; and the padding of the batches. Feed the figure to
``python -m asr.bench.presets --worker_audio_per_second X`` for the workers a GPU needs.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from asr.data.augment import Augmentation
from asr.data.datamodule import ASRDataModule
from asr.tokenizer import TokenizerConfig


def measure(data: ASRDataModule, batches: int) -> tuple[float, float, float]:
    """(audio-seconds per second, audio seconds read, padding share) over up to ``batches`` training batches."""
    data.setup("fit")
    loader = iter(data.train_dataloader())
    next(loader)  # the first batch fills buffers and caches: start-up, not throughput
    start, audio, padded = time.perf_counter(), 0, 0
    for batch in itertools.islice(loader, batches):
        audio += int(batch.audio_lengths.sum())
        padded += batch.audio.numel()
    wall = time.perf_counter() - start
    rate = data.hparams.sample_rate
    return audio / rate / wall, audio / rate, 1 - audio / padded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", help="a shard folder or address (python -m asr.shard)")
    parser.add_argument("--manifest", help="a JSON-lines manifest of the same audio")
    parser.add_argument("--tokenizer_model", help="default: the shards' tokenizer.model")
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--max_batch_seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    if not (args.shards or args.manifest):
        parser.error("give --shards, --manifest or both")
    torch.set_num_threads(1)  # one worker's share of the CPU
    tokenizer = args.tokenizer_model or (args.shards and f"{args.shards.rstrip('/')}/tokenizer.model")
    print("| source | augmentation | audio-seconds per second, one worker | padding |\n|---|---|---|---|")
    for source, given in (("shards", {"train_shards": args.shards}), ("files", {"train_manifest": args.manifest})):
        if not next(iter(given.values())):
            continue
        for name, augmentation in (("default run's", Augmentation()), ("none", Augmentation.off())):
            data = ASRDataModule(**given, tokenizer=TokenizerConfig(tokenizer), num_workers=0,
                                 max_batch_seconds=args.max_batch_seconds, augmentation=augmentation,
                                 subsampling=4)  # 40 ms frames' feasibility rule: the shards' characters fit every line
            per_second, _, padding = measure(data, args.batches)
            print(f"| {source} | {name} | {per_second:,.0f} | {padding:.1%} |", flush=True)


def run() -> None:
    main()


if __name__ == "__main__":
    run()
