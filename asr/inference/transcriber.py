"""The Transcriber: audio files, folders and manifest lines in, ``Result``s out, with a checkpoint written by
asr.fit (or a .pt2 of asr.export). ``python -m asr.transcribe`` (asr.inference.transcribing) is its command line.

    from asr.transcribe import Transcriber          # or from asr.inference.transcriber
    t = Transcriber.from_checkpoint("last.ckpt")
    t.transcribe(["a.flac", "b.wav"])                # -> ["text a", "text b"]
    t.transcribe_results(["a.flac"])[0].words         # -> [Word("call", 0.32, 0.56, 0.97), ...]
    for update in t.stream(pieces): ...               # a streaming model: partial and final Updates as audio comes

Files up to ``chunk_seconds`` long are batched by length (up to ``max_batch_seconds`` of padded audio);
batching does not change a transcript, but for a model with ``model.features.quiet_db`` (the default's), whose
line a batch's padding moves (docs/transcription.md, "No words on non-speech"). A file whose decoded speech spans
under ``second_pass`` of it is run again with the statistics of that span (asr.inference.focus). Longer files are
read and run in overlapping chunks and decoded from the stitched frames in bounded memory (asr.inference.longform).
Word times come from the objective's forced alignment (CTC's; a transducer's Viterbi path,
asr.models.transducer_decoding) snapped to the speech in the audio, confidences from the alignment (asr.inference.result). A streaming model
(--model.encoder.streaming) also transcribes audio as it arrives:
``stream`` and ``open_stream`` (asr.inference.streaming). A failed file gives a Result with ``error`` set, or raises TranscriptionError with
``on_error="stop"``. The checkpoint is loaded with ``torch.load(weights_only=True)``: no pickled code runs.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from asr.audio import AudioError, frame_samples, resample
from asr.data import manifest as mf
from asr.data.sampler import BucketBatchSampler
from asr.data.sources import read_utterance
from asr.inference.acoustic import CheckpointError  # noqa: F401  (Transcriber.from_checkpoint raises it: importable here)
from asr.inference.acoustic import AcousticModel, CheckpointModel, load_model
from asr.inference.focus import SECOND_PASS, speech_span
from asr.inference.inputs import check_all, failed, in_order
from asr.inference.longform import read_frames, segments, stitched
from asr.inference.result import Result, Word, confident, hops_per_frame, loudness, words_of
from asr.inference.streaming import (ENDPOINT_SECONDS, MAX_SEGMENT_SECONDS, Session, StreamingModel, Update, chunk_frames,
                                     streaming_model)
from asr.models.ctc_decoding import Decoder
from asr.models.objectives import CTC, Decoding
from asr.train.module import ASRModule

WINDOW_BATCHES = 16  # short files are batched within windows of this many batches, kept in input order
ON_ERROR = ("continue", "stop")
class TranscriptionError(ValueError):
    """An input that cannot be transcribed, with on_error="stop"; the message names the file (and line)."""


class Transcriber:
    """A model ready to transcribe: ``Transcriber.from_checkpoint(path).transcribe(paths)``.

    Args:
        model: an AcousticModel, or an ASRModule (wrapped in CheckpointModel on ``device``).
        device: where an ASRModule runs; an AcousticModel places itself.
        max_batch_seconds: padded audio per model call (short files, or chunks of a long one).
        decoder: (frames (B, T', *), lengths (B,)) -> token ids per utterance; the model's objective's
            (greedy) by default.
        chunk_seconds: files longer than this are run in overlapping chunks of it; 0 = never chunk.
        overlap_seconds: audio shared by neighbouring chunks; half of it is context on each side.
        min_confidence: words whose confidence (the mean posterior of their frames, 0..1) is below this are
            dropped from the words and the text; 0 keeps every word.
        second_pass: a file (or a long file's segment) whose decoded speech spans under this share of its
            frames is transcribed again with the statistics of that span (asr.inference.focus); 0 = one pass.
    """

    def __init__(self, model: AcousticModel | ASRModule, device: str | torch.device = "cpu",
                 max_batch_seconds: float = 120.0, decoder: Decoder | None = None, chunk_seconds: float = 30.0,
                 overlap_seconds: float = 4.0, min_confidence: float = 0.0, second_pass: float = SECOND_PASS):
        self.model = CheckpointModel(model, device) if isinstance(model, ASRModule) else model
        self.objective: Decoding = getattr(self.model, "objective", None) or CTC()  # word times, cut points
        if chunk_seconds and not 4 * self.model.frame_seconds <= overlap_seconds <= chunk_seconds / 2:
            raise ValueError(f"--overlap_seconds must be between 4 frames ({4 * self.model.frame_seconds:g} s) "
                             f"and half of --chunk_seconds ({chunk_seconds / 2:g} s), got {overlap_seconds:g}")
        self.max_batch_seconds, self.decoder = max_batch_seconds, decoder or self.objective.decode
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"--min_confidence must be between 0 and 1, got {min_confidence:g}")
        self.chunk_seconds, self.overlap_seconds = chunk_seconds, overlap_seconds
        self.min_confidence = min_confidence
        if not 0.0 <= second_pass <= 1.0:
            raise ValueError(f"--second_pass must be between 0 and 1, got {second_pass:g}")
        self.second_pass = second_pass
        self.statistics = "statistics" in inspect.signature(self.model.log_probs).parameters  # asr.inference.focus

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "cpu", **options) -> "Transcriber":
        """From a checkpoint of asr.fit or a model of asr.export (else CheckpointError); ``options`` as in
        the constructor."""
        return cls(load_model(path, device), device, **options)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def transcribe(self, paths: list[str | Path], on_error: str = "continue") -> list[str]:
        """Transcripts of the audio files ``paths``, in the same order; a file that cannot be transcribed
        gives "" and a warning naming it (``on_error="stop"``: TranscriptionError instead)."""
        return [r.text for r in self._warned(self.transcribe_results(paths, on_error))]

    def transcribe_utterances(self, utterances: list[mf.Utterance], on_error: str = "continue") -> list[str]:
        """Transcripts of manifest utterances (their text is ignored), in the same order; failures as in
        ``transcribe``."""
        return [r.text for r in self._warned(self.transcribe_results(utterances, on_error))]

    @staticmethod
    def _warned(results: list[Result]) -> list[Result]:
        for r in results:
            if r.error:
                warnings.warn(r.error, stacklevel=3)
        return results

    def transcribe_results(self, inputs: list[str | Path | mf.Utterance], on_error: str = "continue"
                           ) -> list[Result]:
        """Results (text, words with start/end/confidence, duration) of audio files or utterances, in order.

        An input that cannot be transcribed (missing, empty, not audio, corrupt) gives a Result whose
        ``error`` names it and the reason, and the others are transcribed; with ``on_error="stop"``
        the first such input raises TranscriptionError instead.
        """
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        utterances = [u if isinstance(u, mf.Utterance) else mf.Utterance(Path(u), 0.0, "", source=str(u))
                      for u in inputs]
        order, checked, _ = check_all(self.check, [(utt, "") for utt in utterances])
        unreadable = next((item for item in order if isinstance(item, Result)), None)
        if unreadable and on_error == "stop":
            raise TranscriptionError(unreadable.error)
        results = []
        for _, result in in_order(order, self.checked_results(checked)):
            if result.error and on_error == "stop":
                raise TranscriptionError(result.error)
            results.append(result)
        return results

    def check(self, utt: mf.Utterance) -> tuple[mf.Utterance | mf.Problem, dict]:
        """Read the audio's header: (the utterance with its real duration, or a Problem naming the file
        and reason; notes {"resampled", "stereo"}), as asr.data.manifest.check_audio."""
        return mf.check_audio(utt, self.sample_rate, "resample")

    def checked_results(self, checked: list[mf.Utterance], progress: Callable[[float], None] = lambda seconds: None
                        ) -> Iterator[tuple[int, Result]]:
        """(index, Result) for utterances that passed ``check``, in input order, each as soon as it can be.

        A file that fails while being read (corrupt or truncated data) gives a Result with ``error``;
        it never stops the others. ``progress(seconds)`` is called as audio is transcribed.
        """
        window, seconds = [], 0.0  # short utterances waiting to be batched, and their audio
        for i, utt in enumerate(checked):
            if self.chunk_seconds and utt.duration > self.chunk_seconds:
                yield from self._batched(checked, window, progress)
                window, seconds = [], 0.0
                yield i, self._long(utt, progress)
            else:
                window.append(i)
                seconds += utt.duration
                if seconds >= WINDOW_BATCHES * self.max_batch_seconds:
                    yield from self._batched(checked, window, progress)
                    window, seconds = [], 0.0
        yield from self._batched(checked, window, progress)

    def _load(self, utt: mf.Utterance) -> torch.Tensor | Result:
        """The utterance's samples at the model's rate (n,) float32, or a failed Result naming it."""
        try:
            samples, rate = read_utterance(utt)
        except AudioError as err:
            return failed(utt, str(err))
        return resample(torch.from_numpy(samples), rate, self.sample_rate)

    @torch.inference_mode()
    def _batched(self, checked: list[mf.Utterance], indices: list[int], progress) -> Iterator[tuple[int, Result]]:
        """Results of utterances ``checked[i] for i in indices``, batched by length, yielded in that order."""
        utts = [checked[i] for i in indices]
        results: dict[int, Result] = {}
        for batch_indices in BucketBatchSampler([u.duration for u in utts], self.max_batch_seconds, shuffle=False):
            loaded = {j: self._load(utts[j]) for j in batch_indices}
            results |= {j: r for j, r in loaded.items() if isinstance(r, Result)}
            audio = {j: a for j, a in loaded.items() if isinstance(a, torch.Tensor)}
            if audio:
                padded = torch.nn.utils.rnn.pad_sequence(list(audio.values()), batch_first=True)  # (B, n)
                log_probs, lengths = self.model.log_probs(padded, torch.tensor([len(a) for a in audio.values()]))
                hyps = self.decoder(log_probs, lengths)
                passes = {j: (log_probs[row, :n], ids, self.objective.align(log_probs[row, :n], ids), n)
                          for row, (j, ids, n) in enumerate(zip(audio, hyps, lengths.tolist()))}
                levels = {j: loudness(audio[j], self.sample_rate, self.model.frame_seconds) for j in audio}
                crops = {j: span for j, (frames, _, spans, n) in passes.items()
                         if (span := speech_span(spans, n, self.model.frame_seconds, self.second_pass, 0, levels[j]))}
                if crops:
                    again = self._again([audio[j] for j in crops], list(crops.values()))
                    for j, (frames, ids, first) in zip(crops, again):
                        passes[j] = (frames, ids, self.objective.align(frames, ids, first), passes[j][3])
                for j, (frames, ids, spans, n) in passes.items():
                    blank = self.objective.silent_frames(frames) + n - len(frames)  # frames not run again: blank
                    results[j] = self._result(utts[j], ids, spans, levels[j], blank / max(n, 1))
            progress(sum(utts[j].duration for j in batch_indices))
        for j, i in enumerate(indices):
            yield i, results[j]

    def _again(self, audio: list[torch.Tensor], crops: list[tuple[int, int]]
               ) -> list[tuple[torch.Tensor, list[int], int]]:
        """The second pass (asr.inference.focus) of utterances ``audio`` (n,) whose speech the first found on
        encoder frames ``crops`` [a, b): each whole with the features' statistics of those frames, where the model
        takes them, else those frames' audio alone. Per utterance: (log-probs (T', V), ids, its first frame)."""
        step = frame_samples(self.model.frame_seconds, self.sample_rate)
        if self.statistics:
            pieces, firsts = audio, [0] * len(audio)
            options = {"statistics": torch.tensor([[a * step, b * step] for a, b in crops])}
        else:
            pieces, firsts = [x[a * step: b * step] for x, (a, b) in zip(audio, crops)], [a for a, _ in crops]
            options = {}
        log_probs, lengths = self.model.log_probs(torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True),
                                                  torch.tensor([len(p) for p in pieces]), **options)
        hyps = self.decoder(log_probs, lengths)
        return [(log_probs[row, :n], ids, first)
                for row, (ids, n, first) in enumerate(zip(hyps, lengths.tolist(), firsts))]

    @torch.inference_mode()
    def _long(self, utt: mf.Utterance, progress) -> Result:
        """One utterance longer than chunk_seconds, in chunks (asr/inference/longform.py); unreadable: a failed Result."""
        batch_chunks = max(1, int(self.max_batch_seconds // self.chunk_seconds))
        pieces = stitched(self.model, utt, self.chunk_seconds, self.overlap_seconds, batch_chunks, progress)
        levels: list[torch.Tensor] = []  # the loudness of the pieces read: 0.4 kB per second of audio
        ids, spans, blank, frames = [], [], 0, 0
        try:
            length = round(self.chunk_seconds / self.model.frame_seconds)
            hops = hops_per_frame(self.model.frame_seconds)
            for first, log_probs in segments(heard(pieces, levels), length, self.objective.cut):
                segment_ids = self.decoder(log_probs[None], torch.tensor([len(log_probs)]))[0]
                segment_spans = self.objective.align(log_probs, segment_ids, first)
                n = len(log_probs)
                loud = None if segment_spans else torch.cat(levels)[first * hops: (first + n) * hops]  # nothing decoded
                span = speech_span(segment_spans, n, self.model.frame_seconds, self.second_pass, first, loud)
                if span:  # the segment read again, its speech's statistics (asr.inference.focus)
                    audio = read_frames(utt, first, n, self.model)
                    log_probs, segment_ids, offset = self._again([audio], [span])[0]
                    segment_spans = self.objective.align(log_probs, segment_ids, first + offset)
                ids += segment_ids
                spans += segment_spans
                blank += self.objective.silent_frames(log_probs) + n - len(log_probs)
                frames += n
        except AudioError as err:  # found mid-file: nothing of it is kept
            return failed(utt, str(err))
        return self._result(utt, ids, spans, torch.cat(levels), blank / max(frames, 1))

    def _result(self, utt: mf.Utterance, ids: list[int], spans, levels: torch.Tensor, blank_share: float) -> Result:
        """``levels``: the utterance's loudness (asr.inference.result), which its word times are snapped to."""
        tokenizer = self.model.tokenizer
        words = words_of(spans, tokenizer, self.model.frame_seconds, utt.duration, levels)
        text, words = self.confident(tokenizer.decode(ids), words)
        return Result(str(utt.audio_filepath), utt.duration, text, words, utt.text,
                      utt.offset if utt.has_offset else None, blank_share=blank_share)


    def confident(self, text: str, words: list[Word]) -> tuple[str, list[Word]]:
        """The text and words without the words under min_confidence (the text as decoded if none is dropped)."""
        if not self.min_confidence:
            return text, words
        kept = confident(words, self.min_confidence)
        return (text if len(kept) == len(words) else " ".join(w.word for w in kept)), kept

    def open_stream(self, chunk_seconds: float | None = None, endpoint_seconds: float = ENDPOINT_SECONDS,
                    max_segment_seconds: float = MAX_SEGMENT_SECONDS) -> Session:
        """A live transcription of a streaming model (asr.inference.streaming): ``session.feed(samples)`` as audio
        arrives, ``session.finish()`` at its end, each giving Updates. ``chunk_seconds``: audio per encoder step, a
        whole number of the model's frames (None: its model.encoder.chunk_frames); ``endpoint_seconds`` of silent
        frames after speech end a segment, ``max_segment_seconds`` bound one. ValueError for a model that cannot
        stream."""
        model = self.streaming_model
        return Session(self, model, chunk_frames(model, chunk_seconds), endpoint_seconds, max_segment_seconds)

    @functools.cached_property
    def streaming_model(self) -> StreamingModel:
        """The model as a StreamingModel (asr.inference.streaming), one for all of its streams, so that they can be
        stepped together (asr.inference.batched); ValueError for a model that cannot stream."""
        return streaming_model(self.model)

    def stream(self, pieces: Iterable[np.ndarray | torch.Tensor], chunk_seconds: float | None = None,
               endpoint_seconds: float = ENDPOINT_SECONDS, max_segment_seconds: float = MAX_SEGMENT_SECONDS
               ) -> Iterator[Update]:
        """Partial and final Updates (text, word times, confidences) of a stream of audio ``pieces`` ((n,) float32
        at the model's rate, any length) as they become known; the last final comes when ``pieces`` ends. The
        options are open_stream's."""
        session = self.open_stream(chunk_seconds, endpoint_seconds, max_segment_seconds)
        for piece in pieces:
            yield from session.feed(piece)
        yield from session.finish()


def heard(pieces: Iterator[tuple[torch.Tensor, torch.Tensor]], levels: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The log-probs of asr.inference.longform.stitched's (log-probs, loudness) pieces; their loudness goes to ``levels``."""
    for log_probs, piece_levels in pieces:
        levels.append(piece_levels)
        yield log_probs
