"""``python -m asr.shard`` (also ``asr shard``): the command lives in asr.tools.shard."""

from asr.tools.shard import run

if __name__ == "__main__":
    run()
