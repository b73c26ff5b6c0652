"""WER and CER (asr/scoring.py), as training logs them and asr.transcribe prints them."""

from __future__ import annotations

import pytest

from asr.scoring import score, score_line


def test_error_breakdown_counts_substitutions_deletions_insertions():
    scores = score(["call five two nine", "spell c a t"], ["call fife two", "spell c a t t"])
    assert scores["words"] == {"substitutions": 1, "deletions": 1, "insertions": 1, "n": 8}
    assert scores["wer"] == pytest.approx(3 / 8)
    assert scores["chars"]["deletions"] == 5 and scores["chars"]["n"] == 29  # " nine" deleted


def test_rates_are_over_the_whole_set_not_a_mean_of_utterances():
    scores = score(["call five two nine four two one", "nine"], ["call five two nine four two one", "five"])
    assert scores["wer"] == pytest.approx(1 / 8)  # a mean of per-utterance rates would say (0 + 1) / 2
    assert score(["call five"], ["call five"])["wer"] == 0 == score(["call five"], ["call five"])["cer"]


def test_the_printed_line_gives_both_rates_and_the_word_edits():
    line = score_line(score(["call five two nine", "spell c a t"], ["call fife two", "spell c a t t"]), 2)
    # chars: f for v, " nine" deleted, " t" inserted: 8 edits of 29 characters
    assert line == ("WER 0.3750  CER 0.2759  (2 references, 8 words: 1 substitutions, 1 deletions, "
                    "1 insertions)")
