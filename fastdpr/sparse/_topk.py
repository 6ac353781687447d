"""BM25 top-k over bm25s's precomputed score matrix, compiled once per machine rather than once per process.

bm25s compiles its numba search on the first call of every process (about 10 s on a busy 2-core machine, all of a
one-question search) and never caches it. These kernels do the same sums with ``cache=True``: numba keeps the
machine code in ``__pycache__`` beside this file or, where that is read-only (a system site-packages), in its
user-wide cache (``NUMBA_CACHE_DIR`` when set), so later processes load it in a fraction of a second.

Only passages that share a term with the query are ranked (a BM25 term weight is always positive), so a query
touching m passages costs its posting lists plus a selection among m, not a pass over the corpus. Ties keep the
lower row first. Without numba the same function runs in numpy."""
from __future__ import annotations

import numpy as np

try:
    from numba import njit, prange
except ImportError:  # pragma: no cover - numba is a dependency; the numpy path below is the fallback
    njit = None


def _top_of_one(tokens, data, indptr, indices, scores, touched, k):
    """Sum the query's posting lists into ``scores`` (all zero on entry, zero again on return); returns the rows
    and scores of its best ``k`` matching passages, best first, ties by row."""
    m = 0
    for t in tokens:
        for j in range(indptr[t], indptr[t + 1]):
            d = indices[j]
            if scores[d] == 0:
                touched[m] = d
                m += 1
            scores[d] += data[j]
    rows = touched[:m]
    values = scores[rows]
    for i in range(m):
        scores[rows[i]] = 0
    if m > k:  # only the candidates at or above the k-th best score are sorted
        threshold = np.partition(values, m - k)[m - k]
        keep = values >= threshold
        rows, values = rows[keep], values[keep]
    by_row = np.argsort(rows)
    rows, values = rows[by_row], values[by_row]
    # stable sort on the negated score: equal scores stay in row order
    order = np.argsort(-values, kind="mergesort")[:k]
    return rows[order], values[order]


def _search_numpy(flat, starts, data, indptr, indices, num_docs, k):
    n = starts.shape[0] - 1
    out_rows = np.full((n, k), -1, dtype=np.int64)
    out_scores = np.full((n, k), -np.inf, dtype=np.float32)
    for q in range(n):
        tokens = flat[starts[q]:starts[q + 1]]
        spans = [np.arange(indptr[t], indptr[t + 1]) for t in tokens]
        postings = np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
        if postings.size == 0:
            continue
        rows, inverse = np.unique(indices[postings], return_inverse=True)
        values = np.zeros(rows.shape[0], dtype=np.float32)
        np.add.at(values, inverse, data[postings])
        order = np.argsort(-values, kind="stable")[:k]
        out_rows[q, :order.size] = rows[order]
        out_scores[q, :order.size] = values[order]
    return out_rows, out_scores


if njit is not None:
    _top_of_one_jit = njit(cache=True, nogil=True)(_top_of_one)

    def _search_body(flat, starts, data, indptr, indices, num_docs, k, chunks):
        n = starts.shape[0] - 1
        out_rows = np.full((n, k), -1, dtype=np.int64)
        out_scores = np.full((n, k), -np.inf, dtype=np.float32)
        per_chunk = (n + chunks - 1) // chunks
        for c in prange(chunks):
            # one accumulator per chunk of queries: a corpus-sized array per query would cost more than the sums
            scores = np.zeros(num_docs, dtype=np.float32)
            touched = np.empty(num_docs, dtype=np.int64)
            for q in range(c * per_chunk, min(n, (c + 1) * per_chunk)):
                rows, values = _top_of_one_jit(flat[starts[q]:starts[q + 1]], data, indptr, indices, scores,
                                               touched, k)
                out_rows[q, :rows.shape[0]] = rows
                out_scores[q, :rows.shape[0]] = values
        return out_rows, out_scores

    _search_serial = njit(cache=True, nogil=True)(_search_body)
    _search_parallel = njit(cache=True, nogil=True, parallel=True)(_search_body)


def search(flat: np.ndarray, starts: np.ndarray, matrix: dict, k: int, threads: int = 1,
           backend: str = "numba") -> tuple[np.ndarray, np.ndarray]:
    """``(rows int64 (n, k), scores float32 (n, k))`` of the queries whose token ids are
    ``flat[starts[i]:starts[i + 1]]``, over bm25s's score matrix (``data``, ``indptr``, ``indices``,
    ``num_docs``); -1 / -inf where fewer than ``k`` passages match."""
    # the matrix goes in with the dtypes bm25s gave it (compiled once per combination): converting it would copy
    # the whole index on every call
    args = (np.ascontiguousarray(flat, dtype=np.int64), np.ascontiguousarray(starts, dtype=np.int64),
            matrix["data"], matrix["indptr"], matrix["indices"], int(matrix["num_docs"]), int(k))
    if backend != "numba" or njit is None:
        return _search_numpy(*args)
    n = starts.shape[0] - 1
    if threads > 1 and n > 1:
        import numba

        threads = min(threads, numba.config.NUMBA_NUM_THREADS, n)
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            return _search_parallel(*args, threads)
        finally:
            numba.set_num_threads(before)
    return _search_serial(*args, 1)
