"""What every retriever returns, and the passage lookups they share.

Retrievers work on corpus rows (int64) from the index search to the final ranking; passage ids and texts are
looked up once, at the end, for the rows that are returned."""
from __future__ import annotations

from typing import Sequence

import numpy as np

Ranked = list[tuple[str, float]]  # (passage id, score), best first


def check_questions(questions) -> list[str]:
    if isinstance(questions, str):
        raise TypeError("retrieve() takes a list of questions, not a single string")
    questions = list(questions)
    for i, q in enumerate(questions):
        if not isinstance(q, str):
            raise TypeError(f"question #{i} is {type(q).__name__}, not str")
    return questions


def check_k(k: int) -> int:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def empty_result(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, rows)`` of ``n`` questions with nothing found: ``-inf`` and row ``-1`` everywhere."""
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


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
    out = []
    for srow, rrow in zip(np.asarray(scores).tolist(), np.asarray(rows, dtype=np.int64).tolist()):
        passages = []
        for s, r in zip(srow, rrow):
            if r < 0:
                continue
            p = corpus[r]
            passages.append({"id": p["id"], "title": p.get("title", ""), "text": p.get("text", ""), "score": float(s)})
        out.append(passages)
    return out


class Retriever:
    """Common surface: ``search`` (scores and corpus rows, the cheap form every retriever computes),
    ``ranked_ids`` (passage ids and scores) and ``retrieve`` (full passages)."""

    corpus = None

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
        """``(scores (n, k), corpus rows int64 (n, k))``, best first; row -1 where fewer than ``k`` were found."""
        raise NotImplementedError

    def ranked_ids(self, questions: Sequence[str], k: int) -> list[Ranked]:
        """Top-``k`` ``(passage id, score)`` of each question, best first."""
        return ranked_from_rows(self.corpus, *self.search(questions, k))

    def retrieve(self, questions: Sequence[str], k: int = 100) -> list[list[dict]]:
        """Top-``k`` passages of each question as dicts ``{id, title, text, score}``, best first."""
        return passages_from_rows(self.corpus, *self.search(questions, k))
