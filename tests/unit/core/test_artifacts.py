"""atomic_path: a fresh temporary sibling per call, renamed into place; nothing left behind on failure."""

import errno
import os

import pytest

from margincal.core.artifacts import OutputError, atomic_path, atomic_write_text


def test_atomic_path_renames_a_fresh_sibling_into_place(tmp_path):
    target = tmp_path / "sub" / "table.safetensors"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second and first.parent == second.parent == target.parent  # one temporary file per call
        assert first.name.startswith(".table.safetensors.") and first.suffix == ".safetensors"  # format by name
        assert not target.exists()
        first.write_text("one")
        second.write_text("two")
    assert target.read_text() == "one"  # the outer block renamed last
    assert [p.name for p in target.parent.iterdir()] == ["table.safetensors"]
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # as a plain open, not mkstemp's 0600


def test_atomic_path_cleans_up_and_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError, match="writer failed"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(OutputError, match="No space left"), atomic_path(target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_write_text_is_utf8(tmp_path):
    path = atomic_write_text(tmp_path / "a.json", "Zoë — ü\n")
    assert path.read_bytes() == "Zoë — ü\n".encode()
