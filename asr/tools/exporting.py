"""Export a checkpoint for serving: one ``.pt2`` file that needs only torch and sentencepiece.

    python -m asr.export runs/default/version_0/checkpoints/last.ckpt model.pt2
    python -m asr.transcribe --checkpoint model.pt2 data/mini/test.jsonl

The file is a ``torch.export`` program of the whole network in fp32 eval mode (a transducer's: three), with what
decoding needs beside it; asr.inference.exported says what it holds and reads it (``load``, which imports nothing
from ``asr.models`` and refuses files whose loading would unpickle code).

Why torch.export and not TorchScript: torch 2.14 deprecates ``torch.jit.script``/``trace``
(FutureWarning), and tracing would freeze the batch's lengths into the graph. Why not ONNX:
it would add onnx/onnxruntime as dependencies. The export ends with a parity check (exported
vs checkpoint log-probs and greedy transcripts on batches of other sizes and lengths than
the example it was traced with; a transducer's frames, prediction network and joiner) and fails, writing nothing, if
they differ.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from asr.atomic import write_atomically
from asr.checkpoint import precious
from asr.inference.exported import FORMAT_VERSION, FORMATS, METADATA_FILE, TOKENIZER_FILE, ExportedModel, load
from asr.models.ctc_decoding import greedy
from asr.tokenizer import BLANK_ID

PARITY_ATOL = 1e-4  # max |exported - checkpoint| log-prob allowed; the graphs run the same ATen ops
# (batch of utterance lengths in seconds): other batch sizes and lengths than the traced example,
# including an utterance too short for one encoder frame.
PARITY_BATCHES = ((2.7, 0.4, 1.6), (0.9,), (1.1, 1.1, 0.25, 3.2, 2.0), (0.03,))
EXAMPLE_SECONDS = (1.0, 0.6)  # the batch torch.export traces with; any size and length runs afterwards


class Serving(nn.Module):
    """The graph's signature: a network whose ``statistics`` is an input like the audio and lengths."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, statistics: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(audio, lengths, statistics=statistics)


def serving_model(model: nn.Module) -> nn.Module:
    """A fp32, eval-mode copy of a network (the original is untouched), as the graph's signature."""
    import copy

    return Serving(copy.deepcopy(model).float().eval())


def example_batch(seconds: tuple[float, ...], sample_rate: int, seed: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padded (B, N) batch of quiet noise with the given durations, its lengths (B,) in samples, and statistics
    (B, 2) from a part of each: from a quarter of its samples to three quarters of them, loud in between."""
    generator = torch.Generator().manual_seed(seed)
    audio = [0.1 * torch.randn(max(1, int(s * sample_rate)), generator=generator) for s in seconds]
    lengths = torch.tensor([len(a) for a in audio])
    statistics = torch.stack([lengths // 4, lengths * 3 // 4], 1)
    for a, (start, end) in zip(audio, statistics.tolist()):
        a[start:end] *= 10  # speech framed by quieter noise: the statistics change the features
    return nn.utils.rnn.pad_sequence(audio, batch_first=True), lengths, statistics


def export_program(model: nn.Module, sample_rate: int) -> torch.export.ExportedProgram:
    """torch.export ``model`` with a dynamic batch and audio length (Dim.DYNAMIC: an error if anything specialises)."""
    dynamic = torch.export.Dim.DYNAMIC
    with torch.no_grad():
        return torch.export.export(model, example_batch(EXAMPLE_SECONDS, sample_rate), strict=False,
                                   dynamic_shapes=({0: dynamic, 1: dynamic}, {0: dynamic}, {0: dynamic}))


class PredictorStep(nn.Module):
    """The prediction network's graph: one token more for N sequences (asr.models.transducer.Predictor.step)."""

    def __init__(self, predictor: nn.Module):
        super().__init__()
        self.predictor = predictor

    def forward(self, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.predictor.step(tokens, h, c)


class JoinerPoint(nn.Module):
    """The joiner's graph: log-probabilities of N lattice points (asr.models.transducer.Joiner.join)."""

    def __init__(self, joiner: nn.Module):
        super().__init__()
        self.joiner = joiner

    def forward(self, enc: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.joiner.join(enc, context)


def decoder_programs(model: nn.Module) -> dict[str, torch.export.ExportedProgram]:
    """A transducer network's (fp32, eval) prediction network step and joiner as graphs of a dynamic batch."""
    dynamic = torch.export.Dim.DYNAMIC
    lstm, joint = model.predictor.lstm, model.joiner.output.in_features
    state = torch.zeros(lstm.num_layers, 2, lstm.hidden_size)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The tensor attributes .*lstm._flat_weights")  # nn.LSTM's own, harmless
        return {"predictor": torch.export.export(PredictorStep(model.predictor), (torch.tensor([BLANK_ID, 1]), state,
                                                 state.clone()), strict=False,
                                                 dynamic_shapes=({0: dynamic}, {1: dynamic}, {1: dynamic})),
                "joiner": torch.export.export(JoinerPoint(model.joiner), (torch.randn(2, joint), torch.randn(2, joint)),
                                              strict=False, dynamic_shapes=({0: dynamic}, {0: dynamic}))}


def decoder_metadata(module: nn.Module) -> dict:
    """What a transducer's decoding needs beside its graphs (asr.models.transducer_decoding.TransducerDecoding)."""
    lstm, cfg = module.model.predictor.lstm, module.model.cfg
    return {"state_shape": [lstm.num_layers, lstm.hidden_size], "ctc_width": module.model.ctc_width,
            "max_symbols": cfg.max_symbols, "beam_size": cfg.beam_size}


def min_samples(program: torch.export.ExportedProgram, model: nn.Module) -> int:
    """The narrowest audio batch (samples) the graph runs on: its guard on the audio width, and
    wide enough for 2 encoder frames, since torch.export assumes a traced size of 2 or more is never 1."""
    audio = next(node for node in program.graph.find_nodes(op="placeholder") if node.name == "audio")
    width = audio.meta["val"].shape[1]
    lower = int(program.range_constraints[width.node.expr].lower) if isinstance(width, torch.SymInt) else int(width)
    hop = model.features.config.hop_length
    samples = hop
    while model.encoder_frames(samples) < 2:
        samples += hop
    return max(lower, samples)


@dataclass
class Parity:
    """Exported vs checkpoint on the same batches."""

    utterances: int
    max_abs_diff: float  # over the frames inside each utterance's length
    same_lengths: bool
    same_transcripts: int  # utterances whose greedy token ids agree
    decoder_diff: float | None = None  # a transducer's: prediction network contexts and states, joiner log-probs

    @property
    def ok(self) -> bool:
        decoder = self.decoder_diff is None or self.decoder_diff <= PARITY_ATOL
        return self.same_lengths and self.same_transcripts == self.utterances and self.max_abs_diff <= PARITY_ATOL \
            and decoder

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        return (f"parity {verdict}: {self.utterances} utterances in {len(PARITY_BATCHES)} batches run twice "
                f"(statistics of all samples, of a part), max |log-prob diff| "
                f"{self.max_abs_diff:.2e} (allowed {PARITY_ATOL:.0e}), output lengths "
                f"{'equal' if self.same_lengths else 'DIFFER'}, greedy transcripts identical "
                f"{self.same_transcripts}/{self.utterances}" + ("" if self.decoder_diff is None else
                f", prediction network and joiner max |diff| {self.decoder_diff:.2e}"))


@torch.inference_mode()
def parity(model: nn.Module, exported: ExportedModel, batches=PARITY_BATCHES, decode=greedy) -> Parity:
    """Compare a network (eval mode) with its export on padded batches of the given durations (seconds), each
    with the statistics of all samples and of a part (``example_batch``): an utterance counts once per way.
    ``decode``: the network's greedy decoding (CTC's by default); the export's is its objective's. A transducer's
    prediction network and joiner are compared too (``decoder_parity``)."""
    exported_decode = exported.objective.decode if exported.objective is not None else greedy
    utterances, diff, same_lengths, same = 0, 0.0, True, 0
    for seconds in batches:
        audio, lengths, part = example_batch(seconds, exported.sample_rate, seed=len(seconds))
        for statistics in (None, part):
            want, want_lengths = model(audio, lengths, statistics=statistics)
            got, got_lengths = exported.log_probs(audio, lengths, statistics)
            same_lengths &= torch.equal(want_lengths, got_lengths.cpu())
            for b, n in enumerate(want_lengths.tolist()):
                if n:
                    diff = max(diff, (want[b, :n] - got[b, :n].cpu()).abs().max().item())
            same += sum(w == g for w, g in zip(decode(want, want_lengths), exported_decode(got.cpu(),
                                                                                           got_lengths.cpu())))
            utterances += len(seconds)
    decoder = decoder_parity(model, exported.objective) if exported.objective is not None else None
    return Parity(utterances, diff, same_lengths, same, decoder)


def decoder_parity(model: nn.Module, decoding, steps: int = 5, seed: int = 0) -> float:
    """Max |diff| of a transducer network's prediction network (contexts, states over ``steps`` random tokens of 3
    sequences) and joiner (7 random points) against an exported decoding's graphs."""
    generator = torch.Generator().manual_seed(seed)
    ours = model.predictor.step(torch.full((3,), BLANK_ID), *model.predictor.initial_state(3))  # (context, h, c)
    theirs, diff = decoding.start(3), 0.0
    for _ in range(steps):
        diff = max(diff, *((a - b.cpu()).abs().max().item() for a, b in zip(ours, theirs)))
        tokens = torch.randint(1, model.joiner.output.out_features, (3,), generator=generator)
        ours = model.predictor.step(tokens, *ours[1:])
        theirs = decoding.predict(tokens.to(decoding.device()), *theirs[1:])
    enc, context = (torch.randn(7, model.joiner.output.in_features, generator=generator) for _ in range(2))
    joined = decoding.join(enc.to(decoding.device()), context.to(decoding.device())).cpu()
    return max(diff, (model.joiner.join(enc, context) - joined).abs().max().item())


def metadata(module: nn.Module, program: torch.export.ExportedProgram, checkpoint: Path) -> dict:
    """asr.json: what decoding needs beside the graph, and where the model came from."""
    features = module.model.features.config
    objective = module.hparams.objective
    return {
        "format": FORMATS[objective], "version": FORMAT_VERSION,
        "sample_rate": features.sample_rate,
        "frame_seconds": module.model.frame_seconds,
        "min_samples": min_samples(program, module.model),
        "vocab_size": module.tokenizer.vocab_size, "blank_id": BLANK_ID,
        "features": asdict(features),
        "hyper_parameters": {k: v for k, v in module.hparams.items() if v is None or isinstance(v, (int, float, str, bool, dict))},
        "checkpoint": checkpoint.name, "torch": torch.__version__,
    } | ({"decoder": decoder_metadata(module)} if objective != "ctc" else {})


def export(checkpoint: str | Path, output: str | Path) -> Parity:
    """Export ``checkpoint`` to ``output`` (a .pt2 file), check parity, and only then move it into place.

    Raises RuntimeError (and leaves no ``output``) if the exported model disagrees with the checkpoint.
    """
    from asr.train.module import ASRModule  # here, not at the top: load() must not need asr.models.ctc

    from torch.export.pt2_archive._package import package_pt2  # torch.export.save's writer, of several graphs

    checkpoint, output = Path(checkpoint), Path(output)
    module = ASRModule.from_checkpoint(checkpoint)
    if module.hparams.objective not in FORMATS:
        raise ValueError(f"{checkpoint}: model.objective {module.hparams.objective}; asr.export writes "
                         f"{', '.join(FORMATS)} models")
    serving = serving_model(module.model)
    program = export_program(serving, module.model.sample_rate)
    programs = {"model": program} | (decoder_programs(serving.model) if module.hparams.objective != "ctc" else {})
    extra = {METADATA_FILE: json.dumps(metadata(module, program, checkpoint), indent=1),
             TOKENIZER_FILE: base64.b64encode(module.tokenizer.serialized).decode("ascii")}
    with write_atomically(output) as partial:  # never a half-written or unchecked file under the real name
        with open(partial, "wb") as f, warnings.catch_warnings():  # a file object: by name it wants .pt2
            warnings.filterwarnings("ignore", "No complete tensor found")  # said of every CPU-only model
            package_pt2(f, exported_programs=programs, extra_files=extra)
        model = module.model.float().eval()
        result = parity(model, load(partial), decode=module.objective.decoding(model).decode)
        if not result.ok:
            raise RuntimeError(f"{output}: not written, the export disagrees with {checkpoint}: {result}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asr.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .ckpt written by python -m asr.fit (a file, or FSDP's sharded folder), "
                                           "asr.average or asr.convert")
    parser.add_argument("output", help="the .pt2 file to write")
    args = parser.parse_args(argv)
    if not Path(args.checkpoint).exists():  # a file, or a sharded folder of FSDP (ASRModule.from_checkpoint)
        parser.error(f"checkpoint {args.checkpoint}: no such file")
    refused = precious(Path(args.output), [Path(args.checkpoint)])
    if refused:
        sys.exit(f"{parser.prog}: error: not written: {refused}")
    start = time.perf_counter()
    try:
        result = export(args.checkpoint, args.output)
    except (RuntimeError, OSError, ValueError) as err:  # OSError: the output's folder cannot be written, or is
        sys.exit(f"{parser.prog}: error: {err}")  # full; ValueError: a folder that is not a sharded checkpoint
    size = Path(args.output).stat().st_size / 2**20
    print(f"{args.output}: {size:.1f} MiB, exported in {time.perf_counter() - start:.1f} s\n{result}")


def run() -> None:
    """The command, as ``asr ...`` and ``python -m ...`` run it (see asr.__main__)."""
    main()


if __name__ == "__main__":
    run()
