"""What the export tests share (tests/tools/test_export.py, test_transducer_tools.py): one thread for tiny models,
and each checkpoint exported once per test module."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from asr.tools import exporting


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models, and a transducer's tiny decoding steps, run fastest on one thread, and on a busy machine far
    faster than on two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def exported_once(tmp_path_factory, write: Callable[[Path, str], Path]) -> Callable[[str], tuple[Path, Path, str]]:
    """get(name) -> (checkpoint, exported file, what asr.export printed): the first get of a ``name`` writes its
    checkpoint with ``write(folder / "m.ckpt", name)`` and exports it to ``folder / "m.pt2"``; later ones reuse both."""
    made = {}

    def get(name: str) -> tuple[Path, Path, str]:
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            checkpoint = write(folder / "m.ckpt", name)
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                exporting.main([str(checkpoint), str(folder / "m.pt2")])
            made[name] = checkpoint, folder / "m.pt2", printed.getvalue()
        return made[name]

    return get
