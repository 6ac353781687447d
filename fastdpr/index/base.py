"""The ``Index`` protocol: what every index type is, with its inputs checked at the boundary (``checks``).

Every index scores by inner product and returns ``(scores float32 (n, k), ids int64 (n, k))``, best first, with
``-1`` ids and ``-inf`` scores where fewer than ``k`` vectors exist. Ids are the caller's int64 ids (by default the
row number of each vector, in the order added).

Example::

    from fastdpr.index import build_index, load_index
    index = build_index(vectors, "hnsw,M=32,efc=200")
    scores, ids = index.search(queries, k=100, ef=256)
    index.save("wiki.fdpr")
    same = load_index("wiki.fdpr")

A new index type subclasses :class:`Index`, sets ``kind`` (the file's type tag), adds itself to
``spec.REGISTRY``, and implements ``from_spec``, ``_add``, ``_search``, ``_write`` and ``_read`` (plus ``train``
when it needs training); the base class checks every input at the boundary, maps ids, and handles files. Building
from a spec and loading a file: ``factory``; spec strings: ``spec``.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index import fileformat, tune as tuning
# the boundary checks are defined in checks.py (retrievers import check_padding from here, too)
from fastdpr.index.checks import (
    ADD_CHUNK,
    check_finite,
    check_fp16_range,
    check_ids,
    check_k,
    check_padding,
    check_scores,
    check_shape,
    check_threads,
    pad_results,
    take_params,
)

INDEX_FILE_NAME = "index.fdpr"  # the file inside an index directory


class Index:
    """Maximum-inner-product index. Subclasses implement the ``_``-prefixed methods on checked inputs."""

    kind: ClassVar[str] = ""
    # whether ids stay right where inner products leave float32 (the scores then read +inf): ``check_scores``
    ranks_past_float32: ClassVar[bool] = False
    # search parameters accepted by ``search(..., **params)`` (name -> default), checked by ``take_params``
    search_params: ClassVar[dict[str, Any]] = {}
    #: the fingerprint of the model whose passage vectors the index holds (``fastdpr.encode.model_fingerprint``,
    #: from the vectors' manifest), saved in the file, so that a search with another model can be refused
    model_fingerprint: str | None = None
    #: what ``tune`` chose and measured (``fastdpr.index.tune.TuneResult.record``), saved in the file as metadata
    #: ``tuned``; the settings themselves are the index's own search defaults
    tuned: dict | None = None

    def __init__(self, dim: int):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise InputError(f"index dimension must be a positive integer, got {dim!r}")
        self._dim = int(dim)
        self._labels: np.ndarray | None = None  # external ids by row; None: the row number is the id
        self._write_lock = threading.Lock()  # adds are serialised; searches are not blocked by it

    # -- to implement -------------------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "Index":
        raise NotImplementedError

    def _ntotal(self) -> int:
        raise NotImplementedError

    @property
    def stores_fp16(self) -> bool:
        """True when the rows are stored as fp16 (they must then fit its range)."""
        return False

    def _check_rows(self, x: np.ndarray) -> None:
        """Checks of rows about to be added (raise InputError); run before anything is added."""
        if self.stores_fp16:
            check_fp16_range(x)

    def _add(self, x: np.ndarray) -> None:
        """Append float32 C-contiguous rows (already checked); row numbers continue from ``_ntotal()``. Also
        float16 rows when ``_takes_half()``."""
        raise NotImplementedError

    def _takes_half(self) -> bool:
        """True when ``_add`` and ``_search`` accept float16 rows as they are (the compiled core widens them
        itself, a block at a time), so fp16 vectors are never copied to float32 in Python."""
        return False

    def _search(self, q: np.ndarray, k: int, **params: Any) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product of float32 rows, k <= the number of rows; returns row numbers (-1 padded)."""
        raise NotImplementedError

    def _write(self, writer: Any) -> None:
        """Add this index's sections and metadata to an open file writer (``fileformat``)."""
        raise NotImplementedError

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "Index":
        raise NotImplementedError

    # -- training (types that need none keep these) ---------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return True

    def train(self, vectors: np.ndarray) -> None:
        """Learn what the index needs from sample vectors (no-op for types that need nothing)."""

    def stored_vectors(self) -> np.ndarray | None:
        """The stored rows (n, dim) in the order added, when the type keeps them in a form ``tune`` can read."""
        return None

    def tune(self, queries: Any, target_recall: float = 0.95, k: int = 100, vectors: Any = None, truth: Any = None,
             max_queries: int | None = None, threads: int = 0, save: str | os.PathLike | None = None):
        """Find the cheapest search settings whose recall@``k`` against exact search on ``queries`` (a sample:
        training questions or held-out vectors) reaches ``target_recall``, and make them this index's defaults
        (saved with it). Returns a ``fastdpr.index.tune.TuneResult``; see that module."""
        return tuning.tune(self, queries, target_recall=target_recall, k=k, vectors=vectors, truth=truth,
                           max_queries=tuning.MAX_QUERIES if max_queries is None else max_queries, threads=threads,
                           save=save)

    # -- public -----------------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return self._ntotal()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self._dim}, n={len(self)})"

    def add(self, vectors: np.ndarray, ids: Any = None) -> None:
        """Append vectors (n, dim) of any real dtype; ``ids`` (n,) int64 >= 0, unique (default: row numbers).
        float32 and float16 rows go to the compiled core without a float32 copy in Python."""
        x = check_shape(vectors, self._dim, "vectors")
        check_finite(x, "vectors")  # before anything is added: a bad row leaves the index unchanged
        self._check_rows(x)
        n = x.shape[0]
        if not self.is_trained:
            raise InputError(f"{type(self).__name__} must be trained before vectors are added "
                             "(build_index trains it; or call index.train(sample))")
        with self._write_lock:
            n0 = self._ntotal()
            labels = self._labels
            if ids is not None:
                ids = check_ids(ids, n)
                if labels is None:
                    labels = np.arange(n0, dtype=np.int64)
                if labels.shape[0] and np.isin(ids, labels).any():
                    raise InputError("ids already present in the index")
                labels = np.concatenate([labels, ids])
            elif labels is not None:
                new = np.arange(n0, n0 + n, dtype=np.int64)
                if np.isin(new, labels).any():
                    raise InputError("default ids (row numbers) collide with ids given earlier; pass ids")
                labels = np.concatenate([labels, new])
            # labels are published before the rows, so a concurrent search never sees a row without its id
            self._labels = labels
            if (x.dtype == np.float32 and x.flags.c_contiguous) or (x.dtype == np.float16 and self._takes_half()):
                self._add(x)
            else:  # convert chunk by chunk: a large fp16 array never needs a full fp32 copy
                for start in range(0, n, ADD_CHUNK):
                    self._add(np.ascontiguousarray(x[start:start + ADD_CHUNK], dtype=np.float32))

    def search(self, queries: np.ndarray, k: int, **params: Any) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores float32 (n, k), ids int64 (n, k))``, best first; ``-1`` / ``-inf``
        pad rows when the index holds fewer than ``k`` vectors. ``params`` are the type's search parameters.
        Queries of any real dtype are accepted; float16 ones go to the compiled core as they are."""
        k = check_k(k)
        q = check_shape(queries, self._dim, "queries")
        check_finite(q, "queries")
        if not (q.dtype == np.float16 and self._takes_half()):
            q = np.ascontiguousarray(q, dtype=np.float32)
        n = self._ntotal()
        if n == 0:
            raise InputError(f"cannot search an empty {type(self).__name__}: add vectors first")
        params = take_params(params, self.search_params, f"{type(self).__name__}.search")
        if "threads" in params:
            params["threads"] = check_threads(params["threads"])
        # k beyond the index size: search for what exists, pad the rest (cheap, and no type sizes work by k)
        check_padding(q.shape[0], k, n)
        scores, rows = pad_results(*self._search(q, min(k, n), **params), k)
        check_scores(scores, rows, self.ranks_past_float32)
        labels = self._labels  # read after the search: every row returned has its id published
        if labels is not None:
            ids = np.where(rows >= 0, labels[np.maximum(rows, 0)], -1)
        else:
            ids = rows
        return np.ascontiguousarray(scores, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index to one file (a directory path gets ``index.fdpr`` inside it); returns the file path."""
        # the slash is read from the argument: Path("newdir/") drops it, and newdir would become a file
        named_dir = str(os.fspath(path)).endswith(("/", os.sep))
        path = Path(path)
        if path.is_dir() or named_dir:
            path = path / INDEX_FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = fileformat.open_writer(path, self.kind, compiled=self._uses_compiled_writer())
        if self._labels is not None:
            writer.add("labels", self._labels)
        if self.model_fingerprint:
            writer.meta("model_fingerprint", self.model_fingerprint)
        if self.tuned:
            writer.meta("tuned", json.dumps(self.tuned, sort_keys=True, separators=(",", ":")))
        self._write(writer)
        writer.commit()
        return path

    def _uses_compiled_writer(self) -> bool:
        """Compiled index types write through the C++ writer; pure-Python ones may use either."""
        return False

    def _restore_labels(self, reader: Any) -> None:
        if reader.has("labels"):
            labels = reader.array("labels", np.int64)
            if labels.shape[0] != self._ntotal():
                reader.fail(f"labels hold {labels.shape[0]} ids for {self._ntotal()} vectors")
            # the same rules as ids given to add(): a negative id would read as "missing", a repeated one twice
            if labels.shape[0] and (labels.min() < 0 or np.unique(labels).shape[0] != labels.shape[0]):
                reader.fail("labels are not unique non-negative ids")
            self._labels = np.array(labels)
