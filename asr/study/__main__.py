"""``python -m asr.study`` (also ``asr study``): asr.study.run."""

from asr.study.run import run

run()
