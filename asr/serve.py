"""``python -m asr.serve`` (also ``asr serve``): live transcription over WebSocket; the command lives in
asr.inference.serve, the protocol in docs/streaming-protocol.md."""

from asr.inference.serve import run

if __name__ == "__main__":
    run()
