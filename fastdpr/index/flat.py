"""Exact maximum-inner-product search: the ground truth for every other index, and the right choice below ~100k
vectors. The compiled core blocks queries x vectors with a SIMD micro-kernel over OpenMP threads; the numpy fallback
does the same through BLAS matrix products.

>>> import numpy as np
>>> from fastdpr.index import build_index
>>> x = np.random.default_rng(0).standard_normal((500, 32)).astype(np.float32)
>>> index = build_index(x, "flat,fp16")
>>> scores, ids = index.search(x[:3], k=10)
>>> scores.shape, ids.dtype
((3, 10), dtype('int64'))
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastdpr.index._native import native
from fastdpr.index.base import Index, check_storage_flags, take_params
from fastdpr.index.rows import RowStore

NUMPY_BLOCK = 16384  # vectors scored per matrix product in the fallback


class TopK:
    """Running exact top-k of ``nq`` queries over blocks of scores that arrive one after another (an index's
    fallback, vectors encoded chunk by chunk, a benchmark's ground truth over shards), in O(nq x (block + k))
    memory. Ties go to the smaller row."""

    def __init__(self, nq: int, k: int):
        self.nq, self.k = nq, k
        self._s = np.empty((nq, 0), dtype=np.float32)
        self._i = np.empty((nq, 0), dtype=np.int64)

    def add(self, scores: np.ndarray, first_row: int) -> None:
        """Scores (nq, m) of rows ``first_row .. first_row + m - 1``."""
        ids = np.broadcast_to(np.arange(first_row, first_row + scores.shape[1], dtype=np.int64), scores.shape)
        cand_s = np.concatenate([self._s, np.asarray(scores, dtype=np.float32)], axis=1)
        cand_i = np.concatenate([self._i, ids], axis=1)
        if cand_s.shape[1] > self.k:
            part = np.argpartition(-cand_s, self.k - 1, axis=1)[:, : self.k]
            cand_s = np.take_along_axis(cand_s, part, axis=1)
            cand_i = np.take_along_axis(cand_i, part, axis=1)
        self._s, self._i = cand_s, cand_i

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of shape (nq, k), best first, padded with (-inf, -1) when fewer rows were seen."""
        kk = self._s.shape[1]
        order = np.lexsort((self._i, -self._s), axis=-1) if self.nq else np.empty((0, kk), dtype=np.int64)
        scores = np.full((self.nq, self.k), -np.inf, dtype=np.float32)
        rows = np.full((self.nq, self.k), -1, dtype=np.int64)
        scores[:, :kk] = np.take_along_axis(self._s, order, axis=1)
        rows[:, :kk] = np.take_along_axis(self._i, order, axis=1)
        return scores, rows


def numpy_exact_search(base: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of float32 ``queries`` against ``base`` (n, d) float32/float16 rows, best first (ties: smaller
    row first), padded with (-inf, -1). Blocked so memory stays O(nq x (block + k))."""
    top = TopK(queries.shape[0], k)
    for start in range(0, base.shape[0], NUMPY_BLOCK):
        top.add(queries @ np.asarray(base[start:start + NUMPY_BLOCK], dtype=np.float32).T, start)
    return top.result()


def exact_search(base: np.ndarray, queries: np.ndarray, k: int, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products of ``queries`` against ``base`` rows (compiled when available); returns row
    numbers. The ground truth used by tests and benchmarks."""
    index = FlatIndex(base.shape[1], fp16=base.dtype == np.float16)
    index.add(base)
    return index.search(queries, k, threads=threads)


class FlatIndex(Index):
    """Exact inner-product index; ``fp16=True`` halves the memory (scores computed in fp32 from fp16 rows)."""

    kind = "flat"
    search_params = {"threads": 0}

    def __init__(self, dim: int, fp16: bool = False):
        super().__init__(dim)
        self.fp16 = bool(fp16)
        C = native()
        self._impl = C.FlatIndex(self._dim, "fp16" if self.fp16 else "fp32") if C is not None else None
        self._store = RowStore(self._dim, self.fp16)  # the fallback's rows

    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "FlatIndex":
        p = take_params(params, {"fp16": False, "fp32": False}, "flat")
        check_storage_flags(p, "flat")
        return cls(dim, fp16=p["fp16"])

    @property
    def native(self) -> bool:
        return self._impl is not None

    @property
    def stores_fp16(self) -> bool:
        return self.fp16

    def _takes_half(self) -> bool:
        return self._impl is not None

    def _ntotal(self) -> int:
        return len(self._impl) if self._impl is not None else len(self._store)

    def _add(self, x: np.ndarray) -> None:
        if self._impl is not None:
            self._impl.add(x)
        else:
            self._store.append(x)

    def vectors(self) -> np.ndarray:
        """The stored rows (fp16 or fp32) as one array (fallback storage only)."""
        return self._store.array()

    def _search(self, q: np.ndarray, k: int, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
        if self._impl is not None:
            return self._impl.search(q, k, threads)
        return numpy_exact_search(self._store.array(), q, k)

    def _write(self, writer: Any) -> None:
        if self._impl is not None:
            self._impl.save(writer.raw)
        else:
            self._store.write(writer)

    def _uses_compiled_writer(self) -> bool:
        return self._impl is not None

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "FlatIndex":
        C = native()
        if C is not None and hasattr(reader, "raw"):
            impl = C.FlatIndex.load(reader.raw, mmap)
            index = cls.__new__(cls)
            Index.__init__(index, impl.dim)
            index.fp16, index._impl = impl.storage == "fp16", impl
            index._store = RowStore(impl.dim, index.fp16)
            return index
        store = RowStore.read(reader, mmap)
        index = cls.__new__(cls)
        Index.__init__(index, store.dim)
        index.fp16, index._impl, index._store = store.fp16, None, store
        return index
