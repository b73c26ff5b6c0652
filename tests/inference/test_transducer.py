"""Decoding a transducer (asr.models.transducer_decoding) and transcribing with one: greedy search bounded per frame and
batched, the Viterbi alignment against every path, modified beam search, and the Transcriber's paths (word times,
confidences, long files cut where nothing is emitted, non-speech, the CLI's --beam_size and --lm).

ToneTransducer is ToneModel (tests/tones.py) as a transducer: a token's frames are emitted once, at the tone's
onset, whatever was emitted before (the joiner reads the frame alone, one symbol a frame). Such a joiner cannot tell
the two onsets of a doubled letter apart in the lattice (both may be aligned to the first), so its texts have none."""

from __future__ import annotations

import itertools

import pytest
import torch

from asr.inference.transcriber import Transcriber
from asr.models.transducer_decoding import TransducerDecoding, merge
from asr.models.transducer_objectives import Hybrid, Transducer
from asr.tokenizer import BLANK_ID
from asr.inference.transcribing import main
from asr.train.module import ASRModule
from tests.conftest import encoder, save_checkpoint
from tests.models.test_transducer import CONFIG, tiny_transducer
from tests.tones import ToneModel

SINGLE_LETTERS = ["nine four", "two five", "four two one", "c a t"]  # TEXTS without a doubled letter


class ToneTransducer(ToneModel):
    """ToneModel's tones as a transducer's frames: a token's log-prob high on its tone's first frame (posterior about
    0.5 for the letters of ``doubted``, 0.99 for the others), the blank's on every other frame."""

    doubted = ""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        vocab = tokenizer.vocab_size
        self.objective = TransducerDecoding(lambda tokens, h, c: (torch.zeros(len(tokens), vocab), h, c),
                                            lambda enc, context: enc, (1, 1), max_symbols=1)

    def log_probs(self, audio, lengths):
        log_probs, lengths = super().log_probs(audio, lengths)
        best = log_probs.argmax(-1)
        before = torch.nn.functional.pad(best, (1, 0), value=BLANK_ID)[:, :-1]
        onsets = torch.where(best != before, best, BLANK_ID)
        doubted = torch.tensor([self.tokenizer.sp.piece_to_id(c) for c in self.doubted], dtype=torch.long)
        sharpness = torch.where(torch.isin(onsets, doubted), 3.0, 8.0)[..., None]
        return (torch.nn.functional.one_hot(onsets, log_probs.shape[-1]) * sharpness).log_softmax(-1), lengths


def always(token: int, vocab: int = 6) -> TransducerDecoding:
    """A decoding whose joiner always prefers ``token`` to the blank."""
    scores = torch.zeros(vocab)
    scores[token] = 5.0
    return TransducerDecoding(lambda tokens, h, c: (torch.zeros(len(tokens), 2), h, c),
                              lambda enc, context: scores.log_softmax(-1).expand(len(enc), -1), (1, 1), max_symbols=3)


def test_greedy_emits_at_most_max_symbols_a_frame_and_nothing_past_an_utterances_length():
    frames, lengths = torch.zeros(2, 4, 2), torch.tensor([4, 2])
    (ids, at), (short_ids, short_at) = always(3).greedy(frames, lengths)
    assert ids == [3] * 12 and at == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert short_ids == [3] * 6 and max(short_at) == 1


def test_batched_greedy_and_beam_search_equal_one_utterance_at_a_time(waveforms):
    model = tiny_transducer(ctc_head=True, seed=3)
    decoding = model_decoding(model)
    frames, lengths = model(*waveforms(0.5, 0.3, 0.4))
    for decode in (decoding.decode, lambda f, n: decoding.beam_search(f, n, 4)):
        batched = decode(frames, lengths)
        alone = [decode(frames[b: b + 1, : int(n)], lengths[b: b + 1])[0] for b, n in enumerate(lengths)]
        assert batched == alone and any(batched)


def model_decoding(model) -> TransducerDecoding:
    return (Hybrid if model.ctc_width else Transducer)(CONFIG).decoding(model)


def test_the_alignment_is_the_most_probable_path_through_the_lattice(waveforms):
    model = tiny_transducer(seed=5)
    decoding = model_decoding(model)
    frames, _ = model(*waveforms(0.2))  # 4 encoder frames
    frames, ids = frames[0], [3, 7, 3]
    blank, emit = decoding.lattice(decoding.encoded(frames), ids)
    best, best_frames = -float("inf"), None
    for emitted_at in itertools.combinations_with_replacement(range(len(frames)), len(ids)):  # every path
        u, score = 0, 0.0
        for t in range(len(frames)):
            while u < len(ids) and emitted_at[u] == t:
                score, u = score + emit[t, u].item(), u + 1
            score += blank[t, u].item()
        if score > best:
            best, best_frames = score, list(emitted_at)
    spans = decoding.align(frames, ids, first_frame=10)
    assert [s.token for s in spans] == ids and [s.start - 10 for s in spans] == best_frames
    assert all(s.end == s.start + 1 and 0 < s.score <= 1 for s in spans)


def test_one_token_sequence_reached_twice_adds_its_probabilities():
    hyps = {}
    merge(hyps, (3,), (torch.tensor(0.25).log().item(), "context"))
    merge(hyps, (3,), (torch.tensor(0.5).log().item(), "other"))
    assert hyps[(3,)][0] == pytest.approx(torch.tensor(0.75).log().item()) and hyps[(3,)][1] == "context"


@pytest.mark.parametrize("chunk_seconds", [0.0, 3.0])
def test_a_transducer_transcribes_with_word_times_greedily_and_by_beam_search(tone_file, char_tokenizer,
                                                                              chunk_seconds):
    path, words, spans = tone_file("twelve.flac", SINGLE_LETTERS * 3)
    model = ToneTransducer(char_tokenizer)
    greedy = Transcriber(model, chunk_seconds=chunk_seconds, overlap_seconds=1.0).transcribe_results([path])[0]
    beam = Transcriber(model, chunk_seconds=chunk_seconds, overlap_seconds=1.0,
                       decoder=model.objective.decoder(char_tokenizer, 4)).transcribe_results([path])[0]
    assert greedy.text == beam.text == " ".join(words) and greedy.words == beam.words
    assert [w.word for w in greedy.words] == words and all(0.9 < w.confidence <= 1 for w in greedy.words)
    for word, (start, end) in zip(greedy.words, spans):  # snapped to the tones' audio: a 10 ms hop either way
        assert word.start == pytest.approx(start, abs=0.011) and word.end == pytest.approx(end, abs=0.011)
    assert 0.5 < greedy.blank_share < 1  # the frames after each onset emit nothing


def test_non_speech_gives_no_words_and_min_confidence_drops_the_doubtful(tone_file, char_tokenizer, tmp_path):
    import numpy as np
    import soundfile

    silence = tmp_path / "silence.flac"
    soundfile.write(silence, np.zeros(32000, dtype=np.float32), 16000)
    model = ToneTransducer(char_tokenizer)
    nothing = Transcriber(model).transcribe_results([silence])[0]
    assert nothing.text == "" and nothing.words == [] and nothing.blank_share == 1.0
    model.doubted = "fv"
    path, _, _ = tone_file("doubt.flac", ["nine four two five one"])
    every = Transcriber(model).transcribe_results([path])[0]
    assert every.text == "nine four two five one" and min(w.confidence for w in every.words) < 0.8
    sure = Transcriber(model, min_confidence=0.8).transcribe_results([path])[0]
    assert sure.text == "nine four two one"  # "five": two doubted letters of four, "four" one


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_the_cli_runs_a_transducer_checkpoint_by_beam_search_and_refuses_an_lm(objective, char_tokenizer, corpus,
                                                                                tmp_path, capsys):
    torch.manual_seed(0)
    module = ASRModule(tokenizer=char_tokenizer, encoder=encoder(n_layers=1), objective=objective, transducer=CONFIG,
                       inter_ctc=0.0)
    checkpoint = save_checkpoint(module, tmp_path / f"{objective}.ckpt")
    audio = str(corpus.root / "audio" / "long.flac")
    for beam in ("1", "4"):
        out = tmp_path / f"{beam}.jsonl"
        assert main(["--checkpoint", str(checkpoint), audio, "--beam_size", beam, "--chunk_seconds", "2",
                     "--overlap_seconds", "0.5", "--output", str(out), "--no-progress"]) == 0
        assert 0 <= __import__("json").loads(out.read_text())["blank_share"] <= 1
    assert main(["--checkpoint", str(checkpoint), audio, "--beam_size", "4", "--lm", "lm.arpa"]) == 2
    assert "--lm, --lm_weight and --word_score are CTC's beam search's" in capsys.readouterr().err


def test_the_second_pass_reads_the_speech_again_and_keeps_its_word_times(char_tokenizer, tmp_path):
    """Speech framed by 4 s of silence a side spans under --second_pass of the file: the Transcriber runs its frames
    again (ToneModel takes no statistics: their audio alone) and the transducer's alignment keeps the file's times."""
    import numpy as np
    import soundfile

    from tests.tones import RATE, tones

    speech, spans = tones(char_tokenizer, "nine four two")
    path = tmp_path / "framed.flac"
    soundfile.write(path, np.concatenate([np.zeros(4 * RATE, np.float32), speech, np.zeros(4 * RATE, np.float32)]),
                    RATE)
    once, twice = ToneTransducer(char_tokenizer), ToneTransducer(char_tokenizer)
    one = Transcriber(once, second_pass=0.0).transcribe_results([path])[0]
    two = Transcriber(twice).transcribe_results([path])[0]
    assert (once.calls, twice.calls) == (1, 2) and one.text == two.text == "nine four two"
    assert one.words == two.words
    for word, (start, end) in zip(two.words, spans):
        assert word.start == pytest.approx(4 + start, abs=0.011) and word.end == pytest.approx(4 + end, abs=0.011)
