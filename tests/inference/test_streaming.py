"""Transcriber.stream (asr.inference.streaming): a stream in pieces decodes the token ids of the whole file, finals
come at pauses and at the end, partials grow into their finals, and memory stays bounded however long the stream.

ToneStream (tests/streams.py) has known transcripts and word times; a tiny streaming checkpoint covers the real
model, its caches and the CheckpointModel adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.inference.acoustic import CheckpointModel
from asr.inference.transcriber import Transcriber
from asr.tokenizer import BLANK_ID
from tests.streams import RATE, ToneStream, speech_and_pauses
from tests.tones import FRAME, ToneModel, tones

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/inference/conftest.py




def pieces(audio: torch.Tensor, seed: int = 0, most: int = 4000) -> list[torch.Tensor]:
    """``audio`` (n,) cut at random into pieces of 1..most samples, as a microphone or a socket delivers it."""
    generator, out, at = torch.Generator().manual_seed(seed), [], 0
    while at < len(audio):
        size = int(torch.randint(1, most, (), generator=generator))
        out.append(audio[at: at + size])
        at += size
    return out


def collapse(frames: torch.Tensor) -> list[int]:
    """Greedy CTC of (T', V) frames."""
    best = frames.argmax(-1).tolist()
    return [t for i, t in enumerate(best) if t != BLANK_ID and (i == 0 or t != best[i - 1])]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stream_in_pieces_decodes_the_token_ids_of_the_whole_file(streaming_transcriber, seed):
    """Chunk by chunk, caches carried: the finals' token ids, in order, are those of the same model run over the
    whole file at the same chunk; the pauses of the audio close segments on the way."""
    audio = speech_and_pauses()
    updates = list(streaming_transcriber.stream(pieces(audio, seed), endpoint_seconds=0.4))
    whole, lengths = streaming_transcriber.model.log_probs(audio[None], torch.tensor([len(audio)]))
    expected = streaming_transcriber.decoder(whole, lengths)[0]
    finals = [u for u in updates if u.final]
    assert expected and [i for u in finals for i in u.ids] == expected
    assert len(finals) >= 2 and finals[-1].end == pytest.approx(len(audio) / RATE)
    assert all(a.end <= b.start for a, b in zip(finals, finals[1:]))  # segments in order, never overlapping


def test_partials_grow_into_their_final(streaming_transcriber):
    """Greedy decoding reads each frame once: a partial's tokens begin its final's, and each partial of a segment
    begins the next, so live captions only grow."""
    updates = list(streaming_transcriber.stream(pieces(speech_and_pauses(), 2), endpoint_seconds=0.4))
    partials = [u for u in updates if not u.final]
    assert len(partials) > len([u for u in updates if u.final])
    segment = []
    for update in updates:
        assert update.ids[: len(segment)] == segment
        segment = [] if update.final else update.ids
    assert all(w.start < w.end and 0 <= w.confidence <= 1 for u in updates for w in u.words)


def test_finals_come_at_pauses_and_at_the_end(char_tokenizer):
    """Two phrases with 1.6 s between them and none after: a final for the first while the second is still being
    fed, then a final for the second when the stream ends; words where their tones are."""
    first, first_spans = tones(char_tokenizer, "call five two nine", pause=40)
    second, second_spans = tones(char_tokenizer, "spell c a t", pause=0)
    audio = torch.from_numpy(np.concatenate([first, second]))
    words = "call five two nine spell c a t".split()
    spans = first_spans + [(a + len(first) / RATE, b + len(first) / RATE) for a, b in second_spans]
    session = Transcriber(ToneStream(char_tokenizer)).open_stream()
    fed, finals = 0.0, []
    for piece in pieces(audio, most=1600):
        fed += len(piece) / RATE
        finals += [(u, fed) for u in session.feed(piece) if u.final]
    finals += [(u, None) for u in session.finish() if u.final]
    assert [u.text for u, _ in finals] == ["call five two nine", "spell c a t"]
    (pause, fed_then), (end, fed_at_end) = finals
    assert fed_then < len(first) / RATE and fed_at_end is None  # the first came during the pause
    assert pause.end < len(first) / RATE and pause.end <= end.start
    times = [(w.start, w.end) for u, _ in finals for w in u.words]
    assert [w.word for u, _ in finals for w in u.words] == words
    for (start, stop), (a, b) in zip(times, spans):  # a 40 ms frame either way at most
        assert start == pytest.approx(a, abs=0.041) and stop == pytest.approx(b, abs=0.041)


def test_a_segment_without_a_pause_is_cut_within_max_segment_seconds(char_tokenizer):
    """Tones with short gaps for 9 s and max_segment_seconds 2: finals of at most 2 s, cut between tones, whose
    tokens are the whole stream's."""
    phrase, _ = tones(char_tokenizer, "call five two nine four", pause=0)
    audio = torch.from_numpy(np.tile(phrase, 4))
    model = ToneStream(char_tokenizer)
    updates = list(Transcriber(model).stream(pieces(audio), max_segment_seconds=2.0))
    finals = [u for u in updates if u.final]
    assert len(finals) >= 4 and all(u.end - u.start <= 2.0 + 1e-9 for u in finals)
    whole, _ = model.log_probs(audio[None], torch.tensor([len(audio)]))
    assert [i for u in finals for i in u.ids] == collapse(whole[0])


def test_memory_stays_bounded_over_a_long_stream(char_tokenizer):
    """Two and a half minutes of phrases, pauses and half a minute of silence: the frames and loudness a session
    holds never exceed max_segment_seconds', whatever has been fed; one final per phrase."""
    phrase, _ = tones(char_tokenizer, "spell c a t", pause=30)
    audio = np.concatenate([np.tile(phrase, 60), np.zeros(30 * RATE, np.float32), phrase])
    session = Transcriber(ToneStream(char_tokenizer)).open_stream(max_segment_seconds=3.0)
    finals, held = 0, []
    for at in range(0, len(audio), RATE // 2):
        finals += sum(u.final for u in session.feed(audio[at: at + RATE // 2]))
        held.append((len(session.frames), len(session.levels)))
    finals += sum(u.final for u in session.finish())
    longest = round(3.0 / ToneModel.frame_seconds) + 2 * round(0.5 / ToneModel.frame_seconds)
    assert finals == 61 and session.seconds == pytest.approx(len(audio) / RATE)
    assert max(frames for frames, _ in held) <= longest and max(levels for _, levels in held) <= 4 * longest


def test_a_model_that_cannot_stream_is_refused_with_what_to_train(char_tokenizer, checkpoint):
    with pytest.raises(ValueError, match="--model.encoder.streaming true"):
        list(Transcriber(ToneModel(char_tokenizer)).stream([torch.zeros(FRAME)]))
    with pytest.raises(ValueError, match="--model.features.norm global"):
        Transcriber.from_checkpoint(checkpoint).open_stream()


def test_a_chunk_is_whole_frames_of_the_model(streaming_transcriber):
    with pytest.raises(ValueError, match="whole number of the model's 0.04 s frames"):
        streaming_transcriber.open_stream(chunk_seconds=0.1)
    assert streaming_transcriber.open_stream(chunk_seconds=0.16).chunk == 4
    assert streaming_transcriber.open_stream().chunk == 2  # the model's model.encoder.chunk_frames


@pytest.mark.parametrize("seconds", [3600, float("inf"), float("nan"), 10 ** 400, 0, -0.08],
                         ids=["an hour", "infinite", "nan", "past floats", "zero", "negative"])
def test_a_chunk_too_long_or_not_a_length_is_refused_naming_both_commands_flags(streaming_transcriber, seconds):
    """Past MAX_CHUNK_SECONDS (an hour would be kept, then stepped at once), infinite, NaN, too large for a float, or
    not positive: a ValueError (never an OverflowError) naming asr.transcribe's and asr.serve's flags."""
    with pytest.raises(ValueError, match="--stream_chunk of asr.transcribe --stream, --chunk_seconds of asr.serve"):
        streaming_transcriber.open_stream(chunk_seconds=seconds)
    assert streaming_transcriber.open_stream(chunk_seconds=2.0).chunk == 50  # MAX_CHUNK_SECONDS of 40 ms frames


def test_stream_options_are_refused_naming_the_flags_that_exist(streaming_transcriber, char_tokenizer):
    with pytest.raises(ValueError, match=r"--endpoint_seconds \(of asr.transcribe --stream and asr.serve\) must be > 0"):
        streaming_transcriber.open_stream(endpoint_seconds=0.0)
    with pytest.raises(ValueError, match=r"^max_segment_seconds \(Transcriber.open_stream's\) must be at least 2 "):
        streaming_transcriber.open_stream(max_segment_seconds=0.04)
    full_context = ToneStream(char_tokenizer)
    full_context.chunk_frames = 0
    with pytest.raises(ValueError, match=r"chunk_frames is 0 \(full context\): give a chunk \(--stream_chunk of "
                                         r"asr.transcribe --stream, --chunk_seconds of asr.serve"):
        Transcriber(full_context).open_stream()


@pytest.mark.parametrize("objective", ["transducer", "hybrid"])
def test_a_streaming_transducer_decodes_the_token_ids_of_the_whole_file(char_tokenizer, objective):
    """Decoding goes through the model's objective: a streaming transducer's (and the hybrid's) stream gives the
    token ids of greedy search over the whole file's frames at the same chunk."""
    from asr.models.features import FeatureConfig
    from tests.conftest import encoder
    from asr.train.module import ASRModule

    torch.manual_seed(0)
    cfg = encoder(n_heads=2, ff_mult=2, dropout=0.0, block="conformer", conv_kernel=5, streaming=True, chunk_frames=2,
                  left_context=6)
    module = ASRModule(tokenizer=char_tokenizer, encoder=cfg, objective=objective,
                       features=FeatureConfig(norm="global", var_floor=0.0, quiet_db=0.0))
    transcriber = Transcriber(CheckpointModel(module.eval()))
    audio = speech_and_pauses()[: RATE]  # untrained, it emits model.transducer.max_symbols tokens on every frame
    whole, lengths = transcriber.model.log_probs(audio[None], torch.tensor([len(audio)]))
    finals = [u for u in transcriber.stream(pieces(audio, most=8000)) if u.final]
    assert [i for u in finals for i in u.ids] == transcriber.decoder(whole, lengths)[0]
