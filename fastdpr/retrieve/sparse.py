"""Sparse retrieval over a :class:`fastdpr.sparse.BM25` index."""
from __future__ import annotations

from typing import Sequence

from fastdpr.retrieve.base import Ranked, Retriever, check_k, check_questions


class SparseRetriever(Retriever):
    """BM25 top-k mapped to passages through the corpus.

    Example: ``SparseRetriever(BM25.load("bm25/"), Corpus.open("psgs.tsv")).retrieve(["who wrote hamlet"], 100)``
    """

    def __init__(self, bm25, corpus, *, n_threads: int | None = None, show_progress: bool = False):
        self.bm25 = bm25
        self.corpus = corpus
        self.n_threads = n_threads
        self.show_progress = show_progress

    def ranked_ids(self, questions: Sequence[str], k: int) -> list[Ranked]:
        questions = check_questions(questions)
        k = check_k(k)
        if not questions:
            return []
        scores, ids = self.bm25.search(questions, k, n_threads=self.n_threads, show_progress=self.show_progress)
        return [[(str(p), float(s)) for s, p in zip(srow, prow)] for srow, prow in zip(scores, ids)]
