"""``python -m asr.average`` (also ``asr average``): the command lives in asr.tools.average."""

from asr.tools.average import run

if __name__ == "__main__":
    run()
