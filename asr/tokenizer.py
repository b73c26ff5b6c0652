"""Sentencepiece tokenizer and the CTC blank-id contract.

Contract: the model's output class ``i`` is sentencepiece piece ``i``. Piece 0 is the
CTC blank (trained in as sentencepiece's pad piece ``<blank>``, which encoding never
produces), piece 1 is ``<unk>``; there is no BOS or EOS. So ``vocab_size`` is both the
tokenizer's size and the width of the CTC head.

The serialized sentencepiece model (bytes) travels inside every checkpoint
(``Tokenizer.serialized``), so a checkpoint alone is enough to transcribe.

    tok = Tokenizer.train(["call five two", "spell c a t"], model_type="char")
    tok.decode(tok.encode("call five")) == "call five"
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sentencepiece as spm

BLANK_ID = 0  # CTC blank: the first output class of every model
UNK_ID = 1  # sentencepiece's unknown piece: text that encodes to it cannot be learned
WORD_START = "\u2581"  # '▁': sentencepiece's mark on the first piece of a word
MODEL_TYPES = ("char", "unigram", "bpe")
DEFAULT_MODEL_TYPE = "char"  # works on any amount of text; word pieces need enough text to learn from
DEFAULT_VOCAB_SIZE = 64  # largest vocabulary when training unigram or bpe (ignored for char)


@dataclass(frozen=True)
class TokenizerConfig:
    """A run's tokenizer (``--data.tokenizer.*``): a sentencepiece model given, or one trained on the training text.

    Args:
        model: a sentencepiece .model to use, or a checkpoint of asr whose tokenizer to use (with model.init_from:
            keeps its CTC head whole); null trains one on the training text.
        type: sentencepiece model type when training one: char, unigram or bpe.
        vocab_size: largest vocabulary when training a unigram or bpe tokenizer.
    """

    model: str | None = None
    type: Literal["char", "unigram", "bpe"] = "unigram"  # 64 pieces (vocab_size): one per word of the bundled
    # corpus' 30, plus characters
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self):
        if self.type not in MODEL_TYPES:
            raise ValueError(f"data.tokenizer.type must be one of {MODEL_TYPES}, got {self.type!r}")
        if self.vocab_size < 2:
            raise ValueError(f"data.tokenizer.vocab_size must be at least 2 (the blank and one piece), got "
                             f"{self.vocab_size}")


class NotATokenizer(ValueError):
    """``Tokenizer.load``: a folder or checkpoint with no tokenizer in it; the message is the reason."""


class Tokenizer:
    """A sentencepiece model that keeps its own serialized bytes."""

    def __init__(self, serialized: bytes):
        self.serialized = bytes(serialized)
        self.sp = spm.SentencePieceProcessor(model_proto=self.serialized)
        if self.sp.id_to_piece(BLANK_ID) != "<blank>" or self.sp.unk_id() != UNK_ID:
            raise ValueError(
                "this sentencepiece model does not follow the blank-id contract: piece 0 must be "
                "'<blank>' (pad_id=0, pad_piece='<blank>') and piece 1 '<unk>'; train it with Tokenizer.train"
            )

    @classmethod
    def train(cls, texts: Iterable[str], model_type: str = DEFAULT_MODEL_TYPE,
              vocab_size: int = DEFAULT_VOCAB_SIZE) -> "Tokenizer":
        """Train on ``texts``; ``vocab_size`` is an upper bound for unigram/bpe and ignored for char."""
        if model_type not in MODEL_TYPES:
            raise ValueError(f"tokenizer model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        texts = list(texts)
        if not texts:
            raise ValueError("cannot train a tokenizer on no text")
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buffer,
            model_type=model_type,
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # small corpora have fewer pieces than asked for: take what there is
            character_coverage=1.0,
            pad_id=BLANK_ID, pad_piece="<blank>", unk_id=UNK_ID, bos_id=-1, eos_id=-1,
            num_threads=1,  # deterministic, and the corpora it trains on here are small
            minloglevel=2,
        )
        return cls(buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Read a ``.model`` file written by ``save`` (or by sentencepiece with the same contract), or the
        tokenizer inside a checkpoint of asr (a ``.ckpt`` file, or a sharded checkpoint folder)."""
        path = Path(path)
        if path.is_dir() or zipfile.is_zipfile(path):  # torch.save writes zip files; .model files are protobuf
            import torch  # (only here: a tokenizer alone needs no torch)

            from asr.checkpoint import METADATA

            if path.is_dir() and not (path / METADATA).is_file():
                raise NotATokenizer(f"a folder, not a sharded checkpoint (it has no {METADATA})")
            checkpoint = torch.load(path / METADATA if path.is_dir() else path, map_location="cpu",
                                    weights_only=True, mmap=True)
            if "tokenizer" not in checkpoint:
                raise NotATokenizer("a checkpoint with no tokenizer inside: it was not written by asr.fit")
            return cls(checkpoint["tokenizer"])
        return cls(path.read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.serialized)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids if i != BLANK_ID])
