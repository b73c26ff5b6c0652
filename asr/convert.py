"""``python -m asr.convert`` (also ``asr convert``): the command lives in asr.tools.converting."""

from asr.tools.converting import run

if __name__ == "__main__":
    run()
