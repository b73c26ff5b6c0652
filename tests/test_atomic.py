"""write_atomically (asr/atomic.py), behind every whole file asr writes: outputs, checkpoints,
exports, caches and reports appear complete or not at all, readable by the team."""

from __future__ import annotations

import os

import pytest

from asr.atomic import write_atomically


def test_files_appear_whole_or_not_at_all(tmp_path):
    """write_atomically, behind every whole file asr writes (outputs, checkpoints, exports, caches)."""
    target = tmp_path / "out.txt"
    with write_atomically(target) as partial:
        partial.write_text("first")
        assert not target.exists()  # not under its name until the block ends
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError), write_atomically(target) as partial:
        partial.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "first"  # the old file stands
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # and no temporary file is left


def test_atomically_written_files_get_the_permissions_of_an_ordinary_file(tmp_path):
    """mkstemp's 0600 would make checkpoints and outputs unreadable to the rest of a team."""
    umask = os.umask(0o022)
    try:
        with write_atomically(tmp_path / "shared.ckpt") as partial:
            partial.write_text("weights")
    finally:
        os.umask(umask)
    assert (tmp_path / "shared.ckpt").stat().st_mode & 0o777 == 0o644
