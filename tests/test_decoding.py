import torch

from asr.decoding import greedy
from asr.tokenizer import BLANK_ID

B = BLANK_ID
VOCAB = 6


def log_probs(*frames: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T', V) log-probs whose best class per frame is given, padded with frames of class 5; lengths."""
    longest = max(len(f) for f in frames)
    best = torch.tensor([f + [5] * (longest - len(f)) for f in frames])
    scores = torch.nn.functional.one_hot(best, VOCAB).float() * 4.0 + torch.rand(len(frames), longest, VOCAB)
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
