"""asr.models.streaming: a streaming encoder's chunks see no further than they say, a stream in pieces gives the
frames of the whole file, its caches keep their size, and training draws its chunk per batch; global feature
normalisation (asr.models.features, norm "global") learns in training and scales each frame alone."""

from __future__ import annotations

import pytest
import torch

from asr.models import streaming
from asr.models.ctc import CTCModel
from asr.models.encoder import build_encoder
from asr.models.features import FeatureConfig, FeatureExtractor
from tests.conftest import encoder, save_checkpoint


def streaming_model(subsampling: int = 4, chunk: int = 3, left: int = 5, seed: int = 0, norm: str = "global",
                    **overrides) -> CTCModel:
    """A tiny streaming Conformer-CTC (d_model 32, 2 blocks, kernel 5) with ``norm`` normalisation, in eval mode."""
    torch.manual_seed(seed)
    settings = {"ff_mult": 2, "dropout": 0.0, "subsampling": subsampling, "block": "conformer", "conv_kernel": 5,
                "streaming": True, "chunk_frames": chunk, "left_context": left}
    cfg = encoder(**settings | overrides)
    model = CTCModel(FeatureConfig(16000, norm=norm, var_floor=0.0, quiet_db=0.0), cfg, 12).eval()
    model.features.global_mean.fill_(-4.0)  # statistics as if trained, so that a stream's own ones differ from them
    model.features.global_var.fill_(3.0)
    return model


def noise(seconds: float, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, int(seconds * 16000), generator=torch.Generator().manual_seed(seed)) * 0.1


def streamed(model: CTCModel, audio: torch.Tensor, chunk: int, seed: int = 1, most: int = 3000):
    """The frames of ``audio`` (1, n) fed in pieces of 1..most samples, and the state after the last."""
    generator, state, outputs, at = torch.Generator().manual_seed(seed), streaming.start(model), [], 0
    while at < audio.shape[1]:
        size = int(torch.randint(1, most, (), generator=generator))
        frames, state = streaming.advance(model, audio[:, at: at + size], state, chunk)
        outputs += [] if frames is None else [frames]
        at += size
    frames, state = streaming.advance(model, audio[:, :0], state, chunk, final=True)
    return torch.cat([*outputs, *([] if frames is None else [frames])], dim=1), state


@pytest.mark.parametrize("subsampling, chunk, norm, lookahead", [
    (4, 1, "global", 0), (4, 3, "global", 0), (8, 2, "global", 0), (4, 1, "running", 0), (8, 2, "running", 0),
    (4, 1, "global", 2), (4, 3, "running", 1), (8, 2, "running", 3)])
@torch.inference_mode()
def test_a_stream_in_pieces_gives_the_frames_of_the_whole_file(subsampling, chunk, norm, lookahead):
    """Also with look-ahead: each chunk's first block reads the frames after it, the last chunk none."""
    model = streaming_model(subsampling, norm=norm, lookahead=lookahead)
    model.encoder.chunk = chunk
    audio = noise(2.1)
    audio[:, 16000:] *= 5  # louder after 1 s: the running statistics move while the stream goes
    whole, lengths = model(audio, torch.tensor([audio.shape[1]]))
    frames, _ = streamed(model, audio, chunk)
    assert frames.shape == whole.shape and int(lengths) == audio.shape[1] // 160 // subsampling
    torch.testing.assert_close(frames, whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(frames.argmax(-1), whole.argmax(-1))


@pytest.mark.parametrize("lookahead", [0, 2])
@torch.inference_mode()
def test_a_frame_sees_no_audio_past_its_chunk_its_look_ahead_and_the_feature_window(lookahead):
    """Changing audio from the first sample past chunk 1's look-ahead's last feature window leaves chunks 0 and 1
    as they were; one sample earlier changes chunk 1: the look-ahead is exactly what algorithmic_latency states."""
    model, chunk, f = streaming_model(4, chunk=3, lookahead=lookahead), 3, 4
    audio = noise(2.0)
    boundary = ((2 * chunk + lookahead) * f - 1) * 160 + 400  # past the last sample of chunk 1's last window
    assert streaming.algorithmic_latency(model.encoder, chunk, 0.025) == pytest.approx(
        (chunk + lookahead) * f * 0.01 + 0.015)
    lengths = torch.tensor([audio.shape[1]])
    base = model(audio, lengths)[0]
    later, earlier = audio.clone(), audio.clone()
    later[:, boundary:] += 0.5
    earlier[:, boundary - 1:] += 0.5
    assert torch.equal(model(later, lengths)[0][:, : 2 * chunk], base[:, : 2 * chunk])
    assert not torch.equal(model(earlier, lengths)[0][:, chunk: 2 * chunk], base[:, chunk: 2 * chunk])
    model.encoder.chunk = 0  # full context: the first frame hears the end
    assert not torch.allclose(model(later, lengths)[0][:, 0], model(audio, lengths)[0][:, 0])


@torch.inference_mode()
def test_an_attention_window_bounds_what_full_context_sees_as_the_offline_encoders():
    """Whole files (chunk 0) with attention_window 1: the first frame of a 2-block model with 1-frame convolutions
    sees encoder frames 0-2 (feature frames up to 11), so audio from feature frame 18's window on leaves it exactly
    as it was; without the window it hears the whole file."""
    audio = noise(1.5)
    lengths = torch.tensor([audio.shape[1]])
    changed = audio.clone()
    changed[:, 20 * 160:] += 0.5  # in the windows of feature frames 18 on: encoder frames 4 on (4x)
    windowed = streaming_model(4, chunk=0, attention_window=1, conv_kernel=1)
    assert torch.equal(windowed(changed, lengths)[0][:, 0], windowed(audio, lengths)[0][:, 0])
    assert not torch.allclose(windowed(changed, lengths)[0][:, 4], windowed(audio, lengths)[0][:, 4])
    whole = streaming_model(4, chunk=0, attention_window=0, conv_kernel=1)
    assert not torch.allclose(whole(changed, lengths)[0][:, 0], whole(audio, lengths)[0][:, 0])


@torch.inference_mode()
def test_left_context_bounds_what_a_chunk_sees_of_the_past():
    """With left_context frames of attention and causal convolutions, a chunk still hears the past through the
    layers, but a model with 0 frames of left context and kernel 1 hears only its own chunk."""
    model = streaming_model(4, chunk=2, left=0, conv_kernel=1)
    audio = noise(1.5)
    lengths = torch.tensor([audio.shape[1]])
    changed = audio.clone()
    changed[:, : 8 * 160] += 0.5  # the first 8 feature frames: encoder frames 0 and 1 (chunk 0) and frame 2's front
    a, b = model(audio, lengths)[0], model(changed, lengths)[0]
    assert torch.equal(a[:, 4:], b[:, 4:]) and not torch.allclose(a[:, :2], b[:, :2])


@torch.inference_mode()
def test_the_caches_keep_their_size_however_long_the_stream():
    model = streaming_model(8, chunk=2, left=4)
    _, short = streamed(model, noise(0.5), 2)
    _, long = streamed(model, noise(6.0, seed=3), 2, most=16000)
    first = streaming.start(model)
    for name in ("features", "keys", "values", "conv"):
        shape = getattr(first.encoder, name).shape
        assert getattr(short.encoder, name).shape == getattr(long.encoder, name).shape == shape, name
    assert first.encoder.keys.shape == (2, 1, 4, 4, 8)  # layers, B, H, left_context, d / H
    assert long.audio.shape[1] == long.feats.shape[1] == 0  # an ended stream keeps no audio or features
    assert int(long.encoder.position) == 6 * 16000 // 160 // 8


@pytest.mark.parametrize("lookahead", [0, 1])
@torch.inference_mode()
def test_stacked_caches_step_streams_at_different_positions_as_each_alone(lookahead):
    """stack joins streams' caches along their batch dimension and unstack splits them again: one step over a
    stream at its start, one 1 s in and one 0.3 s in gives each the states and caches of its own step."""
    model = streaming_model(4, chunk=3, left=5, lookahead=lookahead)
    states = [streaming.start(model).encoder] + [streamed(model, noise(s, seed=i), 3)[1].encoder
                                                 for i, s in enumerate((1.0, 0.3))]
    ahead = 4 * lookahead
    feats = torch.randn(3, 12 + ahead, model.encoder.subsampling.n_feats, generator=torch.Generator().manual_seed(5))
    alone = [model.encoder.step(feats[i: i + 1], state, ahead) for i, state in enumerate(states)]
    together, caches = model.encoder.step(feats, streaming.stack(states), ahead)
    assert together.shape[1] == 3
    assert [int(s.position) for s in states] == [0, 25, 7]
    for (states_alone, cache_alone), row, cache in zip(alone, together, streaming.unstack(caches)):
        torch.testing.assert_close(row[None], states_alone, atol=1e-5, rtol=1e-5)
        for name, tensor in cache._asdict().items():
            assert tensor.shape == getattr(cache_alone, name).shape, name
            torch.testing.assert_close(tensor, getattr(cache_alone, name), atol=1e-5, rtol=1e-5)
    restacked = streaming.stack(streaming.unstack(caches))
    assert all(torch.equal(a, b) for a, b in zip(restacked, caches))


@pytest.mark.parametrize("lookahead", [0, 2])
@torch.inference_mode()
def test_samples_wanted_is_exactly_the_audio_that_completes_the_next_chunk(lookahead):
    """At the start and 0.37 s into a stream: one sample less than samples_wanted gives no frames, that many gives
    the chunk's, and then the next chunk wants a chunk's hop of audio more (its look-ahead is there already)."""
    model, chunk = streaming_model(4, chunk=3, lookahead=lookahead), 3
    audio = noise(2.0)
    for at in (0, 5920):
        state = streaming.advance(model, audio[:, :at], streaming.start(model), chunk)[1]
        wanted = streaming.samples_wanted(model, state, chunk)
        short, after_short = streaming.advance(model, audio[:, at: at + wanted - 1], state, chunk)
        frames, after = streaming.advance(model, audio[:, at: at + wanted], state, chunk)
        assert short is None and frames.shape[1] == chunk and wanted > 0
        assert streaming.samples_wanted(model, after_short, chunk) == 1
        assert streaming.samples_wanted(model, after, chunk) == chunk * 4 * 160  # a chunk of 10 ms hops
    frames = (chunk + lookahead) * 4  # the first chunk's and its look-ahead's windows of 25 ms
    assert streaming.samples_wanted(model, streaming.start(model), chunk) == (frames - 1) * 160 + 400


@torch.inference_mode()
def test_padding_does_not_change_an_utterance():
    model = streaming_model(4)
    audio = torch.cat([noise(1.3), torch.zeros(1, 8000)], dim=1)
    alone = model(audio[:, :20800], torch.tensor([20800]))[0]
    batch = model(torch.cat([audio, noise(1.8, seed=2)]), torch.tensor([20800, 28800]))[0]
    torch.testing.assert_close(batch[0, : alone.shape[1]], alone[0], atol=1e-5, rtol=1e-5)


def test_training_draws_each_batchs_chunk_full_context_some_of_the_time():
    enc = build_encoder(encoder(block="conformer", streaming=True, max_chunk_frames=4, full_context_prob=0.3), 80)
    torch.manual_seed(0)
    drawn = [enc.training_chunk() for _ in range(400)]
    assert set(drawn) == {0, 1, 2, 3, 4} and 0.2 < drawn.count(0) / 400 < 0.4
    torch.manual_seed(0)
    assert [enc.training_chunk() for _ in range(400)] == drawn  # seeded by the run's seed


@pytest.mark.parametrize("overrides", [{}, {"lookahead": 2, "full_context_prob": 0.0}])  # the second: in chunks
def test_training_runs_a_padded_batch_at_a_drawn_chunk_and_keeps_gradients_finite(overrides):
    model = streaming_model(4, dropout=0.1, attention_dropout=0.1, **overrides).train()
    audio = torch.cat([noise(1.0), noise(1.0, seed=1)])
    log_probs, lengths = model(audio, torch.tensor([16000, 12000]))
    log_probs[0, : int(lengths[0])].sum().backward()
    assert all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())


def test_a_streaming_encoder_refuses_what_cannot_stream():
    with pytest.raises(ValueError, match="model.encoder.block conformer"):
        build_encoder(encoder(streaming=True, block="transformer"), 80)


def test_global_normalisation_learns_in_training_and_holds_outside_it():
    extractor = FeatureExtractor(FeatureConfig(16000, norm="global", var_floor=0.0, quiet_db=0.0))
    audio = torch.cat([noise(1.0), torch.zeros(1, 16000)])
    audio[1, :8000] = noise(0.5, seed=4)
    lengths = torch.tensor([16000, 8000])
    power = extractor.log_power(audio, lengths)
    inside = torch.cat([power[0, :100], power[1, :50]])  # the frames inside the utterances
    extractor.train()(audio, lengths)
    torch.testing.assert_close(extractor.global_mean, inside.mean(0))  # the first batch: its own statistics
    torch.testing.assert_close(extractor.global_var, inside.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    extractor.eval()
    feats, frames = extractor(audio, lengths)
    torch.testing.assert_close(extractor.global_mean, inside.mean(0))  # outside training they stay
    assert torch.equal(frames, torch.tensor([100, 50])) and not feats[1, 50:].any()
    alone, _ = extractor(audio[1:, :8000], lengths[1:])
    torch.testing.assert_close(alone[0], feats[1, :50])  # each frame alone: no statistics of its utterance


def test_causal_normalisations_refuse_per_utterance_settings():
    for norm in ("global", "running"):
        with pytest.raises(ValueError, match="quiet_db"):
            FeatureConfig(norm=norm, quiet_db=6.0)
    extractor = FeatureExtractor(FeatureConfig(norm="bin"))
    with pytest.raises(ValueError, match="norm global or running"):
        extractor.stream_frames(noise(1.0), extractor.start_sums(1))


@torch.inference_mode()
def test_running_normalisation_sees_no_later_frame_and_takes_out_a_recordings_gain():
    """Norm "running" (online CMVN): a frame's features do not change with the audio after it; a recording 20 dB
    louder gives nearly the features of the quiet one once its own statistics outweigh the global ones, where the
    global statistics leave the whole offset in; each utterance of a padded batch is scaled by its own frames."""
    running, fixed = (FeatureExtractor(FeatureConfig(16000, norm=n, var_floor=0.0, quiet_db=0.0)).eval()
                      for n in ("running", "global"))
    audio = noise(10.0)
    lengths = torch.tensor([audio.shape[1]])
    base = running(audio, lengths)[0]
    changed = audio.clone()
    changed[:, 5 * 16000:] *= 10
    assert torch.equal(running(changed, lengths)[0][:, : 5 * 100 - 2], base[:, : 5 * 100 - 2])  # 25 ms windows
    loud = 10 * audio
    for extractor in (running, fixed):
        extractor.global_mean.fill_(-4.0)
    offset = {name: (extractor(loud, lengths)[0] - extractor(audio, lengths)[0])[0, -100:].abs().mean()
              for name, extractor in (("running", running), ("global", fixed))}
    assert offset["global"] > 2.0 and offset["running"] < 0.15 * offset["global"], offset
    batch = torch.cat([noise(3.0, seed=1), torch.cat([5 * noise(1.5, seed=2), torch.zeros(1, 24000)], 1)])
    feats, frames = running(batch, torch.tensor([48000, 24000]))
    alone, _ = running(batch[1:, :24000], torch.tensor([24000]))
    torch.testing.assert_close(feats[1, : int(frames[1])], alone[0])
    assert not feats[1, int(frames[1]):].any()


def test_a_streaming_checkpoint_keeps_its_settings_and_statistics(tmp_path, char_tokenizer):
    from asr.train.module import ASRModule

    torch.manual_seed(0)
    cfg = encoder(block="conformer", conv_kernel=5, streaming=True, chunk_frames=2, left_context=6)
    module = ASRModule(tokenizer=char_tokenizer, encoder=cfg, features=FeatureConfig(norm="global", quiet_db=0.0))
    module.model.features.global_mean.fill_(-3.0)
    loaded = ASRModule.from_checkpoint(save_checkpoint(module, tmp_path / "s.ckpt"))
    assert loaded.model.encoder.chunk == 2 and loaded.model.encoder.cfg.left_context == 6
    assert streaming.streams(loaded.model) and float(loaded.model.features.global_mean[0]) == -3.0


def test_activation_checkpointing_leaves_a_streaming_encoders_gradients_unchanged():
    """checkpoint_every recomputes blocks with the same chunk mask: the batch's drawn chunk is an input, not drawn
    again in the backward pass."""
    grads = []
    for every in (0, 1):
        model = streaming_model(4).train()
        model.encoder.checkpoint_every = every
        torch.manual_seed(5)  # the same chunk drawn
        log_probs, lengths = model(torch.cat([noise(1.0), noise(1.0, seed=1)]), torch.tensor([16000, 11000]))
        log_probs[0].sum().backward()
        grads.append([p.grad.clone() for p in model.encoder.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
