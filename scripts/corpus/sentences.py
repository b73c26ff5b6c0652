"""Free text for ``scripts/corpus/make_corpus.py text``: sentences of a file, normalised for the synthesisers.

Errors (an unreadable file, too few sentences) are ValueErrors whose text names the flag.
"""
import re
import sys
import unicodedata
from pathlib import Path

SILENT_PUNCTUATION = re.compile(r"[.,;:!?\"()\[\]{}\-\u2010-\u2015/\u2026\u00ab\u00bb\u201c\u201d]")


def normalise(line):
    """(text, None) or (None, reason): lowercase a-z, apostrophe, single spaces."""
    s = unicodedata.normalize("NFKD", line)
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = s.replace("\u2019", "'").replace("\u2018", "'")
    if re.search(r"\d", s):
        return None, "digits"   # their spoken form is ambiguous ("1984", "1st", "2.5")
    s = SILENT_PUNCTUATION.sub(" ", s)
    bad = re.search(r"[^a-z' \t\r\n]", s)
    if bad:
        return None, f"unsupported characters:{bad.group()}"
    words = [w.strip("'") for w in s.split()]
    text = " ".join(w for w in words if w)
    return (text, None) if text else (None, "empty")


def read_sentences(path):
    """Distinct normalised sentences of a file, reporting the unusable lines."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--sentences {path}: cannot read it ({err}).") from None
    kept, dropped, chars = {}, {}, set()
    for number, line in enumerate(lines, 1):
        text, reason = normalise(line)
        if text is None:
            reason, _, char = reason.partition(":")
            dropped.setdefault(reason, []).append(number)
            chars.update(char)
        else:
            kept.setdefault(text, number)
    total = sum(len(v) for v in dropped.values())
    print(f"{path}: {len(lines)} lines; dropped {total} as unusable; "
          f"{len(lines) - total - len(kept)} duplicates merged; "
          f"{len(kept)} distinct sentences kept", file=sys.stderr)
    for reason, numbers in sorted(dropped.items()):
        shown = ", ".join(map(str, numbers[:20])) + (", ..." if len(numbers) > 20 else "")
        detail = f" ({' '.join(sorted(chars))})" if reason.startswith("unsupported") else ""
        print(f"  {reason}{detail}: {len(numbers)} lines: {shown}", file=sys.stderr)
    return list(kept)


def draw_text(rng, sentences, count, dev_fraction, test_fraction):
    """count distinct sentences, cut into test / dev / train (hence disjoint)."""
    if count > len(sentences):
        raise ValueError(f"--count {count} exceeds the {len(sentences)} distinct usable sentences "
                         f"in --sentences.")
    chosen = rng.sample(sentences, count)
    n_test, n_dev = round(count * test_fraction), round(count * dev_fraction)
    parts = {"test": chosen[:n_test], "dev": chosen[n_test:n_test + n_dev],
             "train": chosen[n_test + n_dev:]}
    return parts
