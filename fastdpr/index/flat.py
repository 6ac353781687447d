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
from fastdpr.index.base import Index
from fastdpr.index.checks import take_params
from fastdpr.index.exact import TopK, numpy_exact_search  # noqa: F401  (TopK: importable from here as before)
from fastdpr.index.rows import RowStore
from fastdpr.index.spec import check_storage_flags

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
