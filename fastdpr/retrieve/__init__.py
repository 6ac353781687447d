"""Retrievers: dense (bi-encoder + MIPS index), sparse (BM25) and hybrid (normalised linear, raw linear or
reciprocal-rank fusion).

Each has ``search(questions, k) -> (scores, corpus rows)``, ``ranked_ids(questions, k) -> [[(id, score)]]`` and
``retrieve(questions, k) -> list[list[{id, title, text, score}]]``. ``DenseRetriever`` also takes the questions'
vectors in place of their texts, and gives them: ``encode(questions) -> (n, d) float32``; ``HybridRetriever`` takes
them beside the texts (``vectors=``), which BM25 needs."""
from fastdpr.retrieve.dense import DenseRetriever
from fastdpr.retrieve.hybrid import DEFAULT_ALPHA, DEFAULT_ALPHA_GRID, METHODS, HybridRetriever, fuse
from fastdpr.retrieve.results import dpr_results, hits, run_format, search_to_run, trec_run
from fastdpr.retrieve.sparse import SparseRetriever

__all__ = ["DenseRetriever", "SparseRetriever", "HybridRetriever", "fuse", "DEFAULT_ALPHA", "DEFAULT_ALPHA_GRID",
           "METHODS", "dpr_results", "trec_run", "hits", "run_format", "search_to_run"]
