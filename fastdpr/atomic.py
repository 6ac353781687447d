"""Atomic file output: write to a temporary file in the same directory, fsync, then rename over the target.

A reader therefore sees either the old file or the complete new one, never a half-written one, even after
``kill -9``. Every file fastdpr writes goes through here."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; on clean exit it replaces ``path`` atomically."""
    if "r" in mode or "a" in mode:
        raise ValueError(f"atomic_open is for writing whole files, got mode {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    # mkstemp creates 0600; give the file the permissions an ordinary open() would have
    os.chmod(tmp, 0o666 & ~_umask())
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=indent, ensure_ascii=False)
        fh.write("\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def save_npy(path: str | os.PathLike, array) -> None:
    import numpy as np

    with atomic_open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
