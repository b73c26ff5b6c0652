"""Every file asr writes whole (outputs, checkpoints, exports, caches, reports) goes through
``write_atomically``: it appears under its name complete, or not at all.

Standard library only, so checkpoint tools and ``asr.export`` can import it without torchaudio.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def write_atomically(path: str | Path) -> Iterator[Path]:
    """Yield a new temporary file beside ``path`` to write; when the block ends without an error it is
    renamed to ``path``, otherwise deleted. A reader, or a resumed run, never sees half a file, and
    writers racing for one path (ranks caching the same figure) each rename a whole file of their own."""
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".partial")
    os.close(handle)
    partial = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o666 & ~umask)  # mkstemp makes it 0600: a checkpoint teammates cannot read
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
