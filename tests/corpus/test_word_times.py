"""scripts/corpus/word_times.py: words of known times, and the errors it reports against them."""

from __future__ import annotations

import re
import shutil

import pytest

from asr.inference.result import Word
import scripts.corpus.word_times as bench

needs_synths = pytest.mark.skipif(not all(shutil.which(t) for t in ("flite", "espeak-ng", "sox")),
                                  reason="needs flite, espeak-ng and sox")


def test_errors_are_counted_on_the_words_recognised_in_order():
    times = [("call", 0.2, 0.5), ("five", 0.7, 1.0), ("two", 1.2, 1.4)]
    words = [Word("call", 0.25, 0.45, 0.9), Word("nine", 0.7, 1.0, 0.9), Word("two", 1.1, 1.5, 0.9)]
    starts, ends = bench.errors(words, times)
    assert starts == pytest.approx([0.05, -0.1]) and ends == pytest.approx([-0.05, 0.1])


@needs_synths
def test_each_word_is_where_the_utterance_says():
    speech, times = next(bench.utterances(1, seed=3, gap=(0.1, 0.1), snr=40.0))
    assert 3 <= len(times) <= 6 and len(speech) / bench.RATE == pytest.approx(times[-1][2] + 0.1, abs=1e-3)
    for _, start, end in times:  # loud inside each word, near silent in the pauses between them
        inside = speech[round(start * bench.RATE): round(end * bench.RATE)]
        pause = speech[round(end * bench.RATE) + 10: round((end + 0.1) * bench.RATE) - 10]
        assert abs(inside).max() == pytest.approx(0.5, abs=0.05) and abs(pause).max() < 0.05


@needs_synths
def test_it_reports_on_a_checkpoint(checkpoint, capsys):
    bench.main(["--checkpoint", str(checkpoint), "--count", "2", "--telephone"])
    out = capsys.readouterr().out.splitlines()
    spoken = sum(len(times) for _, times in bench.utterances(2, bench.SEED, bench.GAP, bench.SNR))
    matched, missed, total = re.fullmatch(r"(\d+) words matched, (\d+) not \(misrecognised\) of (\d+)", out[0]).groups()
    assert int(matched) + int(missed) == int(total) == spoken
    assert out[1].startswith("start: ") and out[2].startswith("end:   ")
