"""Sparse retrieval: BM25 (Java-free, over bm25s), an optional Lucene peer, and hard-negative mining."""
from fastdpr.sparse.bm25 import BM25

__all__ = ["BM25", "mine_hard_negatives", "MiningStats"]


def __getattr__(name):
    # mining pulls in the answer matcher; import it only when asked for
    if name in ("mine_hard_negatives", "MiningStats"):
        from fastdpr.sparse import mining

        return getattr(mining, name)
    raise AttributeError(name)
