"""asr: train Transformer and Conformer CTC speech recognisers with PyTorch Lightning, and transcribe with them.

Subpackages: ``data`` (sources, sampling, augmentation, the DataModule), ``models`` (front end, encoders,
networks, the objectives and their decoding), ``train`` (the LightningModule, schedule, costs, resilience,
``asr fit``), ``inference`` (Transcriber, results, formats, long files, streaming), ``tools`` (export, average,
convert, import, LMs), ``study`` and ``bench``; ``configs`` holds the shipped YAML. docs/architecture.md draws the
whole.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# Modules that moved, named by class_path in the config.yaml of runs made before they did (trainer plugins and
# callbacks) or by model.objective in their config.yaml and checkpoints: the old name still imports the module from
# its new home.
MOVED = {"asr.resilience": "asr.train.resilience", "asr.cost": "asr.train.cost",
         "asr.train.objectives": "asr.models.objectives", "asr.train.transducer": "asr.models.transducer_objectives"}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of MOVED, last of all finders, and gives the module at its new name."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        pass  # already executed under its new name


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())
