"""``python -m asr.convert`` (also ``asr convert``): the command lives in asr.tools.convert."""

from asr.tools.convert import run

if __name__ == "__main__":
    run()
