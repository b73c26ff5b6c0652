"""asr.models.ctc_decoding (greedy, beam search, the word- and character-LM connections) and asr.tools.build_lm
(``asr build-lm``: a valid, normalised ARPA, which the LM tests here decode with)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from asr.models.ctc_decoding import BeamSearch, CharLM, WordLM, greedy, load_lm, make_decoder
from asr.tokenizer import BLANK_ID
from asr.tools import build_lm
from asr.train.module import error_counts

B = BLANK_ID
VOCAB = 6


def log_probs(*frames: list[int], vocab: int = VOCAB, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T', V) log-probs whose best class per frame is given, padded with frames of class 5; lengths."""
    longest = max(len(f) for f in frames)
    best = torch.tensor([f + [5] * (longest - len(f)) for f in frames])
    noise = torch.rand(len(frames), longest, vocab, generator=torch.Generator().manual_seed(seed))
    scores = torch.nn.functional.one_hot(best, vocab).float() * 4.0 + noise
    return scores.log_softmax(-1), torch.tensor([len(f) for f in frames])


def test_greedy_merges_repeats_and_drops_blanks():
    assert greedy(*log_probs([B, 2, 2, 2, B, B, 3, 3, B, 4])) == [[2, 3, 4]]


def test_greedy_keeps_a_token_repeated_across_a_blank():
    assert greedy(*log_probs([2, B, 2, 2, 3, B, B, 3])) == [[2, 2, 3, 3]]


def test_greedy_ignores_frames_beyond_each_length():
    assert greedy(*log_probs([2, 3, 4, 1, 1, 2], [1, B], [B, B, B])) == [[2, 3, 4, 1, 2], [1], []]


def test_greedy_of_all_blanks_is_empty():
    assert greedy(*log_probs([B, B, B, B])) == [[]]


def test_greedy_does_not_merge_across_the_start_of_an_utterance():
    assert greedy(*log_probs([3, 3], [3])) == [[3], [3]]


# ---- beam search ----------------------------------------------------------------------------------------------


def test_beam_width_one_is_greedy_on_random_log_probs(char_tokenizer):
    """Unstructured log-probs (no ties: continuous random values), padded batch of different lengths."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 60, char_tokenizer.vocab_size, generator=generator) * 3
    lengths = torch.tensor([60, 41, 7, 0])
    emissions = scores.log_softmax(-1)
    assert BeamSearch(char_tokenizer, beam_size=1)(emissions, lengths) == greedy(emissions, lengths)


def test_beam_width_one_is_greedy_on_peaky_log_probs(char_tokenizer):
    """Model-like output: one dominant class per frame, mostly blank, with repeats."""
    generator = torch.Generator().manual_seed(1)
    frames = [[int(c) if torch.rand(1, generator=generator) < 0.5 else B
               for c in torch.randint(2, char_tokenizer.vocab_size, (n,), generator=generator)] for n in (80, 33, 50)]
    emissions, lengths = log_probs(*frames, vocab=char_tokenizer.vocab_size)
    assert BeamSearch(char_tokenizer, beam_size=1)(emissions, lengths) == greedy(emissions, lengths)


def test_make_decoder_is_greedy_for_one_beam_without_lm_and_beam_search_otherwise(char_tokenizer):
    assert make_decoder(char_tokenizer) is greedy
    assert isinstance(make_decoder(char_tokenizer, beam_size=4), BeamSearch)


def test_beam_search_of_a_batch_equals_one_utterance_at_a_time(char_tokenizer, tmp_path):
    lm = write_lm(tmp_path, ["call five two nine", "nine four"])
    generator = torch.Generator().manual_seed(2)
    emissions = (torch.randn(3, 40, char_tokenizer.vocab_size, generator=generator) * 4).log_softmax(-1)
    lengths = torch.tensor([40, 25, 12])
    for decode in BeamSearch(char_tokenizer, beam_size=4), BeamSearch(char_tokenizer, beam_size=4, lm=lm):
        batched = decode(emissions, lengths)
        assert batched == [decode(emissions[i: i + 1, : int(n)], lengths[i: i + 1])[0] for i, n in enumerate(lengths)]


def spelled(tokenizer, *frames: str | dict[str, float]) -> torch.Tensor:
    """(T', V) log-probs: a frame is a piece (probability 0.9) or {piece: probability}; the rest is shared evenly."""
    pieces = {tokenizer.sp.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    rows = []
    for frame in frames:
        frame = {frame: 0.9} if isinstance(frame, str) else frame
        row = torch.full((tokenizer.vocab_size,), (1 - sum(frame.values())) / (tokenizer.vocab_size - len(frame)))
        for piece, p in frame.items():
            row[pieces[piece]] = p
        rows.append(row)
    return torch.stack(rows).log()


def word(tokenizer, text: str, ambiguous: dict[str, dict[str, float]] | None = None) -> list:
    """Frames spelling ``text`` (char pieces, blank between letters); ambiguous["five0"] replaces letter 0 of five."""
    frames, ambiguous = [], ambiguous or {}
    for w in text.split():
        frames += ["▁", "<blank>"]
        for i, letter in enumerate(w):
            frames += [ambiguous.get(f"{w}{i}", letter), "<blank>"]
    return frames


@pytest.mark.parametrize("unit, order", [("word", 3), ("char", 6)])
def test_the_lm_picks_the_word_it_favours_where_the_acoustics_are_ambiguous(char_tokenizer, tmp_path, unit, order):
    """'five' vs 'nine' differ in two letters, each heard 55:45 the wrong way; the LM knows which follows what."""
    lm = write_lm(tmp_path, ["call nine"] * 5 + ["two five"] * 5 + ["nine four", "five two one"], order, unit)
    five_as_nine = {"five0": {"n": 0.55, "f": 0.45}, "five2": {"n": 0.55, "v": 0.45}}
    nine_as_five = {"nine0": {"f": 0.55, "n": 0.45}, "nine2": {"v": 0.55, "n": 0.45}}
    references = ["call nine", "two five"]
    utterances = [spelled(char_tokenizer, *word(char_tokenizer, "call nine", nine_as_five)),
                  spelled(char_tokenizer, *word(char_tokenizer, "two five", five_as_nine))]
    emissions = torch.nn.utils.rnn.pad_sequence(utterances, batch_first=True)
    lengths = torch.tensor([len(u) for u in utterances])

    def wer(decode) -> float:
        hypotheses = [char_tokenizer.decode(ids) for ids in decode(emissions, lengths)]
        word_errors, words, _, _ = error_counts(references, hypotheses).tolist()
        return word_errors / words

    assert wer(greedy) == 0.5  # the acoustics alone pick "call five", "two nine"
    assert wer(BeamSearch(char_tokenizer, beam_size=8)) == 0.5
    assert wer(BeamSearch(char_tokenizer, beam_size=8, lm=lm, lm_weight=0.5)) == 0.0
    assert wer(BeamSearch(char_tokenizer, beam_size=8, lm=lm, lm_weight=0.0)) == 0.5  # it was the LM


PIECES = ["<blank>", "<unk>", "▁", "▁call", "▁ca", "ll", "▁cat", "ni", "ne", "c", "a", "l", "t", "n", "i", "e"]


def char_lm_total(lm, pieces: list[str]) -> float:
    """What ``lm`` adds up for one hypothesis made of ``pieces`` (PIECES' texts), its end included."""
    state, total = lm.start(False), 0.0
    for piece in pieces:
        state, score = lm.score(state, PIECES.index(piece))
        total += score
    return total + lm.finish(state)[1]


SEGMENTATIONS = [["▁", *"call", "▁", *"cat"], ["▁call", "▁cat"], ["▁ca", "ll", "▁", "c", "a", "t"]]


@pytest.mark.parametrize("segmentation", SEGMENTATIONS)
def test_a_character_lm_scores_every_character_and_the_boundaries_between_words(tmp_path, segmentation):
    """Whatever the pieces, CharLM adds KenLM's c, a, l, l, ▁, c, a, t, </s> (a leading ▁ is not scored), each
    weighted, plus the word score per character; an ARPA of words loads as a WordLM."""
    path = write_lm(tmp_path, TEXTS, 4, "char")
    _, entries = read_arpa(path)
    lm = load_lm(path, PIECES, lm_weight=0.5, word_score=0.25)
    assert isinstance(lm, CharLM)
    assert isinstance(load_lm(write_lm(tmp_path, TEXTS), PIECES, 0.5, 0.0), WordLM)
    expected, history = 0.0, ("<s>",)
    for unit in [*"call▁cat", "</s>"]:
        expected += 0.5 * log10_prob(entries, history[-3:], unit) + (0.25 if unit != "</s>" else 0.0)
        history += (unit,)
    assert char_lm_total(lm, segmentation) == pytest.approx(expected, abs=1e-4)


def test_a_character_lm_scores_the_unk_piece_as_unk_and_knows_the_boundary_without_two_word_text(tmp_path):
    path = write_lm(tmp_path, ["call", "nine", "cat"], 4, "char")  # no line has two words: '▁' is still a unit
    _, entries = read_arpa(path)
    lm = load_lm(path, PIECES, lm_weight=1.0, word_score=0.0)
    assert isinstance(lm, CharLM)
    expected = sum(log10_prob(entries, history, unit) for history, unit in
                   [(("<s>",), "c"), (("<s>", "c"), "a"), (("<s>", "c", "a"), "<unk>"), (("c", "a", "<unk>"), "</s>")])
    assert char_lm_total(lm, ["▁ca", "<unk>"]) == pytest.approx(expected, abs=1e-4)


def test_a_clearly_spoken_word_outside_the_lm_vocabulary_is_still_output(char_tokenizer, tmp_path):
    lm = write_lm(tmp_path, ["call nine", "two five", "nine four"])
    emissions = spelled(char_tokenizer, *word(char_tokenizer, "call cat nine"))[None]
    ids = BeamSearch(char_tokenizer, beam_size=8, lm=lm)(emissions, torch.tensor([emissions.shape[1]]))
    assert char_tokenizer.decode(ids[0]) == "call cat nine"


def test_a_negative_word_score_makes_fewer_words(char_tokenizer, tmp_path):
    """'call' then 'five' with a word boundary heard 50:50 against nothing: the word score decides."""
    lm = write_lm(tmp_path, ["call five", "callfive"])
    frames = word(char_tokenizer, "call five")
    boundary = frames.index("▁", 2)
    frames[boundary] = {"▁": 0.45, "<blank>": 0.45}
    emissions = spelled(char_tokenizer, *frames)[None]
    lengths = torch.tensor([emissions.shape[1]])
    texts = {score: char_tokenizer.decode(BeamSearch(char_tokenizer, 8, lm, 0.0, score)(emissions, lengths)[0])
             for score in (-5.0, 5.0)}
    assert texts == {-5.0: "callfive", 5.0: "call five"}


def test_bad_settings_are_errors_naming_the_flag(char_tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--beam_size"):
        make_decoder(char_tokenizer, beam_size=0)
    with pytest.raises(FileNotFoundError, match="--lm .*missing.arpa"):
        make_decoder(char_tokenizer, beam_size=4, lm=tmp_path / "missing.arpa")
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"mmap lm http://kheafield.com/code format version 5\n\0")
    with pytest.raises(FileNotFoundError, match="model.bin.words"):
        make_decoder(char_tokenizer, beam_size=4, lm=binary)
    monkeypatch.setitem(sys.modules, "flashlight.lib.text.decoder", None)  # as if flashlight-text were absent
    with pytest.raises(ImportError, match=r'pip install -e "\.\[lm\]"'):
        make_decoder(char_tokenizer, beam_size=4)


# ---- asr.tools.build_lm (asr build-lm) ------------------------------------------------------------------------


def write_lm(folder: Path, texts: list[str], order: int = 3, unit: str = "word") -> Path:
    manifest = folder / "lm_train.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": "x.flac", "duration": 1.0, "text": t}) + "\n"
                                for t in texts))
    out = folder / f"lm.{unit}.{order}gram.arpa"
    build_lm.main([str(manifest), str(out), "--order", str(order), "--unit", unit])
    return out


def read_arpa(path: Path) -> tuple[dict[int, int], dict[tuple, tuple[float, float]]]:
    """(declared counts per order, {ngram: (log10 prob, log10 backoff)})."""
    declared, entries, order = {}, {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("ngram "):
            n, count = line[6:].split("=")
            declared[int(n)] = int(count)
        elif line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
        elif line.strip() and not line.startswith("\\") and order:
            fields = line.split("\t")
            assert len(fields) in (2, 3), line
            ngram = tuple(fields[1].split())
            assert len(ngram) == order, line
            entries[ngram] = (float(fields[0]), float(fields[2]) if len(fields) == 3 else 0.0)
    return declared, entries


def log10_prob(entries: dict, context: tuple, w: str) -> float:
    """ARPA backoff lookup: log10 p(w | context)."""
    if context + (w,) in entries:
        return entries[context + (w,)][0]
    return entries.get(context, (0.0, 0.0))[1] + log10_prob(entries, context[1:], w)


TEXTS = ["call five two nine", "call nine", "two five", "nine four", "four two one", "call two two five"]


@pytest.mark.parametrize("order, unit", [(2, "word"), (3, "word"), (4, "word"), (6, "char")])
def test_build_lm_writes_an_arpa_whose_counts_match_and_whose_distributions_sum_to_one(tmp_path, order, unit):
    declared, entries = read_arpa(write_lm(tmp_path, TEXTS, order, unit))
    assert declared == {n: sum(len(g) == n for g in entries) for n in range(1, order + 1)}
    vocab = [g[0] for g in entries if len(g) == 1 and g[0] != "<s>"]
    words = {w for text in TEXTS for w in text.split()}
    units = words if unit == "word" else {c for w in words for c in w} | {"▁"}
    assert set(vocab) == {"<unk>", "</s>"} | units
    assert sum(10 ** entries[(w,)][0] for w in vocab) == pytest.approx(1.0, abs=1e-4)
    for context in [g for g in entries if len(g) < order and g[-1] != "</s>"]:  # every history the model has
        total = sum(10 ** log10_prob(entries, context, w) for w in vocab)
        assert total == pytest.approx(1.0, abs=1e-4), context
    for ngram in entries:  # ARPA's rule: every n-gram's prefix and suffix are themselves listed
        assert len(ngram) == 1 or (ngram[:-1] in entries and ngram[1:] in entries), ngram


def test_kenlm_loads_the_arpa_and_scores_as_it_says(tmp_path):
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    path = write_lm(tmp_path, TEXTS)
    _, entries = read_arpa(path)
    words = ["<unk>", "call", "five", "two", "zebra"]
    kenlm = KenLM(str(path), Dictionary(words))
    state, history = kenlm.start(False), ("<s>",)
    for w in ["call", "five", "two", "zebra", "two"]:  # seen trigram, backed-off ones, and an unknown word
        state, score = kenlm.score(state, words.index(w))
        expected = log10_prob(entries, history[-2:], w if (w,) in entries else "<unk>")
        assert score == pytest.approx(expected, abs=1e-4), w
        history += (w if (w,) in entries else "<unk>",)
    assert kenlm.finish(state)[1] == pytest.approx(log10_prob(entries, history[-2:], "</s>"), abs=1e-4)


def test_build_lm_reads_text_as_the_tokenizer_does_composed(tmp_path):
    """'č' written as c + combining caron (NFD, as some tools save Czech) is the one character 'č' in the LM."""
    _, entries = read_arpa(write_lm(tmp_path, ["ko\u0161ile \u010dern\u00e1", "c\u030cerna\u0301 ko\u0161ile"], 3, "char"))
    units = {g[0] for g in entries if len(g) == 1}
    assert {"\u010d", "\u00e1"} <= units and not units & {"\u030c", "\u0301"}
    assert entries[("\u010d",)][0] > entries[("<unk>",)][0]


@pytest.mark.parametrize("order", [1, 7])
def test_build_lm_refuses_an_order_kenlm_cannot_load(tmp_path, order):
    with pytest.raises(ValueError, match=f"--order must be 2 to 6 .*got {order}"):
        write_lm(tmp_path, TEXTS, order, "char")
    assert not list(tmp_path.glob("*.arpa"))


def test_build_lm_reports_a_bad_manifest_line_by_number(tmp_path):
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text('{"text": "call five"}\n{"audio_filepath": "a.flac"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        build_lm.main([str(manifest), str(tmp_path / "lm.arpa")])
    manifest.write_text('{"text": "call five"}\n{"text": "call \u2581five"}\n')  # the char LM's word boundary
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*\u2581"):
        build_lm.main([str(manifest), str(tmp_path / "lm.arpa"), "--unit", "char"])
    assert not (tmp_path / "lm.arpa").exists()
