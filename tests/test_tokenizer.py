import io

import pytest
import sentencepiece as spm

from asr.tokenizer import BLANK_ID, UNK_ID, Tokenizer

TEXTS = [
    "call five two nine", "spell c a t", "nine four", "two five", "call nine", "four two one",
    "dial seven three eight", "spell d o g", "call eight six", "three one four one five nine",
    "seven seven two", "spell b e e", "dial zero zero one", "six five four three two one",
]


@pytest.mark.parametrize("model_type", ["char", "unigram", "bpe"])
def test_trained_tokenizer_round_trips_text(model_type):
    tok = Tokenizer.train(TEXTS, model_type=model_type, vocab_size=40)
    for text in ["call five two nine", "spell d o g", "dial seven"]:
        assert tok.decode(tok.encode(text)) == text


def test_blank_is_piece_zero_and_never_produced_by_encode(char_tokenizer):
    assert BLANK_ID == 0 and char_tokenizer.sp.id_to_piece(BLANK_ID) == "<blank>"
    ids = [i for text in TEXTS for i in char_tokenizer.encode(text)]
    assert ids and BLANK_ID not in ids


def test_decode_drops_blanks(char_tokenizer):
    ids = char_tokenizer.encode("call nine")
    assert char_tokenizer.decode([BLANK_ID, *ids[:2], BLANK_ID, *ids[2:]]) == "call nine"


def test_unknown_characters_map_to_unk(char_tokenizer):
    assert UNK_ID in char_tokenizer.encode("call xyz")  # sentencepiece gives a run of unknowns one UNK
    assert UNK_ID not in char_tokenizer.encode("call")


def test_vocab_size_counts_blank_and_unk(char_tokenizer):
    characters = set("".join(TEXTS[:6]).replace(" ", ""))  # the conftest tokenizer's texts
    assert char_tokenizer.vocab_size == len(characters) + 3  # + <blank>, <unk>, the word-boundary piece


def test_serialized_bytes_rebuild_the_same_tokenizer(char_tokenizer):
    copy = Tokenizer(char_tokenizer.serialized)
    assert copy.vocab_size == char_tokenizer.vocab_size
    assert copy.encode("spell c a t") == char_tokenizer.encode("spell c a t")


def test_save_and_load_round_trip(char_tokenizer, tmp_path):
    char_tokenizer.save(tmp_path / "tok.model")
    loaded = Tokenizer.load(tmp_path / "tok.model")
    assert loaded.serialized == char_tokenizer.serialized
    assert loaded.encode("four two one") == char_tokenizer.encode("four two one")


def test_model_without_the_blank_contract_is_refused():
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=buffer, model_type="char",
                                   minloglevel=2)  # sentencepiece's defaults: <unk>=0, <s>=1, </s>=2
    with pytest.raises(ValueError, match="blank-id contract"):
        Tokenizer(buffer.getvalue())


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="'word'"):
        Tokenizer.train(TEXTS, model_type="word")


def test_training_on_no_text_is_refused():
    with pytest.raises(ValueError, match="no text"):
        Tokenizer.train([])
