"""Hybrid dense + BM25 retrieval (DPR paper §5.1): fuse the union of each side's top-K.

Fusions (``method``):

- ``"linear"`` (default): ``score = n(dense) + alpha * n(bm25)``, where ``n`` min-max normalises one side's
  scores per question over that side's top-K list (best = 1, K-th = 0). Dense inner products and BM25 scores live
  on unrelated scales (cosine 0.4-0.9 against BM25 4-33 on NQ), so a raw weight only works once tuned to them;
  after normalisation ``alpha = 1`` weighs the two rankings equally whatever the model and corpus. Min-max rather
  than z-scores: both reach the same accuracy on NQ (``benchmarks/results/hybrid_fusion.md`` at c97483c: top-20
  .936 vs .935, untuned, above dense .915 and BM25 .855), but min-max is bounded, so a passage one side did not list gets
  exactly that side's floor, 0, and alpha reads as the weight of one ranking against the other.
- ``"linear-raw"``: ``score = dense + alpha * bm25`` on the raw scores, DPR's own fusion; ``alpha`` must be tuned
  (``tune_alpha``) because it depends on the score scales.
- ``"rrf"``: reciprocal-rank fusion, ``score = sum over sides of 1 / (rrf_k + rank)``, rank counted from 1,
  nothing added by a side that did not list the passage.

In the linear fusions a passage found by one side only gets, for the other side, the lowest score in that side's
list (it ranked below everything listed there), i.e. 0 after normalisation. Ties keep the dense list's order,
then the sparse list's. Everything runs on int64 corpus rows, vectorised over questions.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fastdpr.errors import InputError
from fastdpr.retrieve.base import Ranked, Retriever, check_k, check_question_vectors, check_questions, empty_result

DEFAULT_ALPHA_GRID = (0.0,) + tuple(round(10 ** (e / 4), 6) for e in range(-12, 9))  # 0, 0.001 .. 100
METHODS = ("linear", "linear-raw", "rrf")
DEFAULT_ALPHA = 1.0


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"hybrid method must be one of {', '.join(METHODS)}; got {method!r}")


def _keys(rows: np.ndarray, valid: np.ndarray, modulus: int, missing: int) -> np.ndarray:
    """One int64 key per (question, row) pair, so that a single sort or search serves all questions at once."""
    question = np.arange(rows.shape[0], dtype=np.int64)[:, None]
    return np.where(valid, question * modulus + rows, missing)


def _first_listing(rows: np.ndarray, modulus: int) -> np.ndarray:
    """Entries that count: a real row (>= 0), and the first time the list names it."""
    valid = rows >= 0
    keys = _keys(rows, valid, modulus, -1).ravel()
    order = np.argsort(keys, kind="stable")
    later = np.zeros(keys.size, dtype=bool)
    later[order[1:]] = keys[order[1:]] == keys[order[:-1]]
    return valid & ~later.reshape(rows.shape)


def _lookup(rows, valid, other_rows, other_valid, modulus) -> tuple[np.ndarray, np.ndarray]:
    """For each entry of one side: whether the other side lists the same passage, and at which column."""
    width = other_rows.shape[1]
    if width == 0 or rows.size == 0:
        return np.zeros(rows.shape, dtype=np.int64), np.zeros(rows.shape, dtype=bool)
    other = _keys(other_rows, other_valid, modulus, -1).ravel()
    order = np.argsort(other, kind="stable")
    ordered = other[order]
    wanted = _keys(rows, valid, modulus, -2)
    at = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
    found = valid & (ordered[at] == wanted)
    return order[at] % width, found


class _Union:
    """The candidate union of many questions at once. Columns are the dense list, then the sparse list; a sparse
    entry whose passage the dense list also holds is no candidate of its own (its dense column stands for it)."""

    def __init__(self, d_scores, d_rows, s_scores, s_rows):
        d_rows = np.asarray(d_rows, dtype=np.int64)
        s_rows = np.asarray(s_rows, dtype=np.int64)
        n = d_rows.shape[0]
        d_rows, s_rows = d_rows.reshape(n, -1), s_rows.reshape(n, -1)
        d_scores = np.asarray(d_scores, dtype=np.float64).reshape(d_rows.shape)
        s_scores = np.asarray(s_scores, dtype=np.float64).reshape(s_rows.shape)
        modulus = int(max(d_rows.max(initial=0), s_rows.max(initial=0))) + 2
        d_valid, s_valid = _first_listing(d_rows, modulus), _first_listing(s_rows, modulus)
        d_at, d_in_s = _lookup(d_rows, d_valid, s_rows, s_valid, modulus)
        s_at, s_in_d = _lookup(s_rows, s_valid, d_rows, d_valid, modulus)
        self.rows = np.concatenate([d_rows, s_rows], axis=1)
        self.candidate = np.concatenate([d_valid, s_valid & ~s_in_d], axis=1)
        # each side's raw score and 1-based rank for every column (rank 0: that side does not list the passage)
        d_cols, s_cols = np.arange(1, d_rows.shape[1] + 1), np.arange(1, s_rows.shape[1] + 1)
        self.dense_listed = np.concatenate([d_valid, s_in_d], axis=1)
        self.sparse_listed = np.concatenate([d_in_s, s_valid], axis=1)
        self.dense_raw = np.concatenate([d_scores, _gather(d_scores, s_at)], axis=1)
        self.sparse_raw = np.concatenate([_gather(s_scores, d_at), s_scores], axis=1)
        self.dense_rank = np.concatenate([np.where(d_valid, d_cols, 0), np.where(s_in_d, s_at + 1, 0)], axis=1)
        self.sparse_rank = np.concatenate([np.where(d_in_s, d_at + 1, 0), np.where(s_valid, s_cols, 0)], axis=1)
        self._components: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def components(self, method: str, rrf_k: float) -> tuple[np.ndarray, np.ndarray]:
        """``(dense part, sparse part)`` per column: the fused score is ``dense + alpha * sparse`` (rrf: alpha 1)."""
        if method == "rrf":
            return _reciprocal(self.dense_rank, rrf_k), _reciprocal(self.sparse_rank, rrf_k)
        if method not in self._components:
            normalise = method == "linear"
            self._components[method] = (_side(self.dense_raw, self.dense_listed, normalise),
                                        _side(self.sparse_raw, self.sparse_listed, normalise))
        return self._components[method]

    def fused(self, alpha: float, method: str, rrf_k: float) -> np.ndarray:
        dense, sparse = self.components(method, rrf_k)
        return dense + sparse if method == "rrf" else dense + alpha * sparse

    def order(self, fused: np.ndarray) -> np.ndarray:
        """Column order of each question: candidates by fused score, best first, ties by column (dense first)."""
        return np.lexsort((-fused, ~self.candidate), axis=-1)

    def top(self, fused: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n, width = self.rows.shape
        scores, rows = empty_result(n, k)
        scores = scores.astype(np.float64)
        order = self.order(fused)[:, :k]
        keep = np.take_along_axis(self.candidate, order, axis=1)
        scores[:, : order.shape[1]] = np.where(keep, np.take_along_axis(fused, order, axis=1), -np.inf)
        rows[:, : order.shape[1]] = np.where(keep, np.take_along_axis(self.rows, order, axis=1), -1)
        return scores, rows


def _gather(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``values[i, at[i, j]]``; 0 where the list is empty (those entries are masked as not listed anyway)."""
    if values.shape[1] == 0:
        return np.zeros(at.shape, dtype=values.dtype)
    return np.take_along_axis(values, at, axis=1)


def _side(raw: np.ndarray, listed: np.ndarray, normalise: bool) -> np.ndarray:
    """One side's score for every column: its own where it lists the passage, else the lowest it listed (or 0
    when it listed nothing); min-max normalised per question when asked (a list of equal scores gives all 0)."""
    low = np.where(listed, raw, np.inf).min(axis=1, initial=np.inf, keepdims=True)
    low = np.where(np.isfinite(low), low, 0.0)
    values = np.where(listed, raw, low)
    if not normalise:
        return values
    high = np.where(listed, raw, -np.inf).max(axis=1, initial=-np.inf, keepdims=True)
    span = np.where(np.isfinite(high), high, 0.0) - low
    return np.where(span > 0, (values - low) / np.where(span > 0, span, 1.0), 0.0)


def _reciprocal(ranks: np.ndarray, rrf_k: float) -> np.ndarray:
    """1 / (rrf_k + rank) where the side listed the passage (rank > 0), else 0."""
    return np.where(ranks > 0, 1.0 / (rrf_k + np.maximum(ranks, 1)), 0.0)


def fuse(dense: Ranked, sparse: Ranked, *, alpha: float = DEFAULT_ALPHA, method: str = "linear",
         rrf_k: float = 60.0, k: int | None = None) -> Ranked:
    """Fuse two ranked ``(id, score)`` lists into one, best first (see the module doc for the rules).

    Example: ``fuse([("a", 2.0), ("b", 1.0)], [("b", 10.0)], alpha=0.5, method="linear-raw")`` gives
    ``[("a", 7.0), ("b", 6.0)]``: ``a`` is missing from the sparse list and gets its minimum, 10.0."""
    _check_method(method)
    code: dict[str, int] = {}
    for pid, _ in list(dense) + list(sparse):
        code.setdefault(pid, len(code))
    ids = list(code)

    def arrays(ranked):
        return (np.array([[s for _, s in ranked]], dtype=np.float64).reshape(1, -1),
                np.array([[code[p] for p, _ in ranked]], dtype=np.int64).reshape(1, -1))

    union = _Union(*arrays(dense), *arrays(sparse))
    scores, rows = union.top(union.fused(alpha, method, rrf_k), k if k is not None else union.rows.shape[1])
    return [(ids[r], float(s)) for s, r in zip(scores[0].tolist(), rows[0].tolist()) if r >= 0]


class HybridRetriever(Retriever):
    """Dense + sparse retrieval fused over the union of each side's top-``k_union``.

    The default fusion (min-max normalised linear, ``alpha = 1``) needs no tuning; ``tune_alpha`` on a dev split
    can still pick a better weight for any linear fusion.

    Questions are texts: BM25 scores their words. Vectors the dense side would compute anyway (a
    ``DenseRetriever.encode`` run elsewhere) go alongside them, ``search(questions, k, vectors=...)`` (also
    ``ranked_ids`` and ``retrieve``), and the dense side searches those instead of encoding the texts.

    Example::

        hybrid = HybridRetriever(DenseRetriever(model, index, corpus), SparseRetriever(bm25, corpus))
        top = hybrid.retrieve(test_questions, k=100)
        hybrid.alpha = hybrid.tune_alpha(dev_questions, dev_answers)     # optional; on a dev split, never on test
    """

    def __init__(self, dense, sparse, alpha: float = DEFAULT_ALPHA, k_union: int = 1000, method: str = "linear",
                 rrf_k: float = 60.0, chunk_size: int = 1024):
        _check_method(method)
        if not (math.isfinite(rrf_k) and rrf_k >= 0):
            raise ValueError(f"rrf_k must be a finite number >= 0, got {rrf_k}")
        if not math.isfinite(alpha):  # a NaN or infinite weight makes every fused score NaN
            raise ValueError(f"alpha must be a finite number, got {alpha}")
        self.dense = dense
        self.sparse = sparse
        self.alpha = float(alpha)
        self.k_union = check_k(k_union)
        self.method = method
        self.rrf_k = float(rrf_k)
        self.chunk_size = check_k(chunk_size)  # questions fused per round: bounds the (n, 2 * k_union) arrays
        self.corpus = dense.corpus if dense.corpus is not None else sparse.corpus
        self.tuning_table: list[dict] = []

    def _union(self, questions: list[str], vectors: np.ndarray | None = None) -> _Union:
        dense = self.dense.search(questions if vectors is None else vectors, self.k_union)
        return _Union(*dense, *self.sparse.search(questions, self.k_union))

    def search(self, questions: Sequence[str], k: int, *, vectors: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Fused ``(scores, corpus rows)`` of ``questions`` (texts), the dense side searching ``vectors`` (one
        row per question) when given."""
        if isinstance(questions, np.ndarray):
            raise InputError("hybrid search needs the question texts (BM25 scores their words); pass the texts, and "
                             "their vectors as vectors=... to search the dense side with them")
        questions = check_questions(questions)
        k = check_k(k)
        if vectors is not None:
            vectors = check_question_vectors(np.asarray(vectors), getattr(self.dense, "dim", None))
            if len(vectors) != len(questions):
                raise InputError(f"{len(vectors)} question vectors for {len(questions)} questions: give one each")
        if not questions:
            return empty_result(0, k)
        if self.corpus is not None:
            from fastdpr.index.base import check_padding

            check_padding(len(questions), k, len(self.corpus), "the corpus", "passages")  # before the (n, k) arrays
        parts = []
        for start in range(0, len(questions), self.chunk_size):
            chunk = slice(start, start + self.chunk_size)
            union = self._union(questions[chunk], None if vectors is None else vectors[chunk])
            parts.append(union.top(union.fused(self.alpha, self.method, self.rrf_k), k))
        return np.concatenate([s for s, _ in parts]), np.concatenate([r for _, r in parts])

    def tune_alpha(self, dev_questions: Sequence[str], dev_answers: Sequence[Sequence[str]],
                   grid: Sequence[float] | None = None, *, k: int = 20, match: str = "string",
                   show_progress: bool = False) -> float:
        """The ``alpha`` in ``grid`` with the best top-``k`` accuracy (DPR ``has_answer``) on a dev set, for this
        retriever's (linear) fusion.

        Both sides are searched once and each candidate is checked for an answer once; each ``alpha`` only
        re-ranks. Ties go to the smaller ``alpha``. The full table (alpha, top-k accuracy) is kept in
        :attr:`tuning_table`. Sets nothing: assign the result."""
        from fastdpr.eval.retrieval import ranking_hits

        if self.method == "rrf":
            raise ValueError("only linear fusion has a weight to tune; reciprocal-rank fusion has none")
        questions = check_questions(dev_questions)
        if len(questions) != len(dev_answers):
            raise ValueError(f"{len(questions)} dev questions but {len(dev_answers)} answer lists")
        if not questions:
            raise ValueError("tune_alpha needs at least one dev question")
        k = check_k(k)
        grid = sorted(set(float(a) for a in (grid if grid is not None else DEFAULT_ALPHA_GRID)))
        if not grid:
            raise ValueError("the alpha grid is empty")
        union = self._union(questions)
        hits = np.zeros(union.rows.shape, dtype=bool)
        candidates = [rows[c] for rows, c in zip(union.rows, union.candidate)]
        flags = _hits_with_progress(ranking_hits, candidates, dev_answers, self.corpus, match, show_progress)
        for i, f in enumerate(flags):
            hits[i, union.candidate[i]] = f
        self.tuning_table = []
        for alpha in grid:
            top = union.order(union.fused(alpha, self.method, self.rrf_k))[:, :k]
            found = np.take_along_axis(hits & union.candidate, top, axis=1).any(axis=1)
            self.tuning_table.append({"alpha": alpha, f"top{k}": float(found.mean())})
        best = max(self.tuning_table, key=lambda row: (row[f"top{k}"], -row["alpha"]))
        return best["alpha"]


def _hits_with_progress(ranking_hits, candidates, answers, corpus, match, show_progress) -> list[list[bool]]:
    from fastdpr.progress import progress

    out: list[list[bool]] = []
    step = 256
    with progress(total=len(candidates), desc="has_answer", unit="q", enabled=show_progress) as bar:
        for start in range(0, len(candidates), step):
            out.extend(ranking_hits(candidates[start:start + step], list(answers[start:start + step]), corpus,
                                    mode=match))
            bar.update(min(step, len(candidates) - start))
    return out


__all__ = ["HybridRetriever", "fuse", "DEFAULT_ALPHA", "DEFAULT_ALPHA_GRID", "METHODS"]
