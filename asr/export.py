"""``python -m asr.export`` (also ``asr export``): the command lives in asr.tools.export."""

from asr.tools.export import run

if __name__ == "__main__":
    run()
