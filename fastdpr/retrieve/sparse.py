"""Sparse retrieval over a :class:`fastdpr.sparse.BM25` index."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fastdpr.errors import InputError
from fastdpr.retrieve.base import Ranked, Retriever, check_k, check_questions

_ALIGNMENT_SAMPLE = 64


class SparseRetriever(Retriever):
    """BM25 top-k, as corpus rows (``search``) or passages through the corpus (``retrieve``).

    Example: ``SparseRetriever(BM25.load("bm25/"), Corpus.open("psgs.tsv")).retrieve(["who wrote hamlet"], 100)``
    """

    def __init__(self, bm25, corpus, *, threads: int | None = None, show_progress: bool = False,
                 n_threads: int | None = None):
        self.bm25 = bm25
        self.corpus = corpus
        from fastdpr._renamed import renamed

        self.threads = renamed("threads", threads, "n_threads", n_threads, "SparseRetriever")
        self.show_progress = show_progress
        self._row_map: np.ndarray | None = None  # BM25 row -> corpus row, only when the two orders differ
        self._aligned = False

    def _bm25_search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        questions = check_questions(questions)
        k = check_k(k)
        if not questions:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        return self.bm25.search_rows(questions, k, threads=self.threads, show_progress=self.show_progress)

    def _corpus_rows(self, bm25_rows: np.ndarray) -> np.ndarray:
        if not self._aligned:
            self._row_map = _row_map(self.bm25, self.corpus)
            self._aligned = True
        if self._row_map is None:
            return bm25_rows
        return np.where(bm25_rows >= 0, self._row_map[np.maximum(bm25_rows, 0)], -1)

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = self._bm25_search(questions, k)
        return scores, self._corpus_rows(rows)

    def ranked_ids(self, questions: Sequence[str], k: int) -> list[Ranked]:
        # the BM25 index holds its own ids: no corpus lookup needed (a TREC run may be written without a corpus)
        scores, rows = self._bm25_search(questions, k)
        ids = self.bm25.ids[np.maximum(rows, 0)].tolist() if len(self.bm25) else [[]] * len(rows)
        return [[(str(p), float(s)) for s, p, r in zip(srow, prow, rrow) if r >= 0]
                for srow, prow, rrow in zip(scores.tolist(), ids, rows.tolist())]


def _row_map(bm25, corpus) -> np.ndarray | None:
    """None when BM25 rows are corpus rows (the index was built from this corpus, the usual case), else the corpus
    row of every BM25 row. A sample of rows decides: a BM25 index built from the same file agrees everywhere."""
    if not hasattr(corpus, "ids_at"):
        return None  # a stand-in without ids: rows are taken as they are
    n = len(bm25)
    if n == len(corpus):
        sample = np.unique(np.linspace(0, n - 1, min(n, _ALIGNMENT_SAMPLE)).astype(np.int64))
        if corpus.ids_at(sample) == [str(x) for x in bm25.ids[sample].tolist()]:
            return None
    rows = np.empty(n, dtype=np.int64)
    for i, pid in enumerate(bm25.ids.tolist()):
        try:
            rows[i] = corpus.row_of(str(pid))
        except KeyError:
            raise InputError(f"BM25 passage {pid!r} is not in the corpus: the index was built from another "
                             "passage file") from None
    return rows
