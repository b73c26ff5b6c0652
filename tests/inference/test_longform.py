"""Long recordings (asr/inference/longform.py): the chunk plan, stitched log-probs that equal one pass,
cuts at pauses, and memory that does not grow with the file.

ToneModel (tests/tones.py) is frame-local, so chunked and one-pass decoding of its audio must
agree exactly; a tiny real checkpoint checks the frame bookkeeping of an actual encoder.
"""

from __future__ import annotations

import collections
import itertools
import random
import re
import sys

import numpy as np
import pytest
import soundfile
import torch

from asr.audio import AudioError, frame_samples
from asr.data import manifest as mf
from asr.inference.acoustic import load_model
from asr.inference.longform import chunk_starts, segments, stitched
from asr.inference.result import hops_per_frame, loudness
from asr.inference.transcriber import Transcriber
from asr.models.ctc_decoding import blank_cut, greedy
from asr.models.objectives import CTC
from asr.tokenizer import BLANK_ID
from tests.conftest import TEXTS, sine
from tests.tones import RATE, ToneModel, tones


def test_chunk_plan_covers_the_file_with_the_overlap_and_ends_at_its_end():
    assert chunk_starts(50, chunk=75, overlap=25) == [0]
    starts = chunk_starts(300, chunk=75, overlap=25)
    assert starts == [0, 50, 100, 150, 200, 225]
    assert all(b - a <= 75 - 25 for a, b in zip(starts, starts[1:])) and starts[-1] + 75 == 300


def test_chunked_decoding_of_a_short_file_equals_one_pass(tone_file, char_tokenizer):
    """ToneModel is frame-local, so the stitched frames must equal one pass exactly (up to float
    round-off of the FFT, 1e-5); a real model's chunks differ slightly through normalisation and
    context, which the module docstring of asr.inference.longform discusses."""
    path, words, _ = tone_file("twelve.flac", TEXTS * 2)
    model = ToneModel(char_tokenizer)
    one_pass = Transcriber(model, chunk_seconds=0).transcribe_results([path])[0]
    chunked = Transcriber(model, chunk_seconds=3.0, overlap_seconds=1.0).transcribe_results([path])[0]
    assert one_pass.duration > 12 and one_pass.text == " ".join(words)
    assert chunked.text == one_pass.text
    assert [(w.word, w.start, w.end) for w in chunked.words] == [(w.word, w.start, w.end) for w in one_pass.words]
    utt = mf.Utterance(path, one_pass.duration, "")
    pieces = list(stitched(model, utt, 3.0, 1.0, batch_chunks=2))
    audio = torch.from_numpy(soundfile.read(path, dtype="float32")[0])[None]
    whole, _ = model.log_probs(audio, torch.tensor([audio.shape[1]]))
    torch.testing.assert_close(torch.cat([log_probs for log_probs, _ in pieces]), whole[0], atol=1e-5, rtol=0)
    # each piece's loudness is its frames' (hops_per_frame a frame), laid end to end as the whole file's
    levels = loudness(audio[0], RATE, model.frame_seconds)[: len(whole[0]) * hops_per_frame(model.frame_seconds)]
    torch.testing.assert_close(torch.cat([piece_levels for _, piece_levels in pieces]), levels)


def test_chunks_of_a_real_model_stitch_to_the_frames_of_one_pass(checkpoint, write_audio):
    path = write_audio("seven.flac", 7.0)
    model = load_model(checkpoint)
    pieces = [log_probs for log_probs, _ in stitched(model, mf.Utterance(path, 7.0, ""), 2.0, 0.5, batch_chunks=2)]
    audio = torch.from_numpy(soundfile.read(path, dtype="float32")[0])[None]
    _, lengths = model.log_probs(audio, torch.tensor([audio.shape[1]]))
    assert len(pieces) == len(chunk_starts(175, 50, 12)) and sum(len(p) for p in pieces) == int(lengths[0])
    assert isinstance(Transcriber(model, chunk_seconds=2.0, overlap_seconds=0.5).transcribe([path])[0], str)


def test_a_long_file_that_fails_on_the_way_is_named_by_its_line_and_file(tmp_path, char_tokenizer):
    """Read in chunks, a long file's errors are read_utterance's (asr.data.sources): a file cut short since its line
    was checked is said to be (not blamed on the model's frame_seconds, as it was), and corrupt data mid-file is a
    failed Result naming the manifest line and the file (it named only the line)."""
    model = ToneModel(char_tokenizer)
    short = tmp_path / "short.wav"
    soundfile.write(short, np.zeros(3 * RATE, np.float32), RATE)
    with pytest.raises(AudioError) as cut:
        list(stitched(model, mf.Utterance(short, 6.0, "", source="m.jsonl:3"), 2.0, 0.5, batch_chunks=2))
    assert str(cut.value) == (f"m.jsonl:3: {short}: holds 3.000 s, 6.000 s expected (its line, or its header at "
                              "start-up): cut short since it was listed")
    corrupt = tmp_path / "corrupt.flac"
    soundfile.write(corrupt, sine(5.0, RATE), RATE, subtype="PCM_16")
    data = corrupt.read_bytes()
    corrupt.write_bytes(data[: len(data) // 2] + b"\xff" * 2000 + data[len(data) // 2 + 2000:])
    result = Transcriber(model, chunk_seconds=2.0, overlap_seconds=0.5).transcribe_results(
        [mf.Utterance(corrupt, 5.0, "", source="m.jsonl:4")])[0]
    assert result.error.startswith(f"m.jsonl:4: {corrupt}: cannot read audio (")


@pytest.fixture
def one_thread():
    """Many small FFTs: on a shared 2-core machine, thread hand-offs cost more than they give."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def peak_rss_growth(run) -> tuple[int, object]:
    """Bytes the process's peak resident memory rose by while run() ran (Linux: clear_refs resets the peak)."""
    status = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    value = run()
    return status("VmHWM") - before, value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_a_ten_minute_file_transcribes_exactly_in_bounded_memory(tmp_path, char_tokenizer, one_thread):
    """Peak memory must not grow with the file's length: after a one-minute file has warmed up the
    allocator, a ten-minute one may raise the peak by much less than its samples would take."""
    transcriber = Transcriber(ToneModel(char_tokenizer), max_batch_seconds=5, chunk_seconds=5, overlap_seconds=1)
    growth = {}
    for minutes in (1, 10):
        path, sentences = tmp_path / f"{minutes}.flac", []
        with soundfile.SoundFile(path, "w", RATE, 1, format="FLAC") as f:
            while f.frames < minutes * 60 * RATE:
                sentences.append(TEXTS[len(sentences) % len(TEXTS)])
                f.write(tones(char_tokenizer, sentences[-1])[0])
        growth[minutes], results = peak_rss_growth(lambda: transcriber.transcribe_results([path]))
        assert results[0].text == " ".join(sentences)  # no word lost or doubled at the chunk borders
    whole_file = 600 * RATE * 4  # bytes of ten minutes of samples as float32: reading it at once
    assert growth[10] < whole_file / 8, f"peak memory grew by {growth} bytes for a {whole_file / 1e6:.0f} MB file"


def one_hot_log_probs(classes: list[int], vocab: int = 8) -> torch.Tensor:
    """(T', V) log-probs whose best class at frame t is ``classes[t]``."""
    return (torch.nn.functional.one_hot(torch.tensor(classes), vocab) * 6.0).log_softmax(-1)


def test_chunk_starts_are_whole_frames_of_whole_samples():
    assert frame_samples(0.04, 16000) == 640 and frame_samples(0.08, 8000) == 640
    with pytest.raises(ValueError, match="frame_seconds 0.0401 is not a whole number of samples at 16000 Hz"):
        frame_samples(0.0401, 16000)


def test_a_cut_falls_in_the_middle_of_the_longest_pause():
    classes = [1, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4]  # pauses: frames 1-2, 4-8 (the longest), 10
    log_probs = one_hot_log_probs(classes)
    assert blank_cut(log_probs, 0, len(classes)) == 6
    assert blank_cut(log_probs, 0, 4) == 2  # the window sees only the first pause: its middle, rounded up
    log_probs[:, BLANK_ID] = torch.linspace(-9, -5, len(classes))  # no frame is best blank: the likeliest
    assert blank_cut(log_probs, 0, 5) == 4


def test_segments_cover_every_frame_once_cut_at_pauses_and_decode_as_the_whole():
    rng, classes = random.Random(0), []
    while len(classes) < 1000:  # words of 1-6 tokens, pauses of 1-12 frames
        classes += [rng.randint(1, 7) for _ in range(rng.randint(1, 6))] + [BLANK_ID] * rng.randint(1, 12)
    log_probs = one_hot_log_probs(classes)
    pieces = torch.split(log_probs, 75)  # as stitched hands them out, one per chunk
    cut = list(segments(pieces, length=100))
    assert [first for first, _ in cut] == [0] + list(itertools.accumulate(len(s) for _, s in cut))[:-1]
    assert all(50 <= len(s) <= 100 for _, s in cut[:-1]) and 0 < len(cut[-1][1]) <= 100
    torch.testing.assert_close(torch.cat([s for _, s in cut]), log_probs, rtol=0, atol=0)
    assert all(classes[first] == BLANK_ID for first, _ in cut[1:])  # never inside a word
    whole = greedy(log_probs[None], torch.tensor([len(classes)]))[0]
    assert [t for _, s in cut for t in greedy(s[None], torch.tensor([len(s)]))[0]] == whole


def test_word_times_cut_points_and_silence_come_from_the_models_objective(tone_file, char_tokenizer):
    """The objective seam (issue 40): the Transcriber asks ``model.objective`` (CTC's when the model has none) to
    decode, align, count silent frames and cut long recordings; an objective of another kind plugs in there."""
    class Counting:
        """CTC, counting which of its methods are asked for."""

        def __init__(self):
            self.ctc, self.calls = CTC(), collections.Counter()

        def __getattr__(self, name):
            self.calls[name] += 1
            return getattr(self.ctc, name)

    path, words, _ = tone_file("twelve.flac", TEXTS * 2)
    plain = Transcriber(ToneModel(char_tokenizer), chunk_seconds=3.0, overlap_seconds=1.0).transcribe_results([path])[0]
    model = ToneModel(char_tokenizer)
    model.objective = Counting()
    counted = Transcriber(model, chunk_seconds=3.0, overlap_seconds=1.0).transcribe_results([path])[0]
    assert counted.text == plain.text == " ".join(words) and counted.blank_share == plain.blank_share
    assert all(model.objective.calls[name] > 0 for name in ("decode", "align", "silent_frames", "cut"))
