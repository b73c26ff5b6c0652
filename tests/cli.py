"""Command-line pieces that several test modules pass to asr.fit."""

from dataclasses import fields

from asr.data.augment import Augmentation

# Every waveform augmentation off (configs/recipes/demo.yaml turns several on): no randomness in the data,
# so that a resumed or a distributed run can be compared with an uninterrupted single-process one.
NO_AUGMENTATION = [arg for f in fields(Augmentation) if f.name.endswith("_prob")
                   for arg in (f"--data.augmentation.{f.name}", "0")]

# Character CTC needs 40 ms encoder frames: at the demo recipe's 8x subsampling (80 ms) data/mini's speech, about 15
# characters a second, leaves too few frames for most transcripts. Tests that train characters on the demo recipe take
# the front end it had at 40 ms frames (4x at d_model channels, attention +-4 frames, a 15-frame convolution).
CHAR_FRAMES = ["--model.encoder.subsampling", "4", "--model.encoder.conv_channels", "0",
               "--model.encoder.attention_window", "4", "--model.encoder.conv_kernel", "15"]
