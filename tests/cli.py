"""Command-line pieces that several test modules pass to asr.fit."""

import sys
from dataclasses import fields
from unittest import mock

import pytest

from asr.data.augment import Augmentation
from asr.train.fitting import run as fit_command

# Every waveform augmentation off (the default run turns several on): no randomness in the data,
# so that a resumed or a distributed run can be compared with an uninterrupted single-process one.
NO_AUGMENTATION = [arg for f in fields(Augmentation) if f.name.endswith("_prob")
                   for arg in (f"--data.augmentation.{f.name}", "0")]

# Character CTC needs 40 ms encoder frames: at the default run's 8x subsampling (80 ms) data/mini's speech, about 15
# characters a second, leaves too few frames for most transcripts. Tests that train characters on the default run take
# the front end it had at 40 ms frames (4x at d_model channels, attention +-4 frames, a 15-frame convolution).
CHAR_FRAMES = ["--model.encoder.subsampling", "4", "--model.encoder.conv_channels", "0",
               "--model.encoder.attention_window", "4", "--model.encoder.conv_kernel", "15"]


def refused(*args: str) -> str:
    """asr.fit's command with ``args`` in this process, where it must stop before training: the message it exits
    with (``python -m asr.fit`` prints it last and exits 1)."""
    with pytest.raises(SystemExit) as stop, mock.patch.object(sys, "argv", ["asr.fit"]):  # not pytest's arguments
        fit_command(list(args))
    assert isinstance(stop.value.code, str), f"exit status {stop.value.code}, not a one-line error"
    return stop.value.code


def one_line_refusal(message_out: str, message: str) -> None:
    """``message_out`` (of ``refused``) says ``message`` on its last line, after the command's name."""
    last = message_out.strip().splitlines()[-1]
    assert message_out.startswith("asr.fit: error: ") and message in last, message_out[-1000:]
