"""Exact top-k by inner product in numpy: the running top-k over blocks of scores (``TopK``) and the blocked search
(``numpy_exact_search``), the ground truth of the fallbacks, of ``tune`` and of the benchmarks. Depends on nothing
else of the index package, so every part of it can use it."""
from __future__ import annotations

import numpy as np

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
