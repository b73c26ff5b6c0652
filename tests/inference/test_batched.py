"""asr.inference.batched: streams stepped together, started at different times and at different chunks, get
exactly the frames, partials and finals each gets streamed alone, while their encoder steps are shared."""

from __future__ import annotations

import pytest
import torch

from asr.inference.acoustic import CheckpointModel
from asr.inference.batched import advance_streams, feed_together
from asr.inference.transcriber import Transcriber
from asr.models import streaming
from tests.streams import RATE, ToneStream, batch_sizes, speech_and_pauses, streaming_module

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/inference/conftest.py





def schedule(streams: list[list[torch.Tensor]], starts: list[int]) -> list[list[tuple[int, torch.Tensor, bool]]]:
    """Rounds of (stream, piece, final): stream i joins at round starts[i], gives one piece a round, and its round
    after the last piece is its finish (an empty, final piece)."""
    rounds = [[] for _ in range(max(s + len(p) + 1 for s, p in zip(starts, streams)))]
    for i, (start, own) in enumerate(zip(starts, streams)):
        for r, piece in enumerate(own):
            rounds[start + r].append((i, piece, False))
        rounds[start + len(own)].append((i, torch.zeros(0), True))
    return rounds


def stepped_together(streaming_transcriber: Transcriber, streams: list[list[torch.Tensor]], starts: list[int],
                     chunks: list[float | None]) -> list[list]:
    """Each stream's Updates, its pieces fed in the rounds of ``schedule`` by feed_together."""
    sessions = [streaming_transcriber.open_stream(chunk, endpoint_seconds=0.4) for chunk in chunks]
    together = [[] for _ in streams]
    for work in schedule(streams, starts):
        ids, parts, finals = zip(*work)
        for i, updates in zip(ids, feed_together([sessions[i] for i in ids], list(parts), list(finals))):
            together[i] += updates
    return together


def test_streams_started_at_different_times_get_exactly_the_updates_they_get_alone(streaming_transcriber, monkeypatch):
    """Four streams of different audio in pieces of different sizes, joining at rounds 0, 2, 5 and 9, three at
    80 ms chunks and one at 160 ms, one piece each a round: every stream's partials and finals (text, times, words,
    token ids) are the ones Transcriber.stream gives it alone from the same pieces, and the rounds shared their
    encoder steps."""
    audio = [speech_and_pauses(seed) for seed in range(4)]
    streams = [list(a.split(size)) for a, size in zip(audio, (2500, 3100, 1700, 4000))]
    chunks = [0.08, 0.16, 0.08, 0.08]
    alone = [list(streaming_transcriber.stream(p, chunk, endpoint_seconds=0.4)) for p, chunk in zip(streams, chunks)]
    sizes = batch_sizes(streaming_transcriber.streaming_model.network, monkeypatch)
    together = stepped_together(streaming_transcriber, streams, [0, 2, 5, 9], chunks)
    for own, expected in zip(together, alone):
        assert [u.to_json() for u in own] == [u.to_json() for u in expected]
        assert [u.ids for u in own] == [u.ids for u in expected]
        assert sum(u.final for u in expected) >= 2  # pauses closed segments on the way
    assert max(sizes) >= 3 and len(sizes) < 0.7 * sum(sizes)  # sum(sizes): the steps of the streams alone


@torch.inference_mode()
@pytest.mark.parametrize("norm", ["global", "running"])
def test_advance_streams_gives_each_stream_the_frames_advance_gives_it_alone(char_tokenizer, norm):
    """At the network level: streams at different positions, one fallen behind by several chunks, one ending with
    a shorter last chunk, stepped together, get advance's frames and states, to float rounding (with norm running,
    each its own statistics)."""
    network = streaming_module(char_tokenizer, norm=norm).model
    audio = [speech_and_pauses(seed)[None] for seed in range(3)]
    states = [streaming.advance(network, a[:, :n], streaming.start(network), 2)[1]
              for a, n in zip(audio, (16000, 4000, 0))]
    lengths = [(16000, 21000), (4000, 40000), (0, 16000)]  # 0.3 s more; 2.25 s more (several chunks); the last 1 s
    finals = [False, False, True]
    expected = [streaming.advance(network, a[:, x:y], s, 2, f)
                for a, s, (x, y), f in zip(audio, states, lengths, finals)]
    got = advance_streams(network, [a[:, x:y] for a, (x, y) in zip(audio, lengths)], states, [2, 2, 2], finals)
    for (frames, state), (want, want_state) in zip(got, expected):
        torch.testing.assert_close(frames, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(frames.argmax(-1), want.argmax(-1))
        assert torch.equal(state.encoder.position, want_state.encoder.position)
        torch.testing.assert_close(state.encoder.keys, want_state.encoder.keys, atol=1e-5, rtol=1e-5)
        assert torch.equal(state.audio, want_state.audio) and torch.equal(state.feats, want_state.feats)
        assert all(torch.equal(got, want) for got, want in zip(state.norm, want_state.norm))


def test_a_streaming_transducers_streams_stepped_together_decode_as_alone(char_tokenizer, monkeypatch):
    """The transducer's greedy search decodes each stream's own frames: three streams joining at rounds 0, 1 and 3
    get the Updates they get alone; with a frame of look-ahead, so that streams ending in one round step with
    look-aheads of their own lengths."""
    from asr.models.features import FeatureConfig
    from tests.conftest import encoder
    from asr.train.module import ASRModule

    torch.manual_seed(0)
    cfg = encoder(n_heads=2, ff_mult=2, dropout=0.0, block="conformer", conv_kernel=5, streaming=True, chunk_frames=2,
                  left_context=6, lookahead=1)
    module = ASRModule(tokenizer=char_tokenizer, encoder=cfg, objective="transducer",
                       features=FeatureConfig(norm="global", var_floor=0.0, quiet_db=0.0))
    streaming_transcriber = Transcriber(CheckpointModel(module.eval()))
    streams = [list(speech_and_pauses(seed)[: RATE // 2].split(size)) for seed, size in enumerate((1500, 2300, 3000))]
    alone = [list(streaming_transcriber.stream(p, endpoint_seconds=0.4)) for p in streams]
    sizes = batch_sizes(streaming_transcriber.streaming_model.network, monkeypatch)
    together = stepped_together(streaming_transcriber, streams, [0, 1, 3], [None] * 3)
    assert [[u.to_json() for u in own] for own in together] == [[u.to_json() for u in a] for a in alone]
    assert all(a[-1].final and a[-1].text for a in alone) and max(sizes) >= 2


def test_a_model_without_stream_steps_is_stepped_alone_in_the_same_round(streaming_transcriber, char_tokenizer):
    """A StreamingModel of its own (ToneStream: stream_step only) beside a checkpoint's: each gets its own Updates."""
    tones = Transcriber(ToneStream(char_tokenizer))
    audio = speech_and_pauses()
    sessions = [tones.open_stream(), streaming_transcriber.open_stream()]
    expected = [list(t.stream([audio])) for t in (tones, streaming_transcriber)]
    got = [a + b for a, b in zip(feed_together(sessions, [audio, audio], [False, False]),
                                 feed_together(sessions, [torch.zeros(0)] * 2, [True, True]))]
    assert [[u.to_json() for u in g] for g in got] == [[u.to_json() for u in e] for e in expected]
