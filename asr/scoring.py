"""Word and character error rates with their edit counts (jiwer), for training metrics and asr.transcribe.

Error rate = (substitutions + deletions + insertions) / reference length, over the whole set
(not a mean of per-utterance rates).
"""

from __future__ import annotations

import jiwer


def score(references: list[str], hypotheses: list[str]) -> dict:
    """WER and CER with jiwer's edit counts: {"wer", "cer", "words": {...}, "chars": {...}}.

    Each count dict holds substitutions, deletions, insertions and the reference length ``n``;
    error rate = (substitutions + deletions + insertions) / n over the whole set.
    """
    out = {}
    for unit, edits in (("words", jiwer.process_words), ("chars", jiwer.process_characters)):
        o = edits(references, hypotheses)
        out[unit] = {"substitutions": o.substitutions, "deletions": o.deletions, "insertions": o.insertions,
                     "n": o.hits + o.substitutions + o.deletions}
    for rate, unit in (("wer", "words"), ("cer", "chars")):
        c = out[unit]
        out[rate] = (c["substitutions"] + c["deletions"] + c["insertions"]) / max(c["n"], 1)
    return out


def score_line(scores: dict, utterances: int) -> str:
    """One line of ``score``'s result: "WER 0.1250  CER 0.0400  (N references, n words: S/D/I counts)"."""
    w = scores["words"]
    return (f"WER {scores['wer']:.4f}  CER {scores['cer']:.4f}  ({utterances} references, {w['n']} words: "
            f"{w['substitutions']} substitutions, {w['deletions']} deletions, {w['insertions']} insertions)")
