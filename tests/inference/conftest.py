"""The streaming tests' fixtures (test_streaming, test_batched, test_serve): one torch thread, as asr.serve steps its
streams, and a Transcriber of a tiny streaming checkpoint (tests/streams.py)."""

from __future__ import annotations

import pytest
import torch

from asr.inference.acoustic import CheckpointModel
from asr.inference.transcriber import Transcriber
from tests.streams import streaming_module


@pytest.fixture
def one_thread(keep_threads):
    """A stream's steps are small: one thread, as asr.serve runs them (OpenMP's spin on a busy machine costs more)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def streaming_transcriber(char_tokenizer) -> Transcriber:
    return Transcriber(CheckpointModel(streaming_module(char_tokenizer)))
