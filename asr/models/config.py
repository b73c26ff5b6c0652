"""The encoder's settings (``--model.encoder.*``): one dataclass that the subsampling, the blocks and the stack read.

Size presets (tiny ~1M ... xl ~500M parameters) are YAML files in ``asr/configs/model/``.
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
        attention_window: > 0 limits attention to this many encoder frames either side; 0 = global.
        conv_channels: channels of the subsampling convolutions; 0 = d_model.
        subsampling_conv: the subsampling's convolutions after the first: "full" 3x3, or "separable" (depthwise
            3x3 then pointwise 1x1, FastConformer's; with subsampling 8 and conv_channels 256, the GPU presets').
        block: the block type of the encoder's stack, a key of asr.models.blocks.BLOCKS ("transformer",
            "conformer"), or another encoder's key in asr.models.encoder.ENCODERS.
        conv_kernel: conformer only: depthwise convolution width in encoder frames, odd.
        conv_norm: conformer only: norm after the depthwise convolution, "layer" or "batch" (padding-masked).
    """

    d_model: int = 144
    n_heads: int = 4
    n_layers: int = 4
    ff_mult: int = 4
    dropout: float = 0.1
    attention_dropout: float = 0.0
    subsampling: int = 4
    attention_window: int = 0
    conv_channels: int = 0
    subsampling_conv: Literal["full", "separable"] = "full"
    block: str = "transformer"
    conv_kernel: int = 31
    conv_norm: Literal["layer", "batch"] = "layer"

    def __post_init__(self):
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.encoder.{name} must be in [0, 1), got {getattr(self, name):g}")
