"""Reader metrics: SQuAD exact match and token F1, each the best over a question's gold answers, averaged.

    >>> evaluate_answers(["Denver Broncos", "Paris"], [["Denver Broncos"], ["Lyon"]])
    {'em': 0.5, 'f1': 0.5, 'n': 2}
"""
from __future__ import annotations

from typing import Sequence

from fastdpr.text.answers import best_exact_match, best_f1


def evaluate_answers(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict:
    """Mean EM and F1 (0..1) of ``predictions`` against each question's list of gold ``answers``."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} questions")
    if not predictions:
        raise ValueError("no predictions to evaluate")
    em = sum(best_exact_match(p, g) for p, g in zip(predictions, answers))
    f1 = sum(best_f1(p, g) for p, g in zip(predictions, answers))
    n = len(predictions)
    return {"em": em / n, "f1": f1 / n, "n": n}
