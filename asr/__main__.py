"""``asr COMMAND ARGS``: the console script (``[project.scripts]``); each command is also ``python -m asr.COMMAND``.

    asr fit                                                   # the default run: the bundled corpus on a CPU
    asr transcribe --checkpoint runs/default/version_0/checkpoints/last.ckpt data/mini/test.jsonl
"""

from __future__ import annotations

import importlib
import sys

# command -> (module whose run() runs it and exits with its status, what it does)
COMMANDS = {
    "fit": ("asr.fit", "train a model (LightningCLI), or to a budget; plan a GPU run to GPU-hours"),
    "transcribe": ("asr.inference.transcribing", "transcribe audio files, folders or manifests"),
    "serve": ("asr.inference.serving", "live transcription over WebSocket (a streaming model)"),
    "average": ("asr.tools.averaging", "average the weights of checkpoints"),
    "export": ("asr.tools.exporting", "a torch.export .pt2 for serving"),
    "convert": ("asr.tools.converting", "a sharded checkpoint folder -> one .ckpt"),
    "study": ("asr.study.run", "the scaling study: which model size trains fastest"),
    "bench": ("asr.bench.suite", "the benchmark suite"),
    "shard": ("asr.tools.sharding", "manifests -> Lhotse Shar shards, a tokenizer and an index, for large corpora"),
    "import": ("asr.tools.import_corpus", "LibriSpeech, Common Voice or Kaldi folders -> manifests"),
    "build-lm": ("asr.tools.build_lm", "an n-gram LM for beam search"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "usage: asr COMMAND [ARGS]   (asr COMMAND --help for its arguments)\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    if argv[0] not in COMMANDS:
        sys.exit(f"asr: no command {argv[0]!r}\n{usage()}")
    module = importlib.import_module(COMMANDS[argv[0]][0])
    sys.argv = [f"asr {argv[0]}", *argv[1:]]
    module.run()


if __name__ == "__main__":
    main()
