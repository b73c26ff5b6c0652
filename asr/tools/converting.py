"""Turn a sharded checkpoint folder into one ``.ckpt`` file.

Under configs/strategy/fsdp.yaml (``save_distributed_checkpoint: true``) each rank writes
its shard of the weights and optimizer state into a folder (torch.distributed.checkpoint
files plus ``meta.pt``). This merges them into the file format every other strategy writes,
which ``asr.fit --ckpt_path`` resumes from under any strategy and device count:

    python -m asr.convert runs/default/version_0/checkpoints/last.ckpt last-full.ckpt

It merges with asr.checkpoint.merge, as every reader of asr (asr.transcribe, asr.average, asr.export,
--model.init_from) reads a folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from asr.atomic import write_atomically
from asr.checkpoint import merge, precious


def convert(folder: str | Path, output: str | Path) -> Path:
    """Merge the sharded checkpoint ``folder`` into the single file ``output`` (written atomically).

    Raises ValueError naming ``folder`` if it has no meta.pt or its shards cannot be read.
    """
    checkpoint = merge(folder)
    with write_atomically(Path(output)) as partial:  # never a half-written checkpoint under the real name
        torch.save(checkpoint, partial)
    return Path(output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a sharded checkpoint folder (configs/strategy/fsdp.yaml writes them)")
    parser.add_argument("output", help="the .ckpt file to write")
    args = parser.parse_args(argv)
    refused = precious(Path(args.output), [])
    if refused:
        sys.exit(f"python -m asr.convert: error: not written: {refused}")
    try:
        print(f"wrote {convert(args.folder, args.output)}")
    except (ValueError, OSError) as err:  # OSError: the output's folder cannot be written, or is full
        sys.exit(f"python -m asr.convert: error: {err}")


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
