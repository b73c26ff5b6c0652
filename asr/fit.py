"""``python -m asr.fit`` (also ``asr fit``): the command lives in asr.train.fit."""

from asr.train.fit import run

if __name__ == "__main__":
    run()
