"""Build a small word or character n-gram language model (ARPA) from manifest text, for beam search with --lm.

Usage:

    asr build-lm data/mini/train.jsonl lm/mini.3gram.arpa --order 3
    asr build-lm train.jsonl more.txt lm/big.4gram.arpa --order 4   # .txt: one sentence a line
    asr build-lm train.jsonl lm/chars.6gram.arpa --unit char --order 6

``--unit char`` models characters instead of words, with '▁' (``asr.tokenizer.WORD_START``) between
words: asr.models.ctc_decoding then scores each character as the beam search reads it (its ``CharLM``). It
suits little text in a language of many word forms, where most words of new speech were never in
the text; a word model suits a closed vocabulary.

Inputs are JSON-lines manifests (their ``text`` field) or plain text files (``.txt``, one
sentence per line). Words are split on whitespace and kept as written, after the NFKC
normalisation sentencepiece applies too: use the same text normalisation (case, punctuation) as
the tokenizer was trained with. Do not build it from dev or test text.

Smoothing is interpolated Kneser-Ney (one absolute discount per order, D = n1 / (n1 + 2 n2)
from that order's count-of-counts), the recipe of Chen & Goodman (1998); lower orders use
continuation counts (how many distinct words precede an n-gram), except n-grams that start
with ``<s>``, which nothing can precede and which keep their raw counts, as KenLM's lmplz
does. Unigrams interpolate with a uniform distribution over the vocabulary, so ``<unk>``
gets the uniform share. The ARPA file holds log10 probabilities and log10 backoff weights:
each listed probability is the interpolated one, and the backoff weight of a context is its
interpolation weight, so a KenLM lookup that backs off reproduces the interpolated model.

Pure Python (no lmplz needed); meant for the small corpora of this project (a few million
words at most; for a character model, a few million characters). KenLM (inside flashlight-text,
``pip install -e ".[lm]"``) reads the ARPA file as it is; its ``build_binary`` tool, where
installed, makes a faster-loading binary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

from asr.tokenizer import WORD_START

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
UNITS = ("word", "char")
KENLM_MAX_ORDER = 6  # flashlight-text's KenLM (the beam search's) refuses longer n-grams
NEVER = -99.0  # log10 probability ARPA files give <s>, which is a context but never predicted


def read_sentences(paths: list[Path]) -> list[list[str]]:
    """Word lists of every non-empty text in the manifests / text files ``paths``."""
    sentences = []
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such manifest or text file")
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if path.suffix == ".txt":
                    text = line
                elif line.strip():
                    try:
                        text = json.loads(line)["text"]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{number}: not a manifest line with a 'text' field ({e})") from e
                else:
                    continue
                words = unicodedata.normalize("NFKC", text).split()  # as the tokenizer (sentencepiece) reads it
                if any(w in (BOS, EOS, UNK) or WORD_START in w for w in words):
                    raise ValueError(f"{path}:{number}: the text contains {BOS}, {EOS}, {UNK} or {WORD_START}, which "
                                     f"the LM reserves ({WORD_START} marks the word boundaries of a character LM)")
                if words:
                    sentences.append(words)
    if not sentences:
        raise ValueError(f"no text in {', '.join(map(str, paths))}")
    return sentences


def adjusted_counts(sentences: list[list[str]], order: int) -> list[Counter]:
    """counts[n-1][ngram]: raw counts at the top order and for n-grams starting with <s>; below the top
    order otherwise the continuation count, the number of distinct words seen just before the n-gram."""
    raw = Counter()
    for words in sentences:
        padded = [BOS, *words, EOS]
        for i in range(1, len(padded)):  # every n-gram ending at padded[i] (<s> alone is never predicted)
            raw.update(tuple(padded[i - n + 1: i + 1]) for n in range(1, min(order, i + 1) + 1))
    left = Counter(ngram[1:] for ngram in raw if len(ngram) > 1)  # distinct left neighbours
    counts = [Counter() for _ in range(order)]
    for ngram, c in raw.items():
        n = len(ngram)
        counts[n - 1][ngram] = c if n == order or ngram[0] == BOS else left[ngram]
    return counts


def discount(counts: Counter) -> float:
    """Kneser-Ney's absolute discount n1 / (n1 + 2 n2); 0.5 where the count-of-counts cannot say."""
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.5


def kneser_ney(counts: list[Counter], reserved: tuple[str, ...] = (UNK,)) -> tuple[list[dict], list[dict]]:
    """(probs[n-1][ngram], backoffs[n-1][context]): interpolated probabilities and interpolation weights.
    Every unit of ``reserved`` is in the vocabulary even if the text never had it."""
    vocab = {ngram[0] for ngram in counts[0]} | {EOS, *reserved}
    probs: list[dict] = []
    backoffs: list[dict] = [dict() for _ in counts]
    for n, level in enumerate(counts, 1):
        d = discount(level)
        totals, followers = defaultdict(int), defaultdict(int)
        for ngram, c in level.items():
            totals[ngram[:-1]] += c
            followers[ngram[:-1]] += 1
        gamma = {h: d * followers[h] / totals[h] for h in totals}  # the mass the discount frees, per context
        if n == 1:  # below unigrams: uniform over the vocabulary; <unk>, never seen, gets only that share
            lower = {(w,): 1 / len(vocab) for w in vocab}
            level = {**{(w,): 0 for w in reserved}, **level}
        else:
            lower = probs[-1]
            backoffs[n - 2].update(gamma)
        probs.append({g: max(c - d, 0) / totals[g[:-1]] + gamma[g[:-1]] * lower[g[1:] if n > 1 else g]
                      for g, c in level.items()})
    return probs, backoffs


def write_arpa(probs: list[dict], backoffs: list[dict], path: Path) -> None:
    """Write the ARPA file atomically (a temp file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            sizes = [len(level) + (n == 0) for n, level in enumerate(probs)]  # + <s> among the unigrams
            f.write("\\data\\\n" + "".join(f"ngram {n}={size}\n" for n, size in enumerate(sizes, 1)))
            for n, level in enumerate(probs):
                f.write(f"\n\\{n + 1}-grams:\n")
                if n == 0:
                    bos_backoff = f"\t{math.log10(backoffs[0][(BOS,)]):.6f}" if len(probs) > 1 else ""
                    f.write(f"{NEVER}\t{BOS}{bos_backoff}\n")
                for ngram, p in sorted(level.items()):
                    line = f"{math.log10(p):.6f}\t{' '.join(ngram)}"
                    if ngram in backoffs[n]:
                        line += f"\t{math.log10(backoffs[n][ngram]):.6f}"
                    f.write(line + "\n")
            f.write("\n\\end\\\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def build(inputs: list[Path], output: Path, order: int, unit: str = UNITS[0]) -> list[int]:
    """Read ``inputs``, write the ``order``-gram ARPA model of ``unit``s (word or char) to ``output``; returns the
    n-gram counts per order."""
    if not 2 <= order <= KENLM_MAX_ORDER:
        raise ValueError(f"--order must be 2 to {KENLM_MAX_ORDER} (KenLM cannot load a unigram model, and the KenLM "
                         f"of flashlight-text, which --lm loads, was built for at most {KENLM_MAX_ORDER}-grams), "
                         f"got {order}")
    if unit not in UNITS:
        raise ValueError(f"--unit must be one of {', '.join(UNITS)}, got {unit!r}")
    sentences = read_sentences(inputs)
    reserved = (UNK,)
    if unit == "char":  # '▁' in the vocabulary marks the LM as one of characters, even if no text had two words
        sentences = [list(WORD_START.join(words)) for words in sentences]
        reserved = (UNK, WORD_START)
    probs, backoffs = kneser_ney(adjusted_counts(sentences, order), reserved)
    write_arpa(probs, backoffs, output)
    return [len(level) + (n == 0) for n, level in enumerate(probs)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="manifests (.jsonl) and/or text files (.txt)")
    parser.add_argument("output", type=Path, help="the ARPA file to write, e.g. lm/mini.3gram.arpa")
    parser.add_argument("--order", type=int, default=3, help="n-gram order (3 = trigram)")
    parser.add_argument("--unit", choices=UNITS, default=UNITS[0],
                        help="what the n-grams count: words, or characters with '▁' between words")
    args = parser.parse_args(argv)
    sizes = build(args.inputs, args.output, args.order, args.unit)
    print(f"wrote {args.output}: " + ", ".join(f"{size} {n}-grams" for n, size in enumerate(sizes, 1)))


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
