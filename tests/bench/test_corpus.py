"""asr.bench.corpus: the synthetic LibriSpeech-like corpus and the batching arithmetic, by hand."""

from __future__ import annotations

import json

import pytest
import soundfile

from asr.bench import corpus as bench_corpus
from asr.data.sampler import BucketBatchSampler
from asr.tokenizer import Tokenizer


def test_padding_fraction_by_hand():
    # batches [1 s, 2 s] and [3 s, 4 s] hold 2*2 + 2*4 = 12 s of padded audio, 10 s of it speech
    assert bench_corpus.padding_fraction([1.0, 2.0, 3.0, 4.0], [[0, 1], [2, 3]]) == pytest.approx(2 / 12)
    assert bench_corpus.padding_fraction([1.0, 2.0, 3.0, 4.0], [[0], [1], [2], [3]]) == 0.0


def test_random_batches_hold_every_utterance_once_within_the_limit():
    durations = bench_corpus.corpus_durations(200, seed=1)
    sampler = BucketBatchSampler(durations, 60.0)
    batches = bench_corpus.random_batches(sampler, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(durations[i] for i in b) <= 60.0 for b in batches)
    assert batches != bench_corpus.random_batches(sampler, seed=2)


def test_corpus_durations_look_like_librispeech():
    durations = bench_corpus.corpus_durations(4000, seed=0)
    assert 1.0 <= min(durations) and max(durations) <= 20.0
    assert 11.0 < sum(durations) / len(durations) < 13.0
    assert durations == bench_corpus.corpus_durations(4000, seed=0)


def test_synthetic_corpus_files_rate_and_token_rates(tmp_path):
    tokenizer = Tokenizer.load(bench_corpus.write_tokenizer(tmp_path, seed=3))
    manifest = bench_corpus.write_corpus(tmp_path, 5, seed=3, scale=1.0, sample_rate=8000, tokenizer=tokenizer)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        info = soundfile.info(tmp_path / row["audio_filepath"])
        assert info.samplerate == 8000  # the rate it is asked for (asr.bench: the configured data.sample_rate)
        assert info.frames / info.samplerate == pytest.approx(row["duration"], abs=1e-3)
        wanted = round(bench_corpus.TOKENS_PER_SECOND * row["duration"])
        assert wanted <= len(tokenizer.encode(row["text"])) <= wanted + 8  # words are added until the count is reached
