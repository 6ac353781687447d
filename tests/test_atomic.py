import os

import pytest

from fastdpr.atomic import atomic_open, write_json


def test_atomic_open_replaces_only_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as fh:
            fh.write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temp file left behind
    with atomic_open(target) as fh:
        fh.write("new")
    assert target.read_text() == "new"


def test_atomic_files_get_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644


def test_atomic_open_refuses_read_modes(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(tmp_path / "x", "r"):
            pass
