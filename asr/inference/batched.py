"""Several live streams stepped together: one encoder step over every stream that has a chunk ready, whatever
position each stream is at, so that a server's cost per chunk is one batched step instead of one step per stream.

    updates = feed_together(sessions, pieces, finals)   # one round: Session.feed of each (final: and its finish)

A round runs each stream's front end alone (its audio's feature frames, its loudness: asr.inference.streaming),
then ``advance_streams`` for the streams of each model: while any stream has a chunk of feature frames waiting, the
streams that do are stacked along the batch dimension, their caches too (asr.models.streaming.stack: each stream
keeps its own keys, values, convolution history and position, so the attention mask and rotary positions are each
stream's own), run through ONE StreamingEncoder.step and the network's head, and unstacked. A stream that has fallen
behind by several chunks takes part in as many steps; the last, shorter chunk of a stream that ends is stepped with
the other streams ending with the same number of frames. Each stream's frames, and so its partials and finals, are
those it gets streamed alone (to float rounding; tests/inference/test_batched.py), and decoding (the objective's,
CTC's or a transducer's) stays per stream: it reads the segment's frames, not the encoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from asr.models import streaming

if TYPE_CHECKING:
    from asr.inference.streaming import Session, Update


def advance_streams(network: nn.Module, audios: list[torch.Tensor], states: list[streaming.StreamState],
                    chunks: list[int], finals: list[bool]) -> list[tuple[torch.Tensor | None, streaming.StreamState]]:
    """asr.models.streaming.advance of several streams of one network at once: stream i's next audio ``audios[i]``
    (1, n_i) after ``states[i]`` at its chunk ``chunks[i]`` (``finals[i]``: its last audio) -> its frames (1, T'_i, *)
    or None, and its state after them, as ``advance`` gives each alone. Streams stepping the same number of feature
    frames share one encoder step."""
    encoder, dtype = network.encoder, next(network.encoder.parameters()).dtype
    states = [streaming.featurize(network, a, s, c, f) for a, s, c, f in zip(audios, states, chunks, finals)]
    feats, caches = [s.feats for s in states], [s.encoder for s in states]
    outputs: list[list[torch.Tensor]] = [[] for _ in states]
    while groups := ready(feats, chunks, finals, encoder):
        for (take, ahead), members in groups.items():
            batch = torch.cat([feats[i][:, :take + ahead] for i in members]).to(dtype)  # (B, take + ahead, F)
            out, cache = encoder.step(batch, streaming.stack([caches[i] for i in members]), ahead)  # (B, take / f, d)
            frames = streaming.network_frames(network, out)  # (B, take / f, *)
            for row, (i, own) in enumerate(zip(members, streaming.unstack(cache))):
                outputs[i].append(frames[row: row + 1])
                caches[i], feats[i] = own, feats[i][:, take:]
    return [(torch.cat(out, dim=1) if out else None,
             s._replace(feats=x[:, : 0 if final else x.shape[1]], encoder=cache))
            for out, s, x, cache, final in zip(outputs, states, feats, caches, finals)]


def ready(feats: list[torch.Tensor], chunks: list[int], finals: list[bool], encoder: nn.Module
          ) -> dict[tuple[int, int], list[int]]:
    """The streams with feature frames (1, m_i, F) ready for a step, by the feature frames that step takes and
    reads ahead (asr.models.streaming.step_frames)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (x, chunk, final) in enumerate(zip(feats, chunks, finals)):
        if window := streaming.step_frames(x.shape[1], chunk, encoder, final):
            groups.setdefault(window, []).append(i)
    return groups


def feed_together(sessions: list["Session"], pieces: list[np.ndarray | torch.Tensor], finals: list[bool]
                  ) -> list[list["Update"]]:
    """One round of several streams: for each session, ``session.feed(piece)`` and, ``final``, its
    ``finish()`` (the piece is its last audio; no partial comes before its finals), with the model steps of the
    sessions of one model together (their StreamingModel's ``stream_steps``; a model without it steps each
    alone). Each session's Updates, in order."""
    audios = [session.heard(piece, final) for session, piece, final in zip(sessions, pieces, finals)]
    frames: list[torch.Tensor] = [torch.zeros(0)] * len(sessions)
    by_model: dict[int, list[int]] = {}
    for i, session in enumerate(sessions):
        by_model.setdefault(id(session.model), []).append(i)
    for members in by_model.values():
        model = sessions[members[0]].model
        args = ([audios[i] for i in members], [sessions[i].state for i in members],
                [sessions[i].chunk for i in members], [finals[i] for i in members])
        steps = model.stream_steps(*args) if hasattr(model, "stream_steps") else \
            [model.stream_step(*one) for one in zip(*args)]
        for i, (own, state) in zip(members, steps):
            sessions[i].state, frames[i] = state, own
    return [session.decoded(own, final) for session, own, final in zip(sessions, frames, finals)]
