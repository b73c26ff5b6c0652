"""A second pass on the speech the first pass found, for files that hold much non-speech around it.

Each utterance's features are normalised by the mean and variance of its own frames (asr.models.features.normalise).
Seconds of noise, hum, tones or clicks around the speech move those statistics, the speech is seen at another
scale than in training, and its words are deleted (a call that opens on a dial tone, a chunk of a long file
that starts in a pause). The model itself says where the speech is: the frames from its first decoded token to
its last. Where that span, widened by ``MARGIN_SECONDS`` on each side, is under ``second_pass`` of the file's
frames, the Transcriber runs the model again: on the whole file with the statistics of the span's frames alone,
where the model takes them (``statistics`` of the ``log_probs`` of a checkpoint or an exported model), else on the
span's audio alone (a model of your own, or a file of asr.export's format version 1); the frames outside the
span count as blank then.

Where the first pass decoded nothing (a model trained with every frame in its statistics, the Czech recipe's,
deletes all of speech framed by seconds of silence), the loud part of the file stands for the speech: from the
first to the last stretch that asr.inference.result.speech_mask calls speech. A file of one level (silence,
steady noise, hum, a dial tone) has none, and speech that fills its file is run once. In a long file, each
segment (cut at the first pass's pauses, asr.inference.longform) is a file here. What it gains with noise, hum,
tones or silence around speech, and costs without: docs/benchmarks.md, 2026-11-27 afternoon and evening.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asr.inference.result import hops_per_frame, speech_mask
from asr.models.ctc_decoding import Span

MARGIN_SECONDS = 0.3  # kept on each side of the first pass's first and last token (0.6 and 1.0 s did no better)
SECOND_PASS = 0.6  # the default share of the file's frames below which the span is run again; at 1.0 (any span
# short of the file) speech alone lost 2 words of 110 on data/mini's dev set, at 0.6 none (benchmarks.md)


def speech_span(spans: Sequence[Span], frames: int, frame_seconds: float, second_pass: float,
                first_frame: int = 0, levels: torch.Tensor | None = None) -> tuple[int, int] | None:
    """Frames [a, b) of an utterance of ``frames`` frames (counted from ``first_frame``) to run again: from its
    first token's to its last token's, or, where no token was decoded, from the first to the last loud stretch
    of ``levels`` (its loudness, asr.inference.result), widened by MARGIN_SECONDS; None where there is neither or
    the span is not under ``second_pass`` of the frames (0: never)."""
    if not second_pass:
        return None
    if spans:
        a, b = spans[0].start - first_frame, spans[-1].end - first_frame
    elif levels is None or not (loud := loud_span(levels, frame_seconds)):
        return None
    else:
        a, b = loud
    margin = round(MARGIN_SECONDS / frame_seconds)
    a, b = max(0, a - margin), min(frames, b + margin)
    return (a, b) if b - a < second_pass * frames else None


def loud_span(levels: torch.Tensor, frame_seconds: float) -> tuple[int, int] | None:
    """Encoder frames [a, b) from the first to the last hop of ``levels`` that asr.inference.result.speech_mask
    calls speech; None where it finds none (a file of one level: silence, steady noise, hum, a tone)."""
    hops = hops_per_frame(frame_seconds)
    mask = speech_mask(levels, frame_seconds / hops)
    if not mask or not any(mask):
        return None
    loud = [i for i, m in enumerate(mask) if m]
    return loud[0] // hops, loud[-1] // hops + 1
