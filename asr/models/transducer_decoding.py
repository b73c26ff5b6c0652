"""Decoding a transducer's frames (asr.models.transducer): greedy search, modified beam search, forced alignment
(word times and confidences), silent frames and cut points. The prediction network and the joiner are callables,
so a checkpoint's modules and an exported model's graphs (asr.tools.exporting) decode alike:

    predict(tokens (N,), h, c (layers, N, pred_dim)) -> context (N, J), h, c     one token more for N sequences
    join(enc (N, J), context (N, J)) -> log-probabilities (N, V) fp32             one lattice point each

A frame is (J,) encoder states in the joint space, after the hybrid's (V,) CTC log-probabilities when ``ctc_width``
is V. Every sequence starts from the zero state and the blank (asr.tokenizer.BLANK_ID). This module imports no
network and no torchaudio (nor does asr.models.ctc_decoding, but in CTC's align): an exported transducer
(asr.inference.exported) decodes with it.

- greedy (``decode``): batched and frame-synchronous: on each frame every utterance emits its best token until it
  is the blank, at most ``max_symbols`` tokens a frame (icefall's greedy_search with max_sym_per_frame).
- modified beam search (``decoder(tokenizer, beam_size)``): ``beam_size`` hypotheses, merged when their tokens are
  the same (their probabilities added); on a frame a hypothesis ends the frame by the blank or emits, up to
  ``max_symbols`` rounds, and a token of the last round ends the frame itself (icefall's modified_beam_search, which
  is this with one round: a token and a frame at once). Utterances are searched one after another.
- ``align``: the most probable path of given tokens through the (T', U+1) lattice (Viterbi): each token's frame,
  and its posterior there as its confidence (asr.inference.result.words_of groups these Spans into words).
- ``silent_frames`` and ``cut``: frames where greedy search emits nothing; a hybrid asks its CTC head's blanks.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from asr.models.ctc_decoding import Decoder, Span, blank_cut, blank_frames, longest_run_middle
from asr.tokenizer import BLANK_ID, Tokenizer

Predict = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
Join = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LATTICE_VALUES = 1 << 22  # log-probabilities the alignment computes at once (16 MB of fp32)


class TransducerDecoding:
    """What asr.inference asks of a transducer's objective (asr.models.objectives.Decoding).

    Args:
        predict, join: the prediction network's step and the joiner (module docstring).
        state_shape: (layers, pred_dim) of the prediction network's LSTM state.
        ctc_width: the hybrid's CTC log-probabilities at the start of each frame (V), else 0.
        max_symbols: tokens emitted on one frame at most.
        beam_size: modified beam search's hypotheses, when asked for beam search without a size.
        device: where predict and join run (a callable: a checkpoint's module may move after this is made).
    """

    def __init__(self, predict: Predict, join: Join, state_shape: tuple[int, int], ctc_width: int = 0,
                 max_symbols: int = 4, beam_size: int = 4,
                 device: Callable[[], torch.device] = lambda: torch.device("cpu")):
        self.predict, self.join, self.state_shape = predict, join, state_shape
        self.ctc_width, self.max_symbols, self.beam_size, self.device = ctc_width, max_symbols, beam_size, device

    def start(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The context, h and c of ``n`` sequences of no token yet."""
        h = torch.zeros(self.state_shape[0], n, self.state_shape[1], device=self.device())
        return self.predict(torch.full((n,), BLANK_ID, device=h.device), h, h.clone())

    def encoded(self, frames: torch.Tensor) -> torch.Tensor:
        """The encoder states in the joint space of frames (..., [V +] J), on the device, fp32."""
        return frames[..., self.ctc_width:].to(self.device(), torch.float32)

    @torch.no_grad()
    def decode(self, frames: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
        """Greedy search: frames (B, T', [V +] J), lengths (B,) encoder frames -> token ids per utterance."""
        return [ids for ids, _ in self.greedy(frames, lengths)]

    def greedy(self, frames: torch.Tensor, lengths: torch.Tensor) -> list[tuple[list[int], list[int]]]:
        """Per utterance: the token ids greedy search emits, and the frame of each."""
        enc, lengths = self.encoded(frames), [int(n) for n in lengths]
        context, h, c = self.start(len(lengths))
        ids, at = [[] for _ in lengths], [[] for _ in lengths]
        for t in range(max(lengths, default=0)):
            alive = torch.tensor([n > t for n in lengths], device=enc.device)
            for _ in range(self.max_symbols):
                best = self.join(enc[:, t], context).argmax(-1)  # (B,)
                emit = alive & (best != BLANK_ID)
                rows = emit.nonzero()[:, 0].tolist()
                if not rows:
                    break
                new_context, new_h, new_c = self.predict(best, h, c)
                context = torch.where(emit[:, None], new_context, context)
                h, c = (torch.where(emit[None, :, None], new, old) for new, old in ((new_h, h), (new_c, c)))
                for b, token in zip(rows, best[rows].tolist()):
                    ids[b].append(token)
                    at[b].append(t)
                alive = emit  # only an utterance that emitted may emit again on this frame
        return list(zip(ids, at))

    def decoder(self, tokenizer: Tokenizer, beam_size: int = 1, lm: str | None = None, **options) -> Decoder:
        """Greedy search for ``beam_size`` 1, else modified beam search of that many hypotheses; no LM."""
        if lm is not None or options:
            raise ValueError("--lm, --lm_weight and --word_score are CTC's beam search's; a transducer's beam search "
                             "runs without an LM (leave them out)")
        return self.decode if beam_size == 1 else partial(self.beam_search, beam_size=beam_size)

    @torch.no_grad()
    def beam_search(self, frames: torch.Tensor, lengths: torch.Tensor, beam_size: int | None = None
                    ) -> list[list[int]]:
        """Modified beam search (module docstring), one utterance after another -> token ids per utterance."""
        enc = self.encoded(frames)
        return [self.search(enc[b, : int(n)], beam_size or self.beam_size) for b, n in enumerate(lengths)]

    def search(self, enc: torch.Tensor, beam: int) -> list[int]:
        """The best token sequence for one utterance's (T', J) encoder states."""
        context, h, c = self.start(1)
        hyps = {(): (0.0, context[0], h[:, 0], c[:, 0])}  # tokens -> (log-prob, context, h, c)
        for t in range(len(enc)):
            hyps = dict(sorted(self.frame(enc[t], hyps, beam).items(), key=lambda item: -item[1][0])[:beam])
        return list(max(hyps, key=lambda tokens: hyps[tokens][0]))

    def frame(self, enc: torch.Tensor, hyps: dict, beam: int) -> dict:
        """The hypotheses that end this frame: ``max_symbols`` rounds of ``expand`` at most, the tokens of the last
        round ending it themselves; a round's extensions go on only while they could still make the beam."""
        ended, pool = {}, hyps
        for round_ in range(1, self.max_symbols + 1):
            emitted = self.expand(enc, pool, ended, beam)
            if round_ == self.max_symbols:
                for tokens, hyp in emitted.items():
                    merge(ended, tokens, hyp)
                break
            scores = sorted((hyp[0] for hyp in ended.values()), reverse=True)
            floor = scores[beam - 1] if len(scores) >= beam else -float("inf")  # scores only fall with more tokens
            pool = {tokens: hyp for tokens, hyp in emitted.items() if hyp[0] > floor}
            if not pool:
                break
        return ended

    def expand(self, enc: torch.Tensor, pool: dict, ended: dict, beam: int) -> dict:
        """One round on a frame: each hypothesis of ``pool`` ending the frame by the blank goes to ``ended``
        (merged); the ``beam`` best of all one-token extensions are returned, their contexts predicted."""
        keys = list(pool)
        scores = torch.tensor([pool[k][0] for k in keys], device=enc.device)
        log_probs = self.join(enc.expand(len(keys), -1), torch.stack([pool[k][1] for k in keys]))  # (N, V)
        for i, k in enumerate(keys):
            merge(ended, k, (float(scores[i] + log_probs[i, BLANK_ID]), *pool[k][1:]))
        extended = scores[:, None] + log_probs
        extended[:, BLANK_ID] = -torch.inf
        best = extended.flatten().topk(min(beam, extended.numel() - len(keys)))
        rows, tokens = best.indices // log_probs.shape[1], best.indices % log_probs.shape[1]
        h = torch.stack([pool[keys[i]][2] for i in rows.tolist()], 1)
        c = torch.stack([pool[keys[i]][3] for i in rows.tolist()], 1)
        context, h, c = self.predict(tokens, h, c)
        return {keys[i] + (token,): (score, context[j], h[:, j], c[:, j])
                for j, (i, token, score) in enumerate(zip(rows.tolist(), tokens.tolist(), best.values.tolist()))}

    @torch.no_grad()
    def align(self, frames: torch.Tensor, ids: list[int], first_frame: int = 0) -> list[Span]:
        """The Viterbi path of ``ids`` on one utterance's frames (T', [V +] J): per token, the frame it is emitted on
        (counted from ``first_frame``) and its posterior there."""
        if not ids or not len(frames):
            return []
        blank, emit = self.lattice(self.encoded(frames), ids)  # (T', U+1), (T', U)
        entries, before = [], torch.full((len(ids) + 1,), -torch.inf, dtype=torch.float64)
        before[0] = 0.0  # arriving at frame 0, no token emitted yet
        for t in range(len(blank)):
            emitted = torch.cat([emit.new_zeros(1), emit[t].cumsum(0)])  # log-prob of tokens 0..u-1 on frame t
            best, entry = torch.cummax(before - emitted, 0)  # the column the path arrived at frame t in
            entries.append(entry)
            before = emitted + best + blank[t]  # leaving frame t by the blank
        spans, u = [], len(ids)
        for t in range(len(blank) - 1, -1, -1):
            k = int(entries[t][u])
            spans += [Span(ids[j], t + first_frame, t + first_frame + 1, float(emit[t, j].exp()))
                      for j in range(u - 1, k - 1, -1)]
            u = k
        return spans[::-1]

    def lattice(self, enc: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The blank's log-probs (T', U+1) and each next token's (T', U) at every lattice point, float64 on the CPU."""
        contexts, (context, h, c) = [], self.start(1)
        for token in [*ids, None]:
            contexts.append(context[0])
            if token is not None:
                context, h, c = self.predict(torch.tensor([token], device=enc.device), h, c)
        contexts = torch.stack(contexts)  # (U+1, J)
        targets = torch.tensor(ids, device=enc.device)
        blank, emit = [], []
        step = max(1, LATTICE_VALUES // (len(contexts) * self.vocab_size(enc, contexts)))
        for t in range(0, len(enc), step):
            chunk = enc[t: t + step]
            n, u1 = len(chunk), len(contexts)
            log_probs = self.join(chunk[:, None].expand(n, u1, -1).reshape(n * u1, -1),
                                  contexts[None].expand(n, u1, -1).reshape(n * u1, -1)).view(n, u1, -1)
            blank.append(log_probs[..., BLANK_ID])
            emit.append(log_probs[:, :-1].gather(-1, targets.expand(n, -1)[..., None])[..., 0])
        return torch.cat(blank).double().cpu(), torch.cat(emit).double().cpu()

    def vocab_size(self, enc: torch.Tensor, contexts: torch.Tensor) -> int:
        """V, from one lattice point."""
        return self.join(enc[:1], contexts[:1]).shape[-1]

    @torch.no_grad()
    def silent_frames(self, frames: torch.Tensor) -> int:
        """Frames on which nothing is emitted: greedy search's, or the hybrid's CTC blanks."""
        if self.ctc_width:
            return blank_frames(frames[:, : self.ctc_width])
        _, at = self.greedy(frames[None], torch.tensor([len(frames)]))[0]
        return len(frames) - len(set(at))

    @torch.no_grad()
    def cut(self, frames: torch.Tensor, lo: int, hi: int) -> int:
        """A frame in [lo, hi) to cut at: the middle of the longest run of frames on which greedy search (of the
        frames up to ``hi``) emits nothing, else of [lo, hi); a hybrid's CTC blanks (CTC's cut)."""
        if self.ctc_width:
            return blank_cut(frames[:, : self.ctc_width], lo, hi)
        hi = min(hi, len(frames))
        _, at = self.greedy(frames[None, :hi], torch.tensor([hi]))[0]
        emitting = set(at)
        middle = longest_run_middle([t not in emitting for t in range(lo, hi)])
        return lo + (middle if middle is not None else (hi - lo) // 2)


def merge(hyps: dict, tokens: tuple[int, ...], hyp: tuple) -> None:
    """Add ``hyp`` (log-prob, context, h, c) under ``tokens``; the same tokens reached twice add their probabilities."""
    if tokens in hyps:
        hyp = (float(torch.logaddexp(torch.tensor(hyps[tokens][0]), torch.tensor(hyp[0]))), *hyps[tokens][1:])
    hyps[tokens] = hyp
