"""Audio for ``asr.transcribe --stream``: 16-bit PCM (raw, or with a WAV header) from a pipe, or a file replayed as
fast as it can be read or at real speed; and the lines a stream's Updates print as.

    sox f.flac -t raw -r 16000 -e signed -b 16 -c 1 - | python -m asr.transcribe --checkpoint C --stream -
    arecord -f S16_LE -r 16000 -t raw | python -m asr.transcribe --checkpoint C --stream -
    python -m asr.transcribe --checkpoint C --stream f.flac --realtime

Raw PCM is little-endian signed 16-bit mono at the model's rate. A WAV header (``sox ... -t wav -``, ``arecord -t
wav``) says its rate and channels instead: another rate is resampled as it streams (asr.audio.StreamResampler),
channels are mixed to mono; the header's data size is honoured (chunks after the data, LIST or id3, are not audio)
unless it is 0 or 2^32 - 1, as writers to a pipe leave it. A file may be anything soundfile reads, at any common
rate (asr.audio.check_resampling refuses the others, such as 16001 Hz).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np
import torch

from asr.audio import AudioError, stream_resampler
from asr.data.manifest import Utterance
from asr.data.sources import UtteranceAudio
from asr.inference.streaming import Update

PIECE_SECONDS = 0.1  # audio read at a time: a pipe's reads are up to this, a file's replay pieces are this
PCM_FORMATS = (1, 0xFFFE)  # WAVE_FORMAT_PCM, WAVE_FORMAT_EXTENSIBLE (with 16-bit integer samples)


def wav_header(f: BinaryIO, name: str) -> tuple[bytes, int | None, int, int | None]:
    """Read a WAV header from the start of ``f`` if it has one: (bytes read that are audio, the header's rate or
    None for raw PCM, channels, the data's size in bytes or None: up to the end). Reads only up to the data, so a pipe
    works; a data size of 0 or 2^32 - 1 is a streaming writer's (sox, arecord to a pipe) and means up to the end.
    Anything but 16-bit integer PCM raises AudioError naming ``name``."""
    head = f.read(12)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return head, None, 1, None
    rate = None
    while True:
        chunk = f.read(8)
        if len(chunk) < 8:
            raise AudioError(f"{name}: a WAV header with no data chunk")
        kind, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if kind == b"data":
            break
        body = f.read(size + size % 2)
        if kind == b"fmt ":
            rate, channels = wav_format(body, name)
    if rate is None:
        raise AudioError(f"{name}: a WAV header with no fmt chunk")
    return b"", rate, channels, None if size in (0, 0xFFFFFFFF) else size


def wav_format(body: bytes, name: str) -> tuple[int, int]:
    """A WAV ``fmt `` chunk's (rate, channels); AudioError naming ``name`` unless it is 16-bit integer PCM."""
    if len(body) < 16:
        raise AudioError(f"{name}: a WAV fmt chunk of {len(body)} bytes (PCM's has 16)")
    form, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
    if form not in PCM_FORMATS or bits != 16:
        raise AudioError(f"{name}: WAV of format {form} with {bits}-bit samples; --stream reads 16-bit PCM "
                         "(sox ... -e signed -b 16)")
    if rate < 1 or channels < 1:
        raise AudioError(f"{name}: a WAV header of {rate} Hz and {channels} channels")
    return rate, channels


def pcm_pieces(f: BinaryIO, name: str, sample_rate: int) -> Iterator[np.ndarray]:
    """(n,) float32 pieces at ``sample_rate`` of 16-bit PCM read from ``f`` until it ends (or a WAV header's data
    does), each what a read gave (up to PIECE_SECONDS): raw mono at ``sample_rate``, or as a WAV header says
    (module docstring). A rate that cannot be resampled to ``sample_rate`` raises AudioError naming ``name``."""
    pending, rate, channels, left = wav_header(f, name)
    rate = rate or sample_rate
    convert = stream_resampler(rate, sample_rate, name)
    size, read = 2 * channels * round(PIECE_SECONDS * rate), getattr(f, "read1", f.read)
    while data := read(size if left is None else min(size, left)):
        left = None if left is None else left - len(data)
        pending += data
        whole = len(pending) // (2 * channels) * 2 * channels
        samples = np.frombuffer(pending[:whole], "<i2").reshape(-1, channels).mean(axis=1, dtype=np.float32) / 32768
        pending = pending[whole:]
        yield convert(torch.from_numpy(samples)).numpy() if convert else samples
    if convert:
        yield convert(torch.zeros(0), final=True).numpy()


def file_pieces(path: str, sample_rate: int) -> Iterator[np.ndarray]:
    """(n,) float32 pieces of PIECE_SECONDS of an audio file, mixed to mono and resampled to ``sample_rate`` as they
    are read (the file is never read whole: asr.data.sources.UtteranceAudio); a file that cannot be read, at its
    start or on the way, non-finite samples, or a rate that cannot be resampled to ``sample_rate`` raise AudioError
    naming it."""
    with UtteranceAudio(Utterance(Path(path), 0.0, "")) as audio:
        convert = stream_resampler(audio.rate, sample_rate, path)
        for samples in audio.pieces(round(PIECE_SECONDS * audio.rate)):
            yield convert(torch.from_numpy(samples)).numpy() if convert else samples
        if convert:
            yield convert(torch.zeros(0), final=True).numpy()


def paced(pieces: Iterable[np.ndarray], sample_rate: int, clock=time.monotonic, sleep=time.sleep
          ) -> Iterator[np.ndarray]:
    """``pieces`` at real speed: each once as much time has passed since the first as the audio up to its end lasts."""
    start, heard = clock(), 0
    for piece in pieces:
        heard += len(piece)
        sleep(max(0.0, start + heard / sample_rate - clock()))
        yield piece


class Printer:
    """Prints a stream's Updates to ``out`` as they come: finals always, partials when their text changed (an empty
    one never). ``kind`` "txt": ``partial|final<TAB>start<TAB>end<TAB>text`` (seconds from the stream's start);
    "jsonl": the JSON messages of asr.serve's protocol (Update.to_json)."""

    def __init__(self, kind: str, out: TextIO):
        self.kind, self.out, self.shown, self.finals = kind, out, "", 0

    def __call__(self, update: Update) -> None:
        if not update.final and update.text in ("", self.shown):
            return
        self.shown = "" if update.final else update.text
        self.finals += update.final
        if self.kind == "jsonl":
            line = json.dumps(update.to_json(), ensure_ascii=False)
        else:
            line = f"{'final' if update.final else 'partial'}\t{update.start:.2f}\t{update.end:.2f}\t{update.text}"
        print(line, file=self.out, flush=True)
