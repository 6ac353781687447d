"""The vector storage of the numpy fallbacks (Flat, and HNSW without its compiled graph): appended chunks of fp32 or
fp16 rows, joined into one array when searched, read from and written to the same ``vectors`` section the compiled
core uses."""
from __future__ import annotations

from typing import Any

import numpy as np


def check_finite_section(reader: Any, name: str, values: np.ndarray, chunk: int = 1 << 22) -> None:
    """NaN or Inf in a section is a bad file (as in csrc/io.h check_finite): checksums vouch only for the bytes.
    In chunks of values, so a memory-mapped section needs no full-size temporary."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, chunk):
        if not np.isfinite(flat[start:start + chunk]).all():
            reader.fail(f"section {name!r} holds NaN or Inf")


class RowStore:
    """Rows of ``dim`` numbers stored as fp16 or fp32."""

    def __init__(self, dim: int, fp16: bool = False):
        self.dim = int(dim)
        self.fp16 = bool(fp16)
        self._chunks: list[np.ndarray] = []
        self._n = 0

    @property
    def dtype(self) -> type:
        return np.float16 if self.fp16 else np.float32

    def __len__(self) -> int:
        return self._n

    def append(self, x: np.ndarray) -> None:
        """Append float32 rows (checked by the caller; fp16 storage needs them within its range)."""
        self._chunks.append(x.astype(np.float16) if self.fp16 else x.copy())
        self._n += x.shape[0]

    def array(self) -> np.ndarray:
        """All rows as one (n, dim) array (the chunks are joined once, then kept joined)."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.empty((0, self.dim), dtype=self.dtype)

    def write(self, writer: Any) -> None:
        """``dim``, ``count``, ``storage`` and the ``vectors`` section, as the compiled store writes them."""
        writer.meta("dim", self.dim)
        writer.meta("count", self._n)
        writer.meta("storage", "fp16" if self.fp16 else "fp32")
        writer.add("vectors", self.array())

    @classmethod
    def read(cls, reader: Any, mmap: bool = False) -> "RowStore":
        """The rows of an index file (the section's size is checked against ``dim`` x ``count`` before use);
        ``mmap`` leaves them in the file mapping."""
        dim = reader.meta_int("dim", 1, 1 << 20)
        count = reader.meta_int("count", 0, 1 << 40)
        storage = reader.meta("storage")
        if storage not in ("fp16", "fp32"):
            reader.fail(f"unknown storage {storage!r}")
        store = cls(dim, fp16=storage == "fp16")
        rows = reader.array("vectors", store.dtype, count * dim).reshape(count, dim)
        check_finite_section(reader, "vectors", rows)
        store._chunks = [rows if mmap else np.array(rows)]
        store._n = count
        return store
