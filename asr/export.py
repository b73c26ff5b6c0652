"""``python -m asr.export`` (also ``asr export``): the command lives in asr.tools.exporting."""

from asr.tools.exporting import run

if __name__ == "__main__":
    run()
