"""``python -m asr.bench`` (also ``asr bench``): asr.bench.suite."""

from asr.bench.suite import run

run()
