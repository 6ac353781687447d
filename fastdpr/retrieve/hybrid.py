"""Hybrid dense + BM25 retrieval (DPR paper §5.1): fuse the union of each side's top-K.

Linear fusion: ``score = dense + alpha * bm25``; a passage found by one side only gets, for the other side, the
lowest score in that side's list (it ranked below everything listed there). Reciprocal-rank fusion
(``method="rrf"``): ``score = sum over sides of 1 / (rrf_k + rank)``, rank counted from 1, nothing added by a
side that did not list the passage. Ties keep the dense list's order, then the sparse list's.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fastdpr.retrieve.base import Ranked, Retriever, check_k, check_questions

DEFAULT_ALPHA_GRID = (0.0,) + tuple(round(10 ** (e / 4), 6) for e in range(-12, 9))  # 0, 0.001 .. 100


class _Candidates:
    """One question's candidate union: ids in tie-break order and each side's (filled) score and rank."""

    __slots__ = ("ids", "dense", "sparse", "dense_rank", "sparse_rank")

    def __init__(self, dense: Ranked, sparse: Ranked):
        position: dict[str, int] = {}
        for pid, _ in list(dense) + list(sparse):
            position.setdefault(pid, len(position))
        n = len(position)
        self.ids = list(position)
        self.dense, self.dense_rank = _side(dense, position, n)
        self.sparse, self.sparse_rank = _side(sparse, position, n)


def _side(ranked: Ranked, position: dict[str, int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of one side over the union (missing ones filled with this list's minimum) and 1-based ranks
    (0 = not listed). A passage listed twice keeps its first, best entry."""
    scores = np.empty(n, dtype=np.float64)
    ranks = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=bool)
    for rank, (pid, score) in enumerate(ranked, start=1):
        j = position[pid]
        if not seen[j]:
            seen[j] = True
            scores[j] = score
            ranks[j] = rank
    fill = scores[seen].min() if seen.any() else 0.0
    scores[~seen] = fill
    return scores, ranks


def _fused_scores(c: _Candidates, alpha: float, method: str, rrf_k: float) -> np.ndarray:
    if method == "linear":
        return c.dense + alpha * c.sparse
    return _reciprocal(c.dense_rank, rrf_k) + _reciprocal(c.sparse_rank, rrf_k)


def _reciprocal(ranks: np.ndarray, rrf_k: float) -> np.ndarray:
    """1 / (rrf_k + rank) where the side listed the passage (rank > 0), else 0."""
    out = np.zeros(len(ranks), dtype=np.float64)
    listed = ranks > 0
    out[listed] = 1.0 / (rrf_k + ranks[listed])
    return out


def _order(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, kind="stable")


def fuse(dense: Ranked, sparse: Ranked, *, alpha: float = 1.0, method: str = "linear", rrf_k: float = 60.0,
         k: int | None = None) -> Ranked:
    """Fuse two ranked ``(id, score)`` lists into one, best first (see the module doc for the rules).

    Example: ``fuse([("a", 2.0), ("b", 1.0)], [("b", 10.0)], alpha=0.5)`` gives ``[("a", 7.0), ("b", 6.0)]``:
    ``a`` is missing from the sparse list and gets its minimum, 10.0."""
    _check_method(method)
    c = _Candidates(dense, sparse)
    scores = _fused_scores(c, alpha, method, rrf_k)
    order = _order(scores)[: k if k is not None else None]
    return [(c.ids[j], float(scores[j])) for j in order]


def _check_method(method: str) -> None:
    if method not in ("linear", "rrf"):
        raise ValueError(f"hybrid method must be 'linear' or 'rrf', got {method!r}")


class HybridRetriever(Retriever):
    """Dense + sparse retrieval fused over the union of each side's top-``k_union``.

    Example::

        hybrid = HybridRetriever(DenseRetriever(model, index, corpus), SparseRetriever(bm25, corpus))
        hybrid.alpha = hybrid.tune_alpha(dev_questions, dev_answers)     # on a dev split, never on test
        top = hybrid.retrieve(test_questions, k=100)
    """

    def __init__(self, dense, sparse, alpha: float = 1.0, k_union: int = 1000, method: str = "linear",
                 rrf_k: float = 60.0):
        _check_method(method)
        if rrf_k < 0:
            raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
        self.dense = dense
        self.sparse = sparse
        self.alpha = float(alpha)
        self.k_union = check_k(k_union)
        self.method = method
        self.rrf_k = float(rrf_k)
        self.corpus = dense.corpus if dense.corpus is not None else sparse.corpus
        self.tuning_table: list[dict] = []

    def _candidates(self, questions: list[str]) -> list[_Candidates]:
        dense = self.dense.ranked_ids(questions, self.k_union)
        sparse = self.sparse.ranked_ids(questions, self.k_union)
        return [_Candidates(d, s) for d, s in zip(dense, sparse)]

    def ranked_ids(self, questions: Sequence[str], k: int) -> list[Ranked]:
        questions = check_questions(questions)
        k = check_k(k)
        out = []
        for c in self._candidates(questions):
            scores = _fused_scores(c, self.alpha, self.method, self.rrf_k)
            out.append([(c.ids[j], float(scores[j])) for j in _order(scores)[:k]])
        return out

    def tune_alpha(self, dev_questions: Sequence[str], dev_answers: Sequence[Sequence[str]],
                   grid: Sequence[float] | None = None, *, k: int = 20, match: str = "string",
                   show_progress: bool = False) -> float:
        """The ``alpha`` in ``grid`` with the best top-``k`` accuracy (DPR ``has_answer``) on a dev set.

        Both sides are searched once; each ``alpha`` only re-ranks. Ties go to the smaller ``alpha``. The full
        table (alpha, top-k accuracy) is kept in :attr:`tuning_table`. Sets nothing: assign the result."""
        from tqdm.auto import tqdm

        from fastdpr.text.answers import has_answer

        if self.method != "linear":
            raise ValueError("only linear fusion has a weight to tune; reciprocal-rank fusion has none")
        questions = check_questions(dev_questions)
        if len(questions) != len(dev_answers):
            raise ValueError(f"{len(questions)} dev questions but {len(dev_answers)} answer lists")
        if not questions:
            raise ValueError("tune_alpha needs at least one dev question")
        grid = sorted(set(float(a) for a in (grid if grid is not None else DEFAULT_ALPHA_GRID)))
        if not grid:
            raise ValueError("the alpha grid is empty")
        candidates = self._candidates(questions)
        hits = []
        for c, answers in tqdm(list(zip(candidates, dev_answers)), desc="has_answer", disable=not show_progress):
            hits.append(np.array(
                [has_answer(self.corpus.get(pid).get("text", ""), list(answers), mode=match) for pid in c.ids],
                dtype=bool,
            ))
        self.tuning_table = []
        for alpha in grid:
            found = sum(bool(h[_order(_fused_scores(c, alpha, "linear", self.rrf_k))[:k]].any())
                        for c, h in zip(candidates, hits))
            self.tuning_table.append({"alpha": alpha, f"top{k}": found / len(questions)})
        best = max(self.tuning_table, key=lambda row: (row[f"top{k}"], -row["alpha"]))
        return best["alpha"]


__all__ = ["HybridRetriever", "fuse", "DEFAULT_ALPHA_GRID"]
