"""What every retriever returns, and the passage lookups they share.

Retrievers work on corpus rows (int64) from the index search to the final ranking; passage ids and texts are
looked up once, at the end, for the rows that are returned."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fastdpr.errors import InputError

Ranked = list[tuple[str, float]]  # (passage id, score), best first
Questions = Sequence[str] | np.ndarray  # question texts, or (dense search) their vectors


def check_questions(questions) -> list[str]:
    if isinstance(questions, str):
        raise TypeError("retrieve() takes a list of questions, not a single string")
    if isinstance(questions, np.ndarray):
        raise TypeError("this retriever takes question texts, not an array: only dense search takes question vectors")
    questions = list(questions)
    for i, q in enumerate(questions):
        if not isinstance(q, str):
            raise TypeError(f"question #{i} is {type(q).__name__}, not str")
    return questions


def check_question_vectors(vectors: np.ndarray, dim: int | None) -> np.ndarray:
    """Question vectors as the index is searched with them: float32, C-contiguous, shape ``(n, dim)``; a 1-D vector
    is one question. Anything else is an ``InputError`` naming what is wrong: another ``dim`` than the index's
    (``None``: not known, the index checks it), a dtype that is not floating point (integers are more likely token
    ids than vectors), a NaN or infinity (it would rank passages in an arbitrary order)."""
    if vectors.dtype.kind != "f":
        raise InputError(f"question vectors must be floating point (float32), got dtype {vectors.dtype}")
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    if vectors.ndim != 2:
        raise InputError(f"question vectors must have shape (n, d), or (d,) for one question; got {vectors.shape}")
    if dim is not None and vectors.shape[1] != dim:
        raise InputError(f"question vectors have d={vectors.shape[1]} but the index holds vectors of d={dim}")
    with np.errstate(over="ignore"):  # float64 past float32's range becomes inf, refused next
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise InputError(f"question vector {int(np.argmin(finite))} holds NaN or infinity")
    return vectors


def check_k(k: int) -> int:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def empty_result(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, rows)`` of ``n`` questions with nothing found: ``-inf`` and row ``-1`` everywhere."""
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


def found(scores: Sequence[float], rows: Sequence[int]) -> list[tuple[float, int]]:
    """``(score, row)`` of one question's result that name a passage: row -1 pads a list shorter than k."""
    return [(s, r) for s, r in zip(scores, rows) if r >= 0]


def passage_fields(corpus, row: int) -> dict:
    """``{id, title, text}`` of a corpus row: the passage every retriever answers with, before its score."""
    p = corpus[row]
    return {"id": p["id"], "title": p.get("title", ""), "text": p.get("text", "")}


def ranked_from_rows(corpus, scores: np.ndarray, rows: np.ndarray) -> list[Ranked]:
    """``(id, score)`` lists from a search's ``(scores, rows)``; rows < 0 (nothing found) are left out. The ids of
    all rows are looked up in one call."""
    rows = np.asarray(rows, dtype=np.int64)
    ids = corpus.ids_at(rows.ravel()) if rows.size else []
    width = rows.shape[1] if rows.ndim == 2 else 0
    out = []
    for i, srow in enumerate(np.asarray(scores).tolist()):
        line = ids[i * width:(i + 1) * width]
        out.append([(pid, float(s)) for pid, s in zip(line, srow) if pid is not None])
    return out


def passages_from_rows(corpus, scores: np.ndarray, rows: np.ndarray) -> list[list[dict]]:
    """Passage dicts ``{id, title, text, score}`` from a search's ``(scores, rows)``, read by row."""
    return [[{**passage_fields(corpus, r), "score": float(s)} for s, r in found(srow, rrow)]
            for srow, rrow in zip(np.asarray(scores).tolist(), np.asarray(rows, dtype=np.int64).tolist())]


class Retriever:
    """Common surface: ``search`` (scores and corpus rows, the cheap form every retriever computes),
    ``ranked_ids`` (passage ids and scores) and ``retrieve`` (full passages). ``options`` are passed on to the
    retriever's ``search`` (``HybridRetriever``'s ``vectors``)."""

    corpus = None

    def search(self, questions: Questions, k: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        """``(scores (n, k), corpus rows int64 (n, k))``, best first; row -1 where fewer than ``k`` were found."""
        raise NotImplementedError

    def ranked_ids(self, questions: Questions, k: int, **options) -> list[Ranked]:
        """Top-``k`` ``(passage id, score)`` of each question, best first."""
        return ranked_from_rows(self.corpus, *self.search(questions, k, **options))

    def retrieve(self, questions: Questions, k: int = 100, **options) -> list[list[dict]]:
        """Top-``k`` passages of each question as dicts ``{id, title, text, score}``, best first."""
        return passages_from_rows(self.corpus, *self.search(questions, k, **options))
