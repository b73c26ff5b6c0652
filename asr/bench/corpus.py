"""asr.bench.suite's synthetic corpus, and the padding arithmetic of its batching section.

FLAC files at the configured ``data.sample_rate`` whose lengths follow a LibriSpeech-like distribution
(1-20 s, mean ~12 s, times a scale) with ~TOKENS_PER_SECOND tokens a second, all from one seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import soundfile

from asr.data.sampler import BucketBatchSampler
from asr.tokenizer import Tokenizer

TOKENS_PER_SECOND = 3.0  # LibriSpeech with a ~1k-piece tokenizer: ~2.7 words/s, ~1.2 pieces per word


def corpus_durations(n: int, seed: int, scale: float = 1.0) -> list[float]:
    """``n`` durations in seconds, 1-20 s, mean ~12 s, skewed long like LibriSpeech's training sets; all
    multiplied by ``scale`` (quick mode: shorter utterances, the same shape of distribution)."""
    rng = np.random.default_rng(seed)
    return [round(scale * (1.0 + 19.0 * x), 2) for x in rng.beta(2.2, 1.6, n)]  # Beta mean 0.58 -> 12.0 s


def speech_like(seconds: float, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) float32 at ``sample_rate`` Hz: a gliding harmonic tone under a ~4 Hz syllable envelope, plus noise."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    pitch = 120 + 40 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t)  # Hz
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6)), 0, None)
    return (0.2 * voice * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def write_tokenizer(root: Path, seed: int) -> Path:
    """A 256-piece unigram tokenizer of seeded pseudo-words, written to ``root/tokenizer.model``."""
    rng = np.random.default_rng(seed)
    tokenizer = Tokenizer.train([" ".join(rng.permutation(pseudo_words(seed))) for _ in range(20)], "unigram", 256)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(root / "tokenizer.model")
    return root / "tokenizer.model"


def pseudo_words(seed: int) -> list[str]:
    """The corpus' vocabulary: up to 400 words of one to three consonant-vowel syllables."""
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    return sorted({"".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(400)})


def write_corpus(root: Path, n: int, seed: int, scale: float, sample_rate: int, tokenizer: Tokenizer) -> Path:
    """Write ``n`` FLAC files at ``sample_rate`` Hz and ``root/train.jsonl``; returns the manifest.

    Texts are pseudo-words drawn until ``tokenizer`` gives ~TOKENS_PER_SECOND tokens per second.
    """
    rng = np.random.default_rng(seed + 1)
    words = pseudo_words(seed)
    word_tokens = {w: len(tokenizer.encode(w)) for w in words}  # pieces never cross spaces: counts add up
    (root / "audio").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, seconds in enumerate(corpus_durations(n, seed, scale)):
        text, tokens = [], 0
        while tokens < round(TOKENS_PER_SECOND * seconds):
            text.append(str(rng.choice(words)))
            tokens += word_tokens[text[-1]]
        audio = speech_like(seconds, sample_rate, rng)
        soundfile.write(root / "audio" / f"{i:05d}.flac", audio, sample_rate, subtype="PCM_16")
        lines.append(json.dumps({"audio_filepath": f"audio/{i:05d}.flac", "duration": seconds, "text": " ".join(text)}))
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    return root / "train.jsonl"


def random_batches(sampler: BucketBatchSampler, seed: int) -> list[list[int]]:
    """The items of ``sampler``'s epoch in random order, cut by ``sampler`` (its max_batch_seconds) as it cuts its sorted order."""
    order = sorted(i for batch in sampler.global_batches() for i in batch)
    random.Random(seed).shuffle(order)
    return sampler.cut(order)


def padding_fraction(durations: list[float], batches: list[list[int]]) -> float:
    """Padded share of the audio the batches hold: 1 - sum of durations / sum of (size x longest)."""
    padded = sum(len(b) * max(durations[i] for i in b) for b in batches)
    return 1.0 - sum(durations[i] for b in batches for i in b) / padded
