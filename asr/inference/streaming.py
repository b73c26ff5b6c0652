"""Live transcription: audio pieces in, partial and final results out, with a streaming model's caches carried
between chunks. ``Transcriber.stream`` and ``Transcriber.open_stream`` (asr.inference.transcriber) are the API:

    t = Transcriber.from_checkpoint("runs/demo-streaming/version_0/checkpoints/last.ckpt")
    for update in t.stream(pieces):      # pieces: float32 arrays at t.sample_rate, of any length
        print("final" if update.final else "partial", update.start, update.end, update.text)

    session = t.open_stream()            # push-style, for a server: updates as each piece is fed
    updates = session.feed(samples) + session.finish()

A Session feeds the model (``StreamingModel.stream_step``: asr.models.streaming.advance for a checkpoint) and
decodes the frames of the current *segment* with the Transcriber's decoder after every chunk, giving a partial
Update (text, word times, confidences) for each piece that completed a chunk. A segment ends in a final Update:
- at a pause: after it has tokens, when its last ``endpoint_seconds`` of frames are silent by the model's own
  non-speech detection (the objective's ``silent_frames``: for CTC, frames whose best class is the blank);
- past ``max_segment_seconds`` without such a pause, at the objective's ``cut`` (CTC: the middle of its longest
  run of blanks), so that memory stays bounded however long the speech;
- at the end of the stream.
Frames of a segment with no token yet are dropped as they come. The model's caches are fixed in size
(asr.models.streaming), a segment's frames and loudness are bounded by max_segment_seconds, so memory stays flat
over hours of audio. Greedy decoding of segments cut at silent frames gives the token ids of greedy decoding of
the whole stream, which are those of the same model run over the whole file at the same chunk (tests).

Word times are seconds from the stream's start: a final's are snapped to the speech in the segment's audio as in
batch transcription (asr.inference.result.words_of), a partial's are its tokens' frames; confidences are the mean
posterior of each word's frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from asr.audio import frame_samples
from asr.inference.batched import advance_streams
from asr.inference.result import Word, hops_per_frame, loudness, words_of
from asr.models import streaming
from asr.tokenizer import Tokenizer

if TYPE_CHECKING:
    from asr.inference.transcriber import Transcriber

ENDPOINT_SECONDS = 1.0  # silent frames after a token that end a segment (WeNet's runtime's rule for speech decoded)
MAX_SEGMENT_SECONDS = 30.0  # a segment without such a pause is cut at its best pause past this (longform's chunk)


@dataclass(frozen=True)
class Update:
    """What a stream knows of its current segment: ``final`` once the segment is closed (its text will not change),
    else a partial result. Times are seconds from the stream's start."""

    text: str
    words: list[Word]
    final: bool
    start: float  # the segment's first frame
    end: float  # the end of the audio decoded into it so far (a final's: where the segment was closed)
    ids: list[int] = field(default_factory=list)  # the segment's token ids, as decoded

    def to_json(self) -> dict:
        """The message of asr.serve's protocol (docs/streaming-protocol.md) and of --stream --format jsonl."""
        return {"type": "final" if self.final else "partial", "text": self.text, "start": round(self.start, 3),
                "end": round(self.end, 3), "words": [{"word": w.word, "start": round(w.start, 3),
                                                      "end": round(w.end, 3), "confidence": round(w.confidence, 3)}
                                                     for w in self.words]}


class StreamingModel(Protocol):
    """What a Session needs of a model (a checkpoint's, through NetworkStream, or your own)."""

    sample_rate: int
    frame_seconds: float
    tokenizer: Tokenizer
    chunk_frames: int  # encoder frames per chunk unless the caller chooses

    def start_stream(self) -> Any:
        """The state before a stream's first audio."""

    def stream_step(self, audio: torch.Tensor, state: Any, chunk: int, final: bool) -> tuple[torch.Tensor, Any]:
        """audio (n,) fp32 at sample_rate -> the frames (T', *) fp32 on the CPU of the chunks of ``chunk`` encoder
        frames it completes (``final``: and of the rest), and the state after it.

        A model may also have ``stream_steps(audios, states, chunks, finals)``: stream_step of several streams at
        once, a list of its results (NetworkStream's: one encoder step over all of them, asr.inference.batched);
        and ``samples_wanted(state, chunk)``: the samples the next chunk still needs (a server waits for them)."""


class NetworkStream:
    """StreamingModel of a checkpoint's network (asr.models.streaming.advance), on ``device``."""

    def __init__(self, network: torch.nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cpu"):
        self.network, self.tokenizer, self.device = network, tokenizer, torch.device(device)
        self.sample_rate, self.frame_seconds = network.sample_rate, network.frame_seconds
        self.chunk_frames = network.encoder.cfg.chunk_frames
        with torch.inference_mode():  # what a step that completes no chunk gives: no frames
            self.nothing = streaming.network_frames(network, torch.zeros(1, 0, network.encoder.d_model, device=device))[0]

    def start_stream(self) -> streaming.StreamState:
        return streaming.start(self.network, 1, self.device)

    @torch.inference_mode()
    def stream_step(self, audio: torch.Tensor, state: streaming.StreamState, chunk: int, final: bool
                    ) -> tuple[torch.Tensor, streaming.StreamState]:
        frames, state = streaming.advance(self.network, audio[None].to(self.device), state, chunk, final)
        return (self.nothing if frames is None else frames[0]).float().cpu(), state

    @torch.inference_mode()
    def stream_steps(self, audios: list[torch.Tensor], states: list[streaming.StreamState], chunks: list[int],
                     finals: list[bool]) -> list[tuple[torch.Tensor, streaming.StreamState]]:
        """stream_step of several streams, one encoder step over all that complete a chunk (asr.inference.batched)."""
        steps = advance_streams(self.network, [a[None].to(self.device) for a in audios], states, chunks, finals)
        return [((self.nothing if frames is None else frames[0]).float().cpu(), state) for frames, state in steps]

    def samples_wanted(self, state: streaming.StreamState, chunk: int) -> int:
        return streaming.samples_wanted(self.network, state, chunk)


def streaming_model(model: Any) -> StreamingModel:
    """The StreamingModel of a Transcriber's model: itself if it streams (has stream_step), a checkpoint's network
    through NetworkStream; anything else is refused with what to train instead."""
    if hasattr(model, "stream_step"):
        return model
    module = getattr(model, "module", None)  # asr.inference.acoustic.CheckpointModel
    if module is not None and streaming.streams(module.model):
        return NetworkStream(module.model, model.tokenizer, model.device)
    raise ValueError("this model cannot stream: it was not trained with --model.encoder.streaming true and "
                     "--model.features.norm global or running (configs/recipes/demo-streaming.yaml), or it is an exported .pt2")


CHUNK_FLAGS = "--stream_chunk of asr.transcribe --stream, --chunk_seconds of asr.serve, a start message's chunk_seconds"
MAX_CHUNK_SECONDS = 2.0  # the longest chunk a stream may ask for: a server's round steps every stream's chunk at
# once, so one stream's long chunk holds up the others (3600 s: an hour of audio kept, then one step); the models
# train at chunks up to model.encoder.max_chunk_frames (640 ms for the recipes), and a chunk is the latency


def chunk_frames(model: StreamingModel, chunk_seconds: float | None) -> int:
    """Encoder frames per chunk: ``chunk_seconds`` (a whole number of the model's frames, at most MAX_CHUNK_SECONDS),
    or the model's own. ValueError naming the flags that give it (CHUNK_FLAGS) for any other."""
    if chunk_seconds is None:
        if model.chunk_frames < 1:
            raise ValueError(f"model.encoder.chunk_frames is 0 (full context): give a chunk ({CHUNK_FLAGS})")
        return model.chunk_frames
    if not 0 < chunk_seconds <= MAX_CHUNK_SECONDS:  # also NaN and infinity
        raise ValueError(f"a chunk of {chunk_seconds!r} s ({CHUNK_FLAGS}) must be over 0 and at most "
                         f"{MAX_CHUNK_SECONDS:g} s")
    frames = chunk_seconds / model.frame_seconds
    if round(frames) < 1 or abs(frames - round(frames)) > 1e-6:
        raise ValueError(f"a chunk of {chunk_seconds:g} s ({CHUNK_FLAGS}) must be a whole number of the model's "
                         f"{model.frame_seconds:g} s frames")
    return round(frames)


class Session:
    """One stream being transcribed: ``feed(samples)`` as audio arrives, ``finish()`` at its end; each returns the
    Updates it produced (module docstring). Made by Transcriber.open_stream."""

    def __init__(self, transcriber: "Transcriber", model: StreamingModel, chunk: int,
                 endpoint_seconds: float = ENDPOINT_SECONDS, max_segment_seconds: float = MAX_SEGMENT_SECONDS):
        if not 0 < endpoint_seconds < float("inf"):  # also NaN
            raise ValueError(f"--endpoint_seconds (of asr.transcribe --stream and asr.serve) must be > 0 and finite, "
                             f"got {endpoint_seconds:g}")
        if not max_segment_seconds >= 2 * model.frame_seconds:
            raise ValueError(f"max_segment_seconds (Transcriber.open_stream's) must be at least 2 of the model's "
                             f"{model.frame_seconds:g} s frames, got {max_segment_seconds:g}")
        self.transcriber, self.model, self.chunk = transcriber, model, chunk
        self.endpoint = max(1, round(endpoint_seconds / model.frame_seconds))  # encoder frames
        self.longest = max(2, round(max_segment_seconds / model.frame_seconds))
        self.step, self.hops = frame_samples(model.frame_seconds, model.sample_rate), hops_per_frame(model.frame_seconds)
        self.state = model.start_stream()
        self.frames: torch.Tensor | None = None  # (T, *) the segment's frames
        self.ids: list[int] = []  # the segment's token ids as decoded
        self.first = 0  # the segment's first frame, counted from the stream's start
        self.levels = torch.zeros(0)  # loudness hops from the segment's first frame on (asr.inference.result)
        self.unheard = torch.zeros(0)  # samples after the last whole frame whose loudness is in levels
        self.samples = 0  # fed so far

    def feed(self, samples: np.ndarray | torch.Tensor) -> list[Update]:
        """The next audio, (n,) float at the model's rate; the Updates of the chunks it completed (maybe none)."""
        audio = self.heard(samples, final=False)
        frames, self.state = self.model.stream_step(audio, self.state, self.chunk, False)
        return self.decoded(frames, final=False)

    def finish(self) -> list[Update]:
        """The end of the stream: its last frames decoded, and the last segment's final Update if it has any text."""
        audio = self.heard(torch.zeros(0), final=True)
        frames, self.state = self.model.stream_step(audio, self.state, self.chunk, True)
        return self.decoded(frames, final=True)

    def heard(self, samples: np.ndarray | torch.Tensor, final: bool) -> torch.Tensor:
        """feed's first half (asr.inference.batched steps the model between the halves): the next audio (n,) float
        at the model's rate counted and its loudness kept (``final``: the stream's last); it, as (n,) float32."""
        audio = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
        self.samples += len(audio)
        self._hear(audio, final)
        return audio

    def decoded(self, frames: torch.Tensor, final: bool) -> list[Update]:
        """feed's (``final``: finish's) second half: the Updates of the model's new frames (T', *) (module docstring)."""
        return self._decode(frames, end=final) if final or len(frames) else []

    @property
    def seconds(self) -> float:
        """Audio fed so far."""
        return self.samples / self.model.sample_rate

    @property
    def wanted(self) -> int:
        """Samples the next chunk still needs (its model's samples_wanted; 0 if it cannot tell): feeding less
        gives no Update."""
        wanted = getattr(self.model, "samples_wanted", None)
        return wanted(self.state, self.chunk) if wanted else 0

    def _hear(self, audio: torch.Tensor, final: bool) -> None:
        """Extend the segment's loudness over the whole frames of audio fed (the last, partial one at the end)."""
        audio = torch.cat([self.unheard, audio])
        whole = len(audio) if final else len(audio) // self.step * self.step
        if whole:
            self.levels = torch.cat([self.levels, loudness(audio[:whole], self.model.sample_rate, self.model.frame_seconds)])
        self.unheard = audio[whole:]

    def _decode(self, frames: torch.Tensor, end: bool) -> list[Update]:
        """Add the new frames (T', *) to the segment a chunk at a time, so that pauses are found however the audio
        came, and say what it holds now: finals where it closed, then a partial of the rest (at the end of the
        stream: its final, if it has text)."""
        updates = []
        for at in range(0, len(frames), self.chunk):
            updates += self._extend(frames[at: at + self.chunk])
        if self.frames is None:
            self.frames = frames
        if end:
            return updates + ([self._close(len(self.frames), self.ids)] if self.ids else [])
        return updates + [self._update(self.frames, self.ids, final=False)]

    def _extend(self, frames: torch.Tensor) -> list[Update]:
        """One chunk's frames onto the segment; the finals of the segments it closed (module docstring)."""
        self.frames = frames if self.frames is None else torch.cat([self.frames, frames])
        finals = []
        while len(self.frames) > self.longest:  # no pause within max_segment_seconds: cut at the best one
            finals.append(self._close(self.transcriber.objective.cut(self.frames, self.longest // 2, self.longest)))
        self.ids = self._ids(self.frames)
        if not self.ids:  # nothing said yet: the frames are not kept (greedy decoding of what follows is the same)
            self._drop(len(self.frames))
        elif len(self.frames) >= self.endpoint and \
                self.transcriber.objective.silent_frames(self.frames[-self.endpoint:]) == self.endpoint:
            finals.append(self._close(len(self.frames), self.ids))
        return finals

    def _ids(self, frames: torch.Tensor) -> list[int]:
        return self.transcriber.decoder(frames[None], torch.tensor([len(frames)]))[0]

    def _close(self, cut: int, ids: list[int] | None = None) -> Update:
        """The final Update of the segment's first ``cut`` frames, which leave it."""
        frames = self.frames[:cut]
        final = self._update(frames, self._ids(frames) if ids is None else ids, final=True)
        self._drop(cut)
        return final

    def _drop(self, cut: int) -> None:
        """The segment's first ``cut`` frames leave it (``ids`` are the caller's to renew if any frames remain)."""
        self.frames, self.levels = self.frames[cut:], self.levels[cut * self.hops:]
        self.first, self.ids = self.first + cut, []

    def _update(self, frames: torch.Tensor, ids: list[int], final: bool) -> Update:
        """An Update of the segment's first len(frames) frames, decoded as ``ids``; a final's words are snapped to the
        speech, a partial's keep their tokens' frames (snapping every chunk cost more than the model's step)."""
        seconds, offset = len(frames) * self.model.frame_seconds, self.first * self.model.frame_seconds
        spans = self.transcriber.objective.align(frames, ids) if ids else []
        words = words_of(spans, self.model.tokenizer, self.model.frame_seconds, seconds,
                         self.levels[: len(frames) * self.hops] if final else None)
        text, words = self.transcriber.confident(self.model.tokenizer.decode(ids), words)
        words = [Word(w.word, w.start + offset, w.end + offset, w.confidence) for w in words]
        return Update(text, words, final, offset, offset + seconds, ids)
