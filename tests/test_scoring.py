"""WER and CER (asr/scoring.py), as training logs them and asr.transcribe prints them."""

from __future__ import annotations

import pytest

from asr.scoring import score


def test_error_breakdown_counts_substitutions_deletions_insertions():
    scores = score(["call five two nine", "spell c a t"], ["call fife two", "spell c a t t"])
    assert scores["words"] == {"substitutions": 1, "deletions": 1, "insertions": 1, "n": 8}
    assert scores["wer"] == pytest.approx(3 / 8)
    assert scores["chars"]["deletions"] == 5 and scores["chars"]["n"] == 29  # " nine" deleted
