"""What CTC's frames mean (the CTC objective's decoding, asr.models.objectives.CTC): log-probabilities -> token ids,
greedily or by beam search with an optional n-gram LM; the tokens' frames by forced alignment (``align``, the Spans
word times and confidences are made of, asr.inference.result.words_of), the frames whose best class is the blank
(``blank_frames``) and where a long recording's frames may be cut (``blank_cut``, at the longest pause).
An exported model decodes with this module alone: it imports no network and, but in ``align``, no torchaudio.

Every decoder takes ``log_probs`` (B, T', V) fp32 log-softmax outputs and ``lengths`` (B,)
encoder frames, and returns one list of token ids (no blanks) per utterance, which
``Tokenizer.decode`` turns into text:

    decode = make_decoder(tokenizer, beam_size=8, lm="lm/mini.3gram.arpa", lm_weight=0.5)
    texts = [tokenizer.decode(ids) for ids in decode(log_probs, lengths)]

Beam search is flashlight-text's CTC decoder, through ``torchaudio.models.decoder.ctc_decoder``
(an optional dependency: ``pip install -e ".[lm]"``; its wheel includes KenLM). It is the
lexicon-free decoder: hypotheses are sequences of sentencepiece pieces, so any word the
tokenizer can spell can be output, with or without an LM.

The LM is an n-gram model (KenLM, ARPA or binary: what users have, and what
asr build-lm and lmplz make), over words or over characters:

- a *word* LM (``WordLM``): a piece that starts with '▁' begins a word, so it completes the word
  before it, and only then is that word scored (``lm_weight`` x its KenLM log10 probability +
  ``word_score``); the last word and ``</s>`` are scored at the end. A word the LM does not know is
  scored as KenLM's ``<unk>``: it can still be output, at the price the LM gives unknown words.
- a *character* LM (``CharLM``; ``build_lm.py --unit char``, whose vocabulary holds '▁', the word
  boundary): every character of every piece is scored as it is read, the boundary between words
  included, each adding ``lm_weight`` x its log10 probability + ``word_score``. It knows how words
  are spelled, not which words exist, so it also helps with words no training text had (an hour of
  a highly inflected language: most test words).

Why not flashlight's lexicon decoder, the usual wav2letter setup? It finishes a word as soon
as the word's last piece is read, and then can only absorb further frames of that piece as
silence. Its spellings end with a word separator that doubles as silence; sentencepiece puts
the boundary at the start of the next word instead, so every word ending in a piece that
lasts several frames came out twice ("three three"), raising dev WER from 0.08 to 0.17. It
also cannot output a word outside its lexicon.

A KenLM binary does not expose its vocabulary to Python, so next to ``X.bin`` put
``X.bin.words``, one unit (word, or character and '▁') per line (see ``lm_words``); an ARPA file
needs nothing else. A character LM made by another tool must mark word boundaries with '▁' too:
without it, its characters would be taken for words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from asr.tokenizer import BLANK_ID, UNK_ID, WORD_START, Tokenizer

try:  # optional: only beam search needs it, and BeamSearch says how to install it
    from flashlight.lib.text.decoder import LM as _FlashlightLM, LMState
except ImportError:
    _FlashlightLM = LMState = object

Decoder = Callable[[torch.Tensor, torch.Tensor], list[list[int]]]
UNK_WORD = "<unk>"  # KenLM's unknown word: what any word outside the LM's vocabulary is scored as
UNK_TEXT = "\u2047"  # what sentencepiece decodes the <unk> piece to; a word containing it is unknown
LM_ONLY_WORDS = ("<s>", "</s>", UNK_WORD)  # in the ARPA unigrams, but not words anyone says
TOKENS_PER_FRAME = 8  # each frame's most probable pieces are tried: all of them was 6x slower and changed nothing
INSTALL_HINT = 'beam search needs flashlight-text: pip install -e ".[lm]"'


def greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best class per frame, repeats merged, blanks dropped.

    log_probs (B, T', V), lengths (B,) encoder frames -> one list of token ids per utterance.
    """
    best = log_probs.argmax(dim=-1)  # (B, T')
    keep = best != BLANK_ID
    keep[:, 1:] &= best[:, 1:] != best[:, :-1]  # a repeat only counts after a change of class
    return [best[b, : int(n)][keep[b, : int(n)]].tolist() for b, n in enumerate(lengths)]


@dataclass(frozen=True)
class Span:
    """One decoded token on encoder frames [start, end) of the whole utterance; score = mean posterior (what every
    objective's ``align`` gives)."""

    token: int
    start: int
    end: int
    score: float


def align(log_probs: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]:
    """Token spans of ``ids`` on ``log_probs`` (T', V) fp32 (``torchaudio.functional.forced_align``); frames are
    counted from ``first_frame``.

    ``ids`` must be a CTC-feasible labelling of the T' frames (tokens plus repeats <= T'),
    as every CTC decoder's output is.
    """
    import torchaudio.functional as AF  # here: decoding an exported model needs no torchaudio (module docstring)

    if not ids:
        return []
    targets = torch.tensor([ids], dtype=torch.int32)
    path, scores = AF.forced_align(log_probs[None].float().contiguous(), targets, blank=BLANK_ID)
    return [Span(s.token, s.start + first_frame, s.end + first_frame, s.score)
            for s in AF.merge_tokens(path[0], scores[0].exp(), blank=BLANK_ID)]


def blank_frames(log_probs: torch.Tensor) -> int:
    """How many of the (T', V) frames' most likely class is the CTC blank."""
    return int((log_probs.argmax(-1) == BLANK_ID).sum())


def blank_cut(log_probs: torch.Tensor, lo: int, hi: int) -> int:
    """A frame in [lo, hi) to cut at: the middle of the longest run of frames whose best class is
    blank, or, with no such frame, the frame most likely blank."""
    middle = longest_run_middle((log_probs[lo:hi].argmax(-1) == BLANK_ID).tolist())
    return lo + (middle if middle is not None else int(log_probs[lo:hi, BLANK_ID].argmax()))


def longest_run_middle(flags: list[bool]) -> int | None:
    """The middle of the longest run of True in ``flags`` (the first of equals); None if there is none."""
    best, best_mid, run = 0, None, 0
    for i, flag in enumerate(flags + [False]):
        if flag:
            run += 1
        elif run:
            if run > best:
                best, best_mid = run, i - run + run // 2
            run = 0
    return best_mid


class BeamSearch:
    """CTC beam search, optionally with a word or character n-gram LM. Same arguments and result as greedy.

    Hypotheses that reach the same state (pieces so far, last frame's class) are merged by adding
    their probabilities (flashlight's log_add), so a transcript collects the mass of its
    alignments instead of its best one's: that is why beam search without an LM can beat greedy.
    With beam_size=1 nothing is ever merged, and the result is greedy's. Utterances are decoded
    one after another on the CPU.
    """

    def __init__(self, tokenizer: Tokenizer, beam_size: int = 8, lm: str | Path | None = None,
                 lm_weight: float = 0.5, word_score: float = 0.0):
        """
        Args:
            tokenizer: the checkpoint's tokenizer; output class i is its piece i (blank is BLANK_ID).
            beam_size: hypotheses kept after each frame (--beam_size).
            lm: a KenLM word or character n-gram model, ARPA or binary (--lm); None decodes without an LM.
            lm_weight: weight of the LM's log10 probabilities, against the acoustic natural-log scores.
            word_score: added per word (per character with a character LM) output: an insertion bonus;
                negative penalises. Only used with ``lm``.
        """
        if beam_size < 1:
            raise ValueError(f"--beam_size must be at least 1, got {beam_size}")
        ctc_decoder = _import_ctc_decoder()
        pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        # flashlight wants a "silence" token; sentencepiece has none, and the blank plays no other role here
        self.lm = None if lm is None else load_lm(lm, pieces, lm_weight, word_score)
        self.decoder = ctc_decoder(lexicon=None, tokens=pieces, lm=self.lm, beam_size=beam_size, lm_weight=1.0,
                                   beam_size_token=min(len(pieces), max(beam_size, TOKENS_PER_FRAME)), log_add=True,
                                   blank_token=pieces[BLANK_ID], sil_token=pieces[BLANK_ID])

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
        """log_probs (B, T', V) log-softmax, lengths (B,) encoder frames -> token ids per utterance."""
        emissions = log_probs.detach().to("cpu", torch.float32).contiguous()  # flashlight reads raw CPU fp32
        hypotheses = self.decoder(emissions, lengths.detach().cpu())
        return [best[0].tokens.tolist() if best else [] for best in hypotheses]


class NgramLM(_FlashlightLM):
    """A KenLM n-gram model, seen by flashlight's lexicon-free decoder as a model over pieces (abstract: the
    subclasses say what a unit is, in ``NOTHING_HELD``, ``read`` and ``finish``).

    flashlight calls ``score(state, piece)`` once for each new (non-blank, non-repeated) piece
    of a hypothesis. A state stands for the pieces read so far; ``memo`` keeps, per state, the
    KenLM state after the units (words or characters) completed so far, what the subclass still
    holds back (the word being spelled; for characters, whether any has been read), and the score
    the last piece added. Scores are already weighted: the decoder runs with lm_weight=1.
    ``memo`` lives for one utterance, about 64 entries per frame (8 hypotheses x 8 pieces): an
    hour of audio in one piece would hold millions; split long recordings.
    """

    NOTHING_HELD = None  # what a new utterance holds back

    def __init__(self, lm: str | Path, units: list[str], pieces: list[str], lm_weight: float, word_score: float):
        super().__init__()
        from flashlight.lib.text.decoder.kenlm import KenLM
        from flashlight.lib.text.dictionary import Dictionary

        units = [UNK_WORD, *units]
        self.unit_index = {u: i for i, u in enumerate(units)}  # a unit not in it is index 0, <unk>
        self.kenlm = KenLM(str(lm), Dictionary(units))
        self.pieces = [(p.startswith(WORD_START), p.lstrip(WORD_START)) for p in pieces]  # (starts a word, text)
        self.pieces[UNK_ID] = (False, UNK_TEXT)
        self.lm_weight, self.word_score = lm_weight, word_score
        self.memo: dict = {}  # LMState -> (KenLM state, held back, score of the piece that led here)

    def start(self, start_with_nothing: bool) -> LMState:
        self.memo.clear()  # a new utterance: the states of the last one are dead
        state = LMState()
        self.memo[state] = (self.kenlm.start(start_with_nothing), self.NOTHING_HELD, 0.0)
        return state

    def score(self, state: LMState, token: int) -> tuple[LMState, float]:
        child = state.child(token)
        if child not in self.memo:
            ken, held, _ = self.memo[state]
            self.memo[child] = self.read(ken, held, *self.pieces[token])
        return child, self.memo[child][2]

    def read(self, ken: LMState, held, starts_word: bool, text: str) -> tuple[LMState, object, float]:
        """The memo entry after reading one piece (``text`` without its '▁'; ``starts_word``: it had one)."""
        raise NotImplementedError

    def finish(self, state: LMState) -> tuple[LMState, float]:
        """flashlight's end of an utterance: the final state and the score of what was held back and </s>."""
        raise NotImplementedError

    def unit(self, ken: LMState, unit: str) -> tuple[LMState, float]:
        """KenLM state after ``unit`` (a word or a character), and its weighted score."""
        ken, log10_prob = self.kenlm.score(ken, self.unit_index.get(unit, 0))
        return ken, self.lm_weight * log10_prob + self.word_score

    def end(self, ken: LMState, score: float) -> float:
        """``score`` plus the weighted log10 p(</s> | the last units)."""
        return score + self.lm_weight * self.kenlm.finish(ken)[1]


class WordLM(NgramLM):
    """A word n-gram model: a word is scored once the piece that starts the next one (or the end) is read."""

    NOTHING_HELD = ""  # held back: the word being spelled

    def read(self, ken: LMState, partial: str, starts_word: bool, text: str) -> tuple[LMState, str, float]:
        score = 0.0
        if starts_word and partial:  # this piece begins a new word, so the one before is complete
            ken, score = self.unit(ken, partial)
            partial = ""
        return ken, partial + text, score

    def finish(self, state: LMState) -> tuple[LMState, float]:
        ken, partial, _ = self.memo[state]
        score = 0.0
        if partial:
            ken, score = self.unit(ken, partial)
        return state.child(-1), self.end(ken, score)


class CharLM(NgramLM):
    """A character n-gram model (units: characters and WORD_START between words): each scored as it is read."""

    NOTHING_HELD = False  # held back: whether a character has been read (a '▁' before the first one is not scored)

    def read(self, ken: LMState, started: bool, starts_word: bool, text: str) -> tuple[LMState, bool, float]:
        units = list(text)  # the <unk> piece's UNK_TEXT is not a character of the LM: scored as <unk>
        if starts_word and started:
            units.insert(0, WORD_START)
        score = 0.0
        for unit in units:
            ken, unit_score = self.unit(ken, unit)
            score += unit_score
        return ken, started or bool(units), score

    def finish(self, state: LMState) -> tuple[LMState, float]:
        ken, _, _ = self.memo[state]
        return state.child(-1), self.end(ken, 0.0)


def load_lm(lm: str | Path, pieces: list[str], lm_weight: float, word_score: float) -> NgramLM:
    """The KenLM model ``lm``: a CharLM if its vocabulary holds WORD_START (build_lm.py --unit char), else a WordLM."""
    units = lm_words(lm)
    kind = CharLM if WORD_START in units else WordLM
    return kind(lm, units, pieces, lm_weight, word_score)


def make_decoder(tokenizer: Tokenizer, beam_size: int = 1, lm: str | Path | None = None,
                 lm_weight: float = 0.5, word_score: float = 0.0) -> Decoder:
    """greedy when beam_size == 1 and lm is None, else BeamSearch (same arguments, see there)."""
    if beam_size == 1 and lm is None:
        return greedy
    return BeamSearch(tokenizer, beam_size, lm, lm_weight, word_score)


def lm_words(lm: str | Path) -> list[str]:
    """The units (words, or characters) a KenLM model knows, without <s>, </s>, <unk>: its ARPA unigrams, or
    ``X.bin.words`` for a binary."""
    path = Path(lm)
    if not path.is_file():
        raise FileNotFoundError(f"--lm {path}: no such file (build one with asr build-lm)")
    with path.open("rb") as f:
        is_arpa = f.read(4096).lstrip().startswith(b"\\data\\")
    if is_arpa:
        words = _arpa_unigrams(path)
    else:
        listing = path.with_name(path.name + ".words")
        if not listing.is_file():
            raise FileNotFoundError(
                f"--lm {path} is not an ARPA file, so it must be a KenLM binary, whose vocabulary we cannot read: "
                f"write its words, one a line, to {listing}, e.g. from the ARPA it was built from with\n"
                f"  awk '/^\\\\1-grams:/{{f=1; next}} /^\\\\/{{f=0}} f && NF {{print $2}}' X.arpa > {listing}")
        words = listing.read_text(encoding="utf-8").split()
    words = [w for w in words if w not in LM_ONLY_WORDS]
    if not words:
        raise ValueError(f"--lm {path}: the model has no words besides <s>, </s>, <unk>")
    return words


def _arpa_unigrams(path: Path) -> list[str]:
    """The second field of every line of the ARPA file's \\1-grams: section."""
    words, inside = [], False
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("\\"):
                if inside:
                    break
                inside = line.strip() == "\\1-grams:"
            elif inside and line.strip():
                words.append(line.split()[1])
    return words


def _import_ctc_decoder():
    """torchaudio's ctc_decoder, or an ImportError that says how to install flashlight-text."""
    try:
        import flashlight.lib.text.decoder  # noqa: F401  (torchaudio would hide its absence in a RuntimeError)
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    from torchaudio.models.decoder import ctc_decoder

    return ctc_decoder
