"""Long recordings in bounded memory: overlapping chunks, stitched log-probs, decoding at pauses.

A file longer than ``chunk_seconds`` is never read whole. It is cut into chunks of
``chunk_seconds`` that overlap by ``overlap_seconds``; each chunk is read from disk on its
own (asr.data.sources.UtteranceAudio: the file opened once, read chunk by chunk), run
through the model (several chunks per batch), and only its central encoder frames are kept:
neighbouring chunks meet at the middle of their overlap, so every kept frame saw at least
``overlap_seconds / 2`` of audio on each side (file edges aside). Chunk starts are whole
encoder frames, so a chunk's frame ``j`` is the file's frame ``start + j`` and the stitched
sequence has exactly the frames one pass over the whole file would give. The last chunk is
pulled back to end at the file's end, so it is a full chunk too.

What differs from one pass over the whole file, and why it is small:
- features are normalised per utterance (asr/models/features.py): here per chunk, i.e. over 30 s of
  audio by default, which estimates each bin's mean and variance as well as the whole file;
- positions: the model's sinusoidal positions restart in every chunk, which keeps them in
  the range training saw (training utterances are at most ``data.filter.max_duration`` long);
- attention: with ``attention_window`` (the default config: 4 frames either side, 4 layers,
  so a frame sees about 0.7 s either way) the 2 s of context on each side of a kept frame
  covers the model's whole reach; a global-attention model sees 30 s instead of the file.

The stitched frames are decoded in segments cut in the middle of the longest run of blank
frames (a pause) in each window of ``chunk_seconds``, so memory stays bounded however long
the file is (log-probs, decoder and forced alignment only ever hold one segment) and a cut
never falls inside a word. Greedy decoding of the segments gives exactly the tokens of
greedy decoding of the whole sequence; an LM decoder loses its context at the cuts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import torch

from asr.audio import frame_samples, resample
from asr.data.manifest import Utterance
from asr.data.sources import UtteranceAudio
from asr.inference.result import loudness
from asr.models.ctc_decoding import blank_cut


def chunk_starts(frames: int, chunk: int, overlap: int) -> list[int]:
    """First encoder frame of each chunk for a file of ``frames`` frames; chunks of ``chunk``
    frames overlapping by at least ``overlap``; the last chunk ends at the file's end."""
    if frames <= chunk:
        return [0]
    starts = list(range(0, frames - chunk, chunk - overlap))
    return starts + [frames - chunk]


def read_frames(utt: Utterance, first: int, count: int, model) -> torch.Tensor:
    """The audio of the utterance's encoder frames [first, first + count) at the model's rate, (n,) float32;
    audio that cannot be read raises AudioError naming it (asr.data.sources.read_utterance's wording)."""
    with UtteranceAudio(utt) as audio:
        step = frame_samples(model.frame_seconds, model.sample_rate)
        return frames_audio(audio, first, count, model.sample_rate, step)


def frames_audio(audio: UtteranceAudio, first: int, count: int, rate: int, step: int) -> torch.Tensor:
    """The audio of encoder frames [first, first + count) (``step`` samples each at ``rate``) of the open
    utterance ``audio``, up to its duration's end, resampled from the file's rate to ``rate``: (n,) float32."""
    total = round(audio.utt.duration * rate)  # samples at ``rate``
    begin, length = first * step, min(count * step, total - first * step)
    samples = audio.read(round(begin * audio.rate / rate), round(length * audio.rate / rate))
    return resample(torch.from_numpy(samples), audio.rate, rate)


def stitched(model, utt: Utterance, chunk_seconds: float, overlap_seconds: float, batch_chunks: int,
             on_progress: Callable[[float], None] = lambda seconds: None
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The utterance's log-probs (T', V) as consecutive pieces, one per chunk (see the module docstring),
    each with the loudness of its frames' audio (asr.inference.result.loudness: hops_per_frame values per frame).

    ``model`` is an acoustic model (asr.inference.acoustic.AcousticModel); ``batch_chunks`` chunks run per call.
    ``on_progress(seconds)`` is called with the audio seconds of each batch once it is done.
    """
    rate, step = model.sample_rate, frame_samples(model.frame_seconds, model.sample_rate)
    chunk, overlap = round(chunk_seconds / model.frame_seconds), round(overlap_seconds / model.frame_seconds)
    with UtteranceAudio(utt) as reader:
        starts = chunk_starts(math.ceil(round(utt.duration * rate) / step), chunk, overlap)
        kept_from = 0  # first frame not yet handed out
        for b in range(0, len(starts), batch_chunks):
            done = kept_from
            batch = starts[b: b + batch_chunks]
            audio = [frames_audio(reader, s, chunk, rate, step) for s in batch]
            lengths = torch.tensor([len(a) for a in audio])
            log_probs, out_lengths = model.log_probs(torch.nn.utils.rnn.pad_sequence(audio, batch_first=True), lengths)
            for i, start in enumerate(batch):
                end = start + int(out_lengths[i])  # frames [start, end) of the file
                following = starts[b + i + 1] if b + i + 1 < len(starts) else None
                if following is not None and end < following:
                    raise ValueError(f"{utt.source}: the model gave {end - start} frames for a chunk of {chunk}: "
                                     "its frame_seconds does not match its output")
                meet = end if following is None else (following + end) // 2  # the middle of the overlap
                kept = audio[i][(kept_from - start) * step: (meet - start) * step]
                yield log_probs[i, kept_from - start: meet - start], loudness(kept, rate, model.frame_seconds)
                kept_from = meet
            on_progress((kept_from - done) * model.frame_seconds)


def segments(pieces: Iterable[torch.Tensor], length: int,
             cut_at: Callable[[torch.Tensor, int, int], int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Consecutive log-prob pieces re-cut into segments of length/2 to ``length`` frames at pauses (``cut_at``,
    the objective's cut; CTC's is ``blank_cut``); the last may be shorter. Yields (first frame, (T, V) log-probs)."""
    cut_at = cut_at or blank_cut
    pending, first = None, 0
    for piece in pieces:
        pending = piece if pending is None else torch.cat([pending, piece])
        while len(pending) > length:
            cut = cut_at(pending, length // 2, length)
            yield first, pending[:cut]
            pending, first = pending[cut:], first + cut
    if pending is not None and len(pending):
        yield first, pending
