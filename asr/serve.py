"""``python -m asr.serve`` (also ``asr serve``): live transcription over WebSocket; the command lives in
asr.inference.serving, the protocol in docs/streaming-protocol.md."""

from asr.inference.serving import run

if __name__ == "__main__":
    run()
