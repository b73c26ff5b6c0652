"""A second pass on the speech the first pass found, for files that hold much non-speech around it.

Each utterance's features are normalised by the mean and variance of its own frames (asr.audio.normalise).
Seconds of noise, hum, tones or clicks around the speech move those statistics, the speech is seen at another
scale than in training, and its words are deleted (a call that opens on a dial tone, a chunk of a long file
that starts in a pause). The model itself says where the speech is: the frames from its first decoded token to
its last. Where that span, widened by ``MARGIN_SECONDS`` on each side, is under ``second_pass`` of the file's
frames, the Transcriber runs the model again: on the whole file with the statistics of the span's frames alone,
where the model takes them (``statistics`` of the ``log_probs`` of a checkpoint or an exported model), else on the
span's audio alone (a model of your own, or a file of asr.export's format version 1); the frames outside the
span count as blank then.

Speech that fills its file is run once, and so is a file in which the first pass decoded nothing: words the
first pass lost entirely are not found again. In a long file, each segment (cut at the first pass's pauses,
asr.inference.longform) is a file here. Measured (docs/benchmarks.md, 2026-11-27 afternoon): the default
model's WER on data/mini's dev set with 4 s of white noise a side 0.345 -> 0.164, hum 0.382 -> 0.091, DTMF
0.455 -> 0.173; speech alone, the bundled test set and the held-out sets within a word of one pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from asr.inference.result import Span

MARGIN_SECONDS = 0.3  # kept on each side of the first pass's first and last token (0.6 and 1.0 s did no better)
SECOND_PASS = 0.6  # the default share of the file's frames below which the span is run again; at 1.0 (any span
# short of the file) speech alone lost 2 words of 110 on data/mini's dev set, at 0.6 none (benchmarks.md)


def speech_span(spans: Sequence[Span], frames: int, frame_seconds: float, second_pass: float,
                first_frame: int = 0) -> tuple[int, int] | None:
    """Frames [a, b) of an utterance of ``frames`` frames (counted from ``first_frame``) to run again: from its
    first token's to its last token's, widened by MARGIN_SECONDS; None where no token was decoded or the
    span is not under ``second_pass`` of the frames (0: never)."""
    if not spans or not second_pass:
        return None
    margin = round(MARGIN_SECONDS / frame_seconds)
    a = max(0, spans[0].start - first_frame - margin)
    b = min(frames, spans[-1].end - first_frame + margin)
    return (a, b) if b - a < second_pass * frames else None
