"""The encoder's settings (``--model.encoder.*``): one dataclass that the subsampling, the blocks and the stack read.

Its defaults are the default run's encoder (``python -m asr.fit``: the bundled corpus on a CPU), a 1.4M-parameter
Conformer; size presets (tiny ~1M ... conformer-1b ~1B parameters) are YAML files in ``asr/configs/model/`` that
name what differs from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EncoderConfig:
    """Shapes of the encoder (asr.models.encoder.BlockEncoder).

    Args:
        d_model: encoder width.
        n_heads: attention heads; must divide d_model.
        n_layers: encoder blocks.
        ff_mult: feed-forward width as a multiple of d_model.
        dropout: dropout on each block's residual branches and inside its feed-forward.
        attention_dropout: dropout on the attention weights (0 keeps the fused attention kernel).
        subsampling: feature frames per encoder frame, 4 or 8.
        attention_window: > 0 limits attention to this many encoder frames either side; 0 = global. A streaming
            encoder's chunks have their own bounds (chunk_frames, left_context): there it limits full context
            (training's full-context batches, whole files at chunk 0).
        conv_channels: channels of the subsampling convolutions; 0 = d_model.
        subsampling_conv: the subsampling's convolutions after the first: "full" 3x3, or "separable" (depthwise
            3x3 then pointwise 1x1, FastConformer's; with subsampling 8 and conv_channels 256, the GPU presets').
        block: the block type of the encoder's stack, a key of asr.models.blocks.BLOCKS ("transformer",
            "conformer"), or another encoder's key in asr.models.encoder.ENCODERS.
        conv_kernel: conformer only: depthwise convolution width in encoder frames, odd.
        conv_norm: conformer only: norm after the depthwise convolution, "layer" or "batch" (padding-masked).
        streaming: a streaming encoder (asr.models.streaming; conformer blocks and model.features.norm global or
            running): attention over chunks of encoder frames with left_context frames before
            each chunk, causal depthwise convolutions and subsampling, so that a frame sees no audio past the end of
            its chunk; trained with a chunk size drawn per batch (WeNet's dynamic chunk training).
        chunk_frames: streaming only: encoder frames per chunk when not training (the latency transcription runs
            at unless told otherwise; 4 at the default 80 ms frames = 320 ms); 0 = full context.
        left_context: streaming only: encoder frames before its chunk each attention layer sees (the cache each
            layer carries between chunks).
        lookahead: streaming only: encoder frames past its chunk that the first block's attention sees (R); a
            stream waits for them, so the latency grows by R frames (asr.models.streaming).
        max_chunk_frames: streaming only: training draws each batch's chunk uniformly from 1..max_chunk_frames
            frames, or full context (below).
        full_context_prob: streaming only: the share of training batches run in full context (every frame sees
            every frame), so that one model also transcribes whole files; WeNet U2's is about 0.5.
    """

    d_model: int = 96  # configs/model/conformer-tiny.yaml's size: 1.4M parameters with the front end below
    n_heads: int = 4
    n_layers: int = 6  # with d_model 96: conformer-tiny.yaml's size
    ff_mult: int = 4
    dropout: float = 0.1
    attention_dropout: float = 0.1  # regularises the bundled corpus (0 keeps the fused attention kernel)
    subsampling: int = 8  # 80 ms encoder frames, with conv_channels 48: the default run on a 2-core AVX2 CPU in
    # 11 min 20 s, not 16 min 49 s, at about the same test WER (docs/benchmarks.md, 2026-11-27)
    attention_window: int = 2  # +-160 ms: local attention generalises to unseen sentences, global attention memorises
    conv_channels: int = 48  # the first subsampling map, (B, 48, T/2, F/2), was the step's largest tensor at d_model 96
    subsampling_conv: Literal["full", "separable"] = "full"
    block: str = "conformer"  # voices never heard (leave-voice-out folds, scripts/corpus/leave_voice_out.py): WER on
    # the voices left out, 16k / 8k, 0.149 / 0.158, 0.137 / 0.173, 0.235 / 0.253 (flite rms, awb, both); the
    # Transformer (d_model 144 x 4, 64 epochs) 0.153 / 0.187, 0.164 / 0.195, 0.237 / 0.284 (docs/benchmarks.md,
    # "the default becomes a Conformer")
    conv_kernel: int = 7  # 0.56 s of encoder frames: most of the corpus' words (15 at 40 ms frames measured the same)
    conv_norm: Literal["layer", "batch"] = "layer"
    streaming: bool = False
    chunk_frames: int = 4
    left_context: int = 32
    lookahead: int = 0
    max_chunk_frames: int = 16
    full_context_prob: float = 0.5

    def __post_init__(self):
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.encoder.{name} must be in [0, 1), got {getattr(self, name):g}")
        for name in ("chunk_frames", "left_context", "lookahead"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.encoder.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_chunk_frames < 1:
            raise ValueError(f"model.encoder.max_chunk_frames must be >= 1, got {self.max_chunk_frames}")
        if not 0.0 <= self.full_context_prob <= 1.0:
            raise ValueError(f"model.encoder.full_context_prob must be in [0, 1], got {self.full_context_prob:g}")
