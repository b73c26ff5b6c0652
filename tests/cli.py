"""Command-line pieces that several test modules pass to asr.fit."""

from dataclasses import fields

from asr.data.augment import Augmentation

# Every waveform augmentation off (configs/recipes/demo.yaml turns several on): no randomness in the data,
# so that a resumed or a distributed run can be compared with an uninterrupted single-process one.
NO_AUGMENTATION = [arg for f in fields(Augmentation) if f.name.endswith("_prob")
                   for arg in (f"--data.augmentation.{f.name}", "0")]
