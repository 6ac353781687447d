"""What every retriever returns, and the passage lookups they share."""
from __future__ import annotations

from typing import Sequence

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


def to_passages(corpus, ranked: Sequence[Ranked]) -> list[list[dict]]:
    """Turn ranked (id, score) lists into passage dicts ``{id, title, text, score}`` through the corpus."""
    out = []
    for ranking in ranked:
        passages = []
        for pid, score in ranking:
            p = corpus.get(pid)
            passages.append({"id": pid, "title": p.get("title", ""), "text": p.get("text", ""), "score": float(score)})
        out.append(passages)
    return out


class Retriever:
    """Common surface: ``ranked_ids`` (ids and scores only, cheap) and ``retrieve`` (full passages)."""

    corpus = None

    def ranked_ids(self, questions: Sequence[str], k: int) -> list[Ranked]:  # pragma: no cover - interface
        raise NotImplementedError

    def retrieve(self, questions: Sequence[str], k: int = 100) -> list[list[dict]]:
        """Top-``k`` passages of each question as dicts ``{id, title, text, score}``, best first."""
        return to_passages(self.corpus, self.ranked_ids(questions, k))
