import os

import numpy as np
import pytest
from compiled_extension import extension
from processes import age, dead_pid

from fastdpr.atomic import atomic_open, remove_stale_temp_files, write_json


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


def test_stale_temp_files_of_dead_writers_go_and_live_ones_stay(tmp_path):
    target = tmp_path / "index.fdpr"
    live, dead = os.getpid(), dead_pid()
    names = {f".index.fdpr.{live}.abc123.tmp": True, f".index.fdpr.{dead}.abc123.tmp": False,
             f"index.fdpr.tmp-{live}-00ff00ff00ff00ff": True, f"index.fdpr.tmp-{dead}-00ff00ff00ff00ff": False,
             f"index.fdpr.tmp-{dead}": False}
    for name in names:
        (tmp_path / name).write_text("x")
        age(tmp_path / name)
    removed = remove_stale_temp_files(target)
    assert sorted(p.name for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, keep in names.items() if keep)


C = extension("FileWriter")


@pytest.mark.skipif(C is None, reason="needs the compiled extension")
def test_two_compiled_writers_of_one_path_never_share_a_temporary_file(tmp_path):
    """A second writer opened before the first commits must neither write into the file the first published nor
    lose its own."""
    target = str(tmp_path / "x.fdpr")
    first, second = C.FileWriter(target, "flat"), C.FileWriter(target, "flat")
    first.add("a", np.arange(100, dtype=np.uint8))
    first.commit()
    second.add("b", np.arange(200, dtype=np.uint8))
    second.commit()
    reader = C.FileReader(target)
    assert reader.names() == ["b"]
    assert bytes(reader.section("b")) == bytes(range(200))
    assert os.listdir(tmp_path) == ["x.fdpr"]
