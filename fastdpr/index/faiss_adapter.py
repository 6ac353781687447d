"""FAISS as an optional backend: ``"faiss:<factory>"`` builds ``faiss.index_factory(dim, factory,
METRIC_INNER_PRODUCT)`` behind the same :class:`~fastdpr.index.Index` protocol, saved with FAISS's own serializer
inside a fastdpr index file.

>>> import numpy as np
>>> from fastdpr.index import build_index
>>> x = np.random.default_rng(0).standard_normal((1000, 32)).astype(np.float32)
>>> index = build_index(x, "faiss:HNSW32,Flat")          # doctest: +SKIP
>>> scores, ids = index.search(x[:2], 10, ef=128)         # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastdpr.errors import InputError, MissingDependency
from fastdpr.index.base import Index
from fastdpr.index.checks import check_matrix


def _faiss():
    # imported on first use: faiss is an optional extra, and a program that never builds this type needs none
    try:
        import faiss
    except ImportError:
        raise MissingDependency("index spec 'faiss:...' needs faiss: pip install 'fastdpr[faiss]'") from None
    return faiss


class FaissIndex(Index):
    """A FAISS index built by ``index_factory`` with inner-product metric. Search parameters: ``ef`` (HNSW
    efSearch), ``nprobe`` (IVF), ``threads`` (FAISS's process-wide OpenMP setting)."""

    kind = "faiss"
    search_params = {"ef": 0, "nprobe": 0, "threads": 0}

    def __init__(self, dim: int, factory: str, _index: Any = None):
        super().__init__(dim)
        faiss = _faiss()
        self.factory = factory
        if _index is None:
            try:
                _index = faiss.index_factory(self._dim, factory, faiss.METRIC_INNER_PRODUCT)
            except RuntimeError as exc:
                raise InputError(f"faiss cannot build {factory!r}: {str(exc).splitlines()[0]}") from None
        self._faiss = _index

    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "FaissIndex":
        return cls(dim, params["factory"])

    @property
    def is_trained(self) -> bool:
        return bool(self._faiss.is_trained)

    def train(self, vectors: np.ndarray) -> None:
        if not self.is_trained:
            self._faiss.train(check_matrix(vectors, self._dim, "training vectors"))

    def _ntotal(self) -> int:
        return int(self._faiss.ntotal)

    def _add(self, x: np.ndarray) -> None:
        self._faiss.add(x)

    def _search(self, q: np.ndarray, k: int, ef: int = 0, nprobe: int = 0, threads: int = 0):
        faiss = _faiss()
        params = None
        if ef and nprobe:
            raise InputError("faiss search: give ef (HNSW) or nprobe (IVF), not both")
        if ef:
            params = faiss.SearchParametersHNSW(efSearch=int(ef))
        elif nprobe:
            params = faiss.SearchParametersIVF(nprobe=int(nprobe))
        if threads > 0:
            faiss.omp_set_num_threads(int(threads))
        try:
            scores, ids = self._faiss.search(q, k, params=params)
        except RuntimeError as exc:
            raise InputError(f"faiss search failed for {self.factory!r}: {str(exc).splitlines()[0]}") from None
        scores = scores.astype(np.float32, copy=False)
        scores[ids < 0] = -np.inf  # FAISS pads with -FLT_MAX; the protocol pads with -inf
        return scores, ids.astype(np.int64, copy=False)

    def _write(self, writer: Any) -> None:
        faiss = _faiss()
        writer.meta("dim", self._dim)
        writer.meta("factory", self.factory)
        writer.add("faiss", np.asarray(faiss.serialize_index(self._faiss), dtype=np.uint8))

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "FaissIndex":
        faiss = _faiss()
        dim = reader.meta_int("dim", 1, 1 << 20)
        try:
            index = faiss.deserialize_index(np.array(reader.array("faiss", np.uint8)))
        except RuntimeError as exc:
            reader.fail(f"faiss could not read its index: {str(exc).splitlines()[0]}")
        if index.d != dim:
            reader.fail(f"faiss index has dimension {index.d}, header says {dim}")
        return cls(dim, reader.meta("factory"), _index=index)
