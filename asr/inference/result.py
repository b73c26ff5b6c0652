"""What a transcription gives back: a Result with its words, their times and confidences.

Word timings come from the objective's alignment of the decoded token ids against the model's
frames (CTC's: forced alignment, asr.models.ctc_decoding.align): each token gets the encoder
frames its path occupies. Sentencepiece marks the first piece of a word with "▁", so a word is a
run of tokens starting with such a piece. Times are seconds from the start of the audio
read (a manifest line's ``offset`` is not added), clipped to the duration.

CTC emits a token on one or a few frames (a "spike"), anywhere the model likes within its
receptive field: a word's spikes span one 40 ms frame of a 400 ms word, and a model that sees
far (a Conformer) may spike in the silence before the word. So the spikes only say which
stretch of speech is the word; its times come from the audio (``snap_to_speech``): speech is
where the loudness (``loudness``, 10 ms hops) rises well above the recording's quiet hops
(``speech_mask``), and a word takes the start and end of the speech its spikes mark, never
crossing its neighbours. Audio without quiet stretches (loud and quiet hops less than
MIN_RANGE_DB apart: noise throughout) keeps the spike times, ``start = first frame *
frame_seconds`` and ``end = (last frame + 1) * frame_seconds``. Against words of known times
(scripts/corpus/word_times.py; docs/benchmarks.md, "word times from the audio") the default
model's ends were off by 0.42 s on the spikes (early), by 0.045 s on the audio (means).
``confidence`` is the mean posterior of the word's aligned frames, in [0, 1].
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

import torch

from asr.audio import frame_samples
from asr.models.ctc_decoding import Span
from asr.tokenizer import WORD_START, Tokenizer

HOP_SECONDS = 0.01  # loudness resolution of word times
DIGITAL_SILENCE_DB = -90.0  # hops below this are zeros: before the first sound or after the last, padding
QUIET = 0.02  # the quantile of the hops that is the recording's quiet level: clean connected speech has few quiet hops
MIN_RANGE_DB = 15.0  # loudest and quietest hops (99th percentile, QUIET) closer than this: no silence to find
EARLY_SECONDS = 0.08  # a spike may come this long before the speech it stands for (a Conformer's come one frame early)
SHARE_SECONDS = 0.3  # a word without speech whose spikes end this close before the next speech shares it
CLOSURE_SECONDS = 0.05  # a quiet stretch this short between loud ones is speech (the closure of a stop, "six")


@dataclass(frozen=True)
class Word:
    word: str
    start: float  # seconds
    end: float  # seconds
    confidence: float  # mean posterior of its aligned frames, 0..1


@dataclass
class Result:
    """One utterance's transcription, or (``error`` set) why an input could not be transcribed."""

    audio_filepath: str | None  # None only for a manifest line that names no file
    duration: float  # seconds of audio transcribed
    text: str
    words: list[Word] = field(default_factory=list)
    reference: str = ""  # the manifest's text, if any
    offset: float | None = None  # the manifest line's offset, if it had one
    error: str = ""  # one line naming the file (and manifest line), e.g. "m.jsonl:4: missing audio file: a.wav"
    blank_share: float | None = None  # of the model's frames, the share whose most likely class is the blank

    def to_json(self) -> dict:
        """The JSONL row: audio_filepath, [offset], duration, text, words, [reference]; a failure's row
        is audio_filepath, [offset], error."""
        row = {"audio_filepath": self.audio_filepath}
        if self.offset is not None:
            row["offset"] = self.offset
        if self.error:
            return row | {"error": self.error}
        row |= {"duration": round(self.duration, 3), "text": self.text}
        if self.blank_share is not None:
            row["blank_share"] = round(self.blank_share, 3)
        row["words"] = [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3),
                         "confidence": round(w.confidence, 3)} for w in self.words]
        if self.reference:
            row["reference"] = self.reference
        return row


def confident(words: list[Word], min_confidence: float) -> list[Word]:
    """The words whose confidence is at least ``min_confidence``."""
    return [w for w in words if w.confidence >= min_confidence]


def words_of(spans: list[Span], tokenizer: Tokenizer, frame_seconds: float, duration: float,
             levels: torch.Tensor | None = None) -> list[Word]:
    """Group token spans into words (a piece starting with "▁" starts one); times in seconds.

    ``levels``: the audio's ``loudness``, to snap the words to (``snap_to_speech``); None keeps
    the spike times.
    """
    groups: list[list[Span]] = []
    for span in spans:
        if not groups or tokenizer.sp.id_to_piece(span.token).startswith(WORD_START):
            groups.append([])
        groups[-1].append(span)
    words = []
    for group in groups:
        text = tokenizer.decode([s.token for s in group]).strip()
        if not text:
            continue
        # a char tokenizer's "▁" is a token of its own, spiking in the pause before the word
        group = [s for s in group if tokenizer.sp.id_to_piece(s.token) != WORD_START] or group
        frames = sum(s.end - s.start for s in group)
        confidence = sum(s.score * (s.end - s.start) for s in group) / frames
        words.append(Word(text, group[0].start * frame_seconds, group[-1].end * frame_seconds, confidence))
    if levels is not None:
        words = snap_to_speech(words, levels, frame_seconds / hops_per_frame(frame_seconds))
    return [replace(w, start=min(w.start, duration), end=min(w.end, duration)) for w in words]


def hops_per_frame(frame_seconds: float) -> int:
    """Loudness values per encoder frame: hops of about HOP_SECONDS."""
    return max(1, round(frame_seconds / HOP_SECONDS))


def loudness(samples: torch.Tensor, sample_rate: int, frame_seconds: float) -> torch.Tensor:
    """dB of ``samples`` (n,) in ``hops_per_frame`` equal hops of each encoder frame (the last padded
    with silence): (frames * hops,), hop h covering about [h, h + 1) * frame_seconds / hops."""
    step, hops = frame_samples(frame_seconds, sample_rate), hops_per_frame(frame_seconds)
    frames = -(-len(samples) // step)
    x = torch.nn.functional.pad(samples.float(), (0, frames * step - len(samples))).view(frames, step)
    x = x[:, : step // hops * hops].reshape(frames * hops, step // hops)
    return 10 * torch.log10(x.pow(2).mean(-1) + 1e-10)


def runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = [i for i in range(len(flags) + 1) if (i < len(flags) and flags[i]) != (i > 0 and flags[i - 1])]
    return list(zip(edges[::2], edges[1::2]))


def speech_mask(levels: torch.Tensor, hop_seconds: float) -> list[bool] | None:
    """Which hops are speech: runs over a low threshold that reach a high one (hysteresis), with
    quiet stretches up to CLOSURE_SECONDS inside speech filled; None when the loudest and quietest
    hops are less than MIN_RANGE_DB apart. Thresholds are relative to the quiet hops' level (of the
    whole file: a long recording whose noise changes gets one level), so a recording's gain and
    steady noise move them with it; digital silence before the first sound and after the last
    (padding) does not count, the pauses of clean audio do."""
    heard = torch.nonzero(levels > DIGITAL_SILENCE_DB)[:, 0]
    if len(heard) < 2:
        return None
    recording = levels[heard[0]: heard[-1] + 1]  # zero padding before and after would sit below any noise
    floor, peak = torch.quantile(recording, QUIET).item(), torch.quantile(recording, 0.99).item()
    span = peak - floor
    if span < MIN_RANGE_DB:
        return None
    low = (levels > floor + max(3.0, 0.1 * span)).tolist()
    high = (levels > floor + max(6.0, 0.3 * span)).tolist()
    mask = [False] * len(low)
    for a, b in runs(low):
        if any(high[a:b]):
            mask[a:b] = [True] * (b - a)
    for a, b in runs([not m for m in mask]):
        if 0 < a and b < len(mask) and (b - a) * hop_seconds <= CLOSURE_SECONDS:
            mask[a:b] = [True] * (b - a)
    return mask


def snap_to_speech(words: list[Word], levels: torch.Tensor, hop_seconds: float) -> list[Word]:
    """``words`` (spike times) moved onto the speech around them (module docstring); ``levels``
    are the audio's hops of ``hop_seconds``.

    A word spans the stretches of speech its spikes fall in or precede by up to EARLY_SECONDS
    or, if there are none, the nearest one, without crossing the previous word's end or the
    next word's first spike. A word with no speech before the next word's spike, whose spikes end
    at most SHARE_SECONDS before the next speech (a model that emitted a phrase early), shares the
    next word's stretch, split by letters; any other word without speech keeps its times.
    """
    mask = speech_mask(levels, hop_seconds) if words and len(levels) else None
    if mask is None:
        return words
    speech, n = runs(mask), len(mask)
    early, share = round(EARLY_SECONDS / hop_seconds), round(SHARE_SECONDS / hop_seconds)
    starts, ends = [a for a, _ in speech], [b for _, b in speech]

    def hop(t: float) -> int:
        return min(n, max(0, round(t / hop_seconds)))

    snapped, waiting, lo = [], [], 0  # waiting: words sharing the next word's speech; lo: the previous word's end
    for k, word in enumerate(words):
        if word.start >= n * hop_seconds:  # past the audio measured (a model with more frames than it)
            snapped += waiting + [word]
            waiting = []
            continue
        hi = hop(words[k + 1].start) if k + 1 < len(words) else n  # the next word's first spike
        first, last = max(hop(word.start), lo), max(hop(word.end), hop(word.start) + 1)
        after = bisect.bisect_right(ends, lo)  # the first stretch of speech ending after the previous word
        near = [(max(a, lo), min(b, hi)) for a, b in speech[after:bisect.bisect_left(starts, hi)]]
        hit = [(a, b) for a, b in near if a < last + early and first < b]
        if not hit and near:
            hit = [min(near, key=lambda r: max(r[0] - last, first - r[1]))]
        if not hit:
            if k + 1 < len(words) and after < len(speech) and starts[after] - last <= share:
                waiting.append(word)
            else:
                snapped += waiting + [word]
                waiting, lo = [], max(lo, min(hop(word.end), hi))
            continue
        start, end = hit[0][0], hit[-1][1]
        if end - start < len(waiting) + 1:  # too short to share a hop each: the waiting words keep their times
            snapped, waiting = snapped + waiting, []
        letters = [len(w.word) for w in waiting + [word]]
        cuts = [start + round((end - start) * sum(letters[:i]) / sum(letters)) for i in range(len(letters) + 1)]
        for i in range(1, len(cuts)):  # at least one hop each, the last word to the stretch's end
            cuts[i] = max(cuts[i], cuts[i - 1] + 1) if i < len(cuts) - 1 else end
        for i in range(len(cuts) - 2, 0, -1):
            cuts[i] = min(cuts[i], cuts[i + 1] - 1)
        snapped += [replace(w, start=a * hop_seconds, end=b * hop_seconds)
                    for w, a, b in zip(waiting + [word], cuts, cuts[1:])]
        waiting, lo = [], end
    return snapped
