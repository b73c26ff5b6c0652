"""``python -m asr.average`` (also ``asr average``): the command lives in asr.tools.averaging."""

from asr.tools.averaging import run

if __name__ == "__main__":
    run()
