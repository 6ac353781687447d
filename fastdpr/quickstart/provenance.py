"""Cache keys that name the code as well as the settings, so a stage cached by one version of the code is never
served to another: a changed recipe, loop or kernel redoes the stages it could have changed.

A key is the hash of the settings, the source of the code that runs the stage (a file outside the package, such as
a benchmark script), every source file of the ``fastdpr`` package and the compiled extensions' bytes. The package's
part is read once per process, the rest once per key."""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
from pathlib import Path
from typing import Iterable

import fastdpr

#: compiled modules of the package, found wherever the install put them (an editable install keeps them outside
#: the source tree)
EXTENSION_MODULES = ("fastdpr._C",)


def _package_root() -> Path:
    return Path(fastdpr.__file__).resolve().parent


def _extension_files(root: Path) -> list[Path]:
    found = {p.resolve() for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in root.rglob(f"*{suffix}")}
    for name in EXTENSION_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        if origin and os.path.isfile(origin) and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            # and every other compiled module installed beside it
            installed = Path(origin).resolve().parent
            found |= {p.resolve() for suffix in importlib.machinery.EXTENSION_SUFFIXES
                      for p in installed.rglob(f"*{suffix}")}
    return sorted(found)


def tree_digest(root: Path, extensions: Iterable[Path] = ()) -> str:
    """sha256 over every ``*.py`` file under ``root`` (relative path and bytes, in path order) and the bytes of
    ``extensions``."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for path in extensions:
        h.update(b"ext\0" + path.name.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """The digest of the installed ``fastdpr`` (sources and compiled extensions), computed once per process."""
    root = _package_root()
    return tree_digest(root, _extension_files(root))


def code_digest(code) -> str:
    """sha256 of a file (a path) or of the file that defines a function, class or module."""
    while isinstance(code, functools.partial):
        code = code.func
    if not isinstance(code, (str, os.PathLike)):
        code = inspect.getsourcefile(code) or inspect.getfile(code)
    return hashlib.sha256(Path(code).read_bytes()).hexdigest()


def provenance_key(settings: dict, code: Iterable = (), length: int = 16) -> str:
    """The cache key of a stage: its ``settings`` (JSON-able), the ``code`` that runs it (paths, functions or
    modules) and the whole package (:func:`package_digest`)."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True, default=str).encode() + b"\0")
    for digest in sorted({code_digest(c) for c in code}):
        h.update(digest.encode())
    h.update(b"\0" + package_digest().encode())
    return h.hexdigest()[:length]
