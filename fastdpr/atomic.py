"""Atomic file output: write to a temporary file in the same directory, fsync, then rename over the target.

A reader therefore sees either the old file or the complete new one, never a half-written one, even after
``kill -9``. Every file fastdpr writes goes through here.

A writer killed before it commits leaves its temporary file behind. Temporary names carry the writer's process id
and a random part (``.NAME.<pid>.<random>.tmp`` here, ``NAME.tmp-<pid>-<random>`` from the C++ index writer), so
every writer, every thread included, has a file of its own, and the next write of the same file removes the ones
whose writer is gone (:func:`remove_stale_temp_files`) and never those of a live writer."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Iterator

#: a temporary file is only removed when its writer is gone and it has not been touched for this long (seconds): a
#: writer on another machine sharing the directory (its process id means nothing here) is still writing to it
STALE_AFTER = 60.0


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; on clean exit it replaces ``path`` atomically."""
    if "r" in mode or "a" in mode:
        raise ValueError(f"atomic_open is for writing whole files, got mode {mode!r}")
    path = Path(path)
    fd, tmp = _create_temp(path)
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


def _create_temp(path: Path) -> tuple[int, str]:
    """The temporary sibling of ``path``, its folders created first. Where the file system refuses (a file where
    a folder must be, a folder where the file goes, a read-only or pseudo file system), an ``InputError`` names
    the output: nothing has been written yet."""
    from fastdpr.errors import InputError

    if path.is_dir():
        raise InputError("is a directory: give the path of a file to write", str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError("cannot be written: a part of its folder path is a file, not a folder",
                         str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot create its folder ({exc.strerror or exc})", str(path)) from None
    remove_stale_temp_files(path)
    try:
        return tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot be written in {path.parent} ({exc.strerror or exc})", str(path)) from None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else (EPERM)
        return True
    return True


def remove_stale_temp_files(path: str | os.PathLike, stale_after: float = STALE_AFTER) -> list[Path]:
    """Remove the temporary files that writers of ``path`` left when they died before committing: those whose
    process id names no running process and which were not modified for ``stale_after`` seconds. Returns what was
    removed. Files of other names, and those of live writers, are never touched."""
    path = Path(path)
    name = glob.escape(path.name)
    ours = re.compile(r"^\." + re.escape(path.name) + r"\.(\d+)\.[^.]+\.tmp$")
    # (files of the C++ writer before its names had a random part: NAME.tmp-<pid>)
    cxx = re.compile(r"^" + re.escape(path.name) + r"\.tmp-(\d+)(?:-[0-9a-f]+)?$")
    try:
        candidates = list(path.parent.glob(f".{name}.*.tmp")) + list(path.parent.glob(f"{name}.tmp-*"))
    except OSError:
        return []
    return _remove_dead(candidates, lambda tmp: ours.match(tmp.name) or cxx.match(tmp.name), stale_after)


def remove_stale_temp_files_in(directory: str | os.PathLike, prefixes: tuple[str, ...],
                               stale_after: float = STALE_AFTER) -> list[Path]:
    """:func:`remove_stale_temp_files` for every file of ``directory`` whose name starts with one of ``prefixes``
    (e.g. ``(".shard-",)``): the temporary files of dead writers of any of those files. Returns what was removed."""
    directory = Path(directory)
    ours = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$")
    try:
        candidates = [p for p in directory.glob(".*.tmp") if p.name.startswith(prefixes)]
    except OSError:
        return []
    return _remove_dead(candidates, lambda tmp: ours.match(tmp.name), stale_after)


def _remove_dead(candidates: list[Path], parse, stale_after: float) -> list[Path]:
    """Remove the candidates whose name (``parse`` -> a match with the writer's pid as group 1) names a process
    that is gone, and which were not modified for ``stale_after`` seconds."""
    removed = []
    now = time.time()
    for tmp in candidates:
        match = parse(tmp)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        try:
            if now - tmp.stat().st_mtime < stale_after or not tmp.is_file():
                continue
            tmp.unlink()
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(tmp)
    return removed


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
