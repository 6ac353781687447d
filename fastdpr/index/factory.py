"""Building and loading indexes: ``build_index`` (vectors + spec -> a trained, filled index), ``make_index`` (an
empty one), ``load_index`` (a saved file, its type read from the header).

Example::

    from fastdpr.index import build_index, load_index
    index = build_index(vectors, "hnsw,M=32,efc=200")
    index.save("wiki.fdpr")
    same = load_index("wiki.fdpr")
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index import fileformat
from fastdpr.index.auto import resolve_auto
from fastdpr.index.base import INDEX_FILE_NAME, Index
from fastdpr.index.checks import check_matrix
from fastdpr.index.spec import REGISTRY, parse_spec


def index_class(kind: str) -> type[Index]:
    """The class of index type ``kind``, its module imported now: a program that loads one type never imports the
    others (nor faiss, which the faiss type needs)."""
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise InputError(f"unknown index type {kind!r}; expected one of {sorted(REGISTRY)}") from None
    module_name, cls_name = target.split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)


def make_index(spec: str, dim: int, n_hint: int = 0, memory_budget: Any = None) -> Index:
    """An empty (untrained) index for ``spec``; ``n_hint`` (the number of vectors to come) and ``memory_budget``
    (bytes or a size such as ``"2GB"``) shape ``"auto"`` (``fastdpr.index.auto``)."""
    kind, params = parse_spec(spec)
    if kind == "auto":
        if memory_budget is not None:
            if "memory_budget" in params:
                raise InputError(f"index spec {spec!r} gives memory_budget, and so does the caller; give one")
            params["memory_budget"] = memory_budget
        kind, params = resolve_auto(n_hint, dim, params)
    elif memory_budget is not None:
        raise InputError(f"memory_budget shapes the 'auto' index only, not {kind!r}")
    return index_class(kind).from_spec(dim, params)


def build_index(vectors: np.ndarray, spec: str = "auto", ids: Any = None, memory_budget: Any = None) -> Index:
    """Build an index over ``vectors`` (n, dim) from a spec string; trains it first when the type needs it.
    ``"auto"`` (the default) chooses the type and shape from n, dim and ``memory_budget`` (``fastdpr.index.auto``);
    ``index.tune(queries)`` then sets its search parameters.

    >>> import numpy as np
    >>> from fastdpr.index import build_index
    >>> x = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
    >>> index = build_index(x, "flat")
    >>> scores, ids = index.search(x[:2], k=5)
    >>> ids[:, 0].tolist()
    [0, 1]
    """
    if not isinstance(vectors, np.ndarray):
        vectors = check_matrix(vectors, None, "vectors")
    if vectors.ndim != 2 or vectors.shape[0] == 0:
        raise InputError(f"build_index needs a non-empty 2-D array of vectors, got shape {vectors.shape}")
    index = make_index(spec, vectors.shape[1], n_hint=vectors.shape[0], memory_budget=memory_budget)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors, ids=ids)
    return index


def resolve_index_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / INDEX_FILE_NAME
    if not path.exists():
        raise InputError("index file not found", path=str(path))
    if not path.is_file():  # a FIFO or a device: opening it could wait forever
        raise InputError("not a valid fastdpr index: not a regular file", path=str(path))
    return path


def load_index(path: str | os.PathLike, mmap: bool = False) -> Index:
    """Load an index saved by ``Index.save`` (a file, or a directory holding ``index.fdpr``); the type comes from
    the file's header. ``mmap=True`` leaves large vector blocks in the file mapping instead of copying them.

    A truncated or corrupted file raises ``InputError`` (a ``ValueError``) naming the file: a file whose size
    disagrees with its header and section table is refused at open. With ``mmap=True`` the file must not then be
    truncated or rewritten in place while it is mapped: the operating system kills a process that reads a page
    that is gone (SIGBUS), which no check at open can prevent. fastdpr never does that to its own files (``save``
    writes a new file and renames it over the old one, so a mapping keeps the old contents); other tools must not
    either."""
    path = resolve_index_path(path)
    reader = fileformat.open_reader(path)
    cls = index_class(reader.type)
    try:
        index = cls._read(reader, mmap=mmap)
    except InputError:
        raise
    except ValueError as exc:  # the compiled loaders' FormatError names the file already
        raise InputError(str(exc)) from None
    index._restore_labels(reader)
    if reader.has_meta("model_fingerprint"):
        index.model_fingerprint = reader.meta("model_fingerprint")
    if reader.has_meta("tuned"):  # absent from files written before tune
        try:
            tuned = json.loads(reader.meta("tuned"))
        except ValueError:
            tuned = None
        if not isinstance(tuned, dict):
            reader.fail("metadata 'tuned' is not a JSON object")
        index.tuned = tuned
    return index
