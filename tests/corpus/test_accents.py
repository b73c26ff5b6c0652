"""scripts/corpus/accents.py: festival's voices of other languages get every word of the mini domain, in their
encoding; the install lines name every voice's package. Needs no synthesiser (tests/corpus/test_make_corpus.py speaks
them)."""

import pytest

import scripts.corpus.accents as accents
import scripts.corpus.make_corpus as corpus
import scripts.corpus.make_heldout as make_heldout
from tests import REPO


def test_festivals_voices_of_other_languages_spell_every_word_of_the_mini_domain():
    domain = set(corpus.DIGITS + corpus.COMMANDS)
    assert set(accents.WORDS) == domain
    assert not set(corpus.FESTIVAL_VOICES) & set(make_heldout.FESTIVAL_VOICES)  # the held-out voices stay unheard
    assert not set(corpus.FESTIVAL_VOICES) & set(make_heldout.DEV_VOICES)  # so do the other-voice dev set's
    assert accents.spoken("telugu_NSK_diphone", "go left") == "గో లెఫ్ట్".encode()
    assert accents.spoken("czech_dita", "call five oh") == "kól fajv ou".encode("iso-8859-2")
    assert accents.spoken("msu_ru_nsh_clunits", "go left") == "гоу лефт".encode()
    assert accents.spoken("kal_diphone", "call five oh") == b"call five oh"  # English voices read English
    with pytest.raises(KeyError, match="hello"):
        accents.spoken("lp_diphone", "call hello")


def test_readme_and_ci_install_every_festival_voice_the_corpus_uses():
    for path in (REPO / "README.md", REPO / ".ci" / "run"):
        text = path.read_text()
        assert all(package in text for package in accents.PACKAGES.values()), path
