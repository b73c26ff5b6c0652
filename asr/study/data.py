"""The data every trial of a scaling study shares (asr/study/run.py): nested subsets of the training
manifest and one tokenizer.

Subsets are drawn once from ``seed``: one shuffle of the manifest's lines, then a prefix per
fraction, so a smaller subset is always part of a larger one. They are written to ``OUT/data``
with absolute audio paths, so a trial runs from any folder.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from asr.atomic import write_atomically
from asr.data.manifest import Utterance
from asr.data.sources import ManifestSource
from asr.tokenizer import TokenizerConfig


def subset_path(out: Path, fraction: float) -> Path:
    """The manifest of the subset holding ``fraction`` of the training lines."""
    return out / "data" / f"train-f{fraction:g}.jsonl"


def manifest_line(utt: Utterance) -> str:
    """The utterance as a manifest line (with its newline) naming its audio by absolute path."""
    entry = {"audio_filepath": str(utt.audio_filepath.resolve()), "duration": utt.duration, "text": utt.text}
    return json.dumps(entry | ({"offset": utt.offset} if utt.has_offset else {})) + "\n"


def draw_subsets(manifest: str, fractions: list[float], seed: int, out: Path) -> dict[str, dict]:
    """Nested random subsets of ``manifest`` (one shuffle from ``seed``, then prefixes), written to
    OUT/data (which must exist) with absolute audio paths.

    Returns {fraction: {"utterances", "hours"}}, also written to OUT/data/subsets.json.
    """
    utterances, problems = ManifestSource(manifest, "data.train_manifest").parse()
    if problems:
        print(f"asr.study: {len(problems)} bad lines of {manifest} are in no subset (first: {problems[0]})",
              file=sys.stderr)  # stdout stays the commands of --print_commands
    order = list(range(len(utterances)))
    random.Random(seed).shuffle(order)
    subsets = {}
    for fraction in sorted(set(fractions)):
        chosen = sorted(order[:max(1, round(fraction * len(order)))])  # file order: the sampler reorders anyway
        with write_atomically(subset_path(out, fraction)) as partial:
            partial.write_text("".join(manifest_line(utterances[i]) for i in chosen))
        subsets[f"{fraction:g}"] = {"utterances": len(chosen),
                                    "hours": sum(utterances[i].duration for i in chosen) / 3600}
    with write_atomically(out / "data" / "subsets.json") as partial:
        partial.write_text(json.dumps(subsets, indent=1))
    return subsets


def tokenizer_path(base: dict, out: Path) -> Path:
    """The tokenizer every trial uses: the base config's, or one trained once on the whole training manifest."""
    data = base["data"]
    if data["tokenizer"].get("model"):
        return Path(data["tokenizer"]["model"]).resolve()
    path = out / "data" / "tokenizer.model"
    if not path.is_file():  # trained as asr.fit would, by the DataModule
        from asr.data.datamodule import ASRDataModule

        module = ASRDataModule(train_manifest=data["train_manifest"], tokenizer=TokenizerConfig(**data["tokenizer"]))
        with write_atomically(path) as partial:
            module.tokenizer.save(partial)
    return path
