"""``python -m asr.shard`` (also ``asr shard``): the command lives in asr.tools.sharding."""

from asr.tools.sharding import run

if __name__ == "__main__":
    run()
