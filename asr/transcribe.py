"""``python -m asr.transcribe`` (also ``asr transcribe``): the command lives in asr.inference.transcribing; the
Python API is the Transcriber (asr.inference.transcriber), importable here too:

    from asr.transcribe import Transcriber
"""

from asr.inference.transcribing import run
from asr.inference.transcriber import Transcriber, TranscriptionError  # noqa: F401  (the Python API, README's name)

if __name__ == "__main__":
    run()
