"""What a checkpoint decodes by itself: ASRModule.transcribe_batch, the decoding its validation WER comes from.
Tests of a trained run compare the Transcriber's and the commands' transcripts with it, so a transcript that is
wrong (another checkpoint, features, decoder or sample rate) fails, not just one of the wrong type."""

from __future__ import annotations

from pathlib import Path

import torch

from asr.audio import load_audio, resample


def own_transcripts(checkpoint: Path, paths: list[Path]) -> list[str]:
    """The transcript of each audio file by ``checkpoint``'s module, one file a batch, at the model's rate."""
    from asr.train.module import ASRModule  # here: importing this helper needs no Lightning

    module = ASRModule.from_checkpoint(checkpoint)
    texts = []
    for path in paths:
        samples, rate = load_audio(path)
        audio = resample(torch.from_numpy(samples), rate, module.model.sample_rate)
        with torch.no_grad():
            texts += module.transcribe_batch(audio[None], torch.tensor([audio.numel()]))
    return texts
