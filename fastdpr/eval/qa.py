"""Reader metrics, all in one place: SQuAD answer normalisation, exact match and token F1 of one prediction, the
best over a question's gold answers, and their mean over questions.

SQuAD's rules (``evaluate-v1.1.py``): lowercase, drop ASCII punctuation, drop the articles a/an/the, fold
whitespace; EM compares the normalised strings, F1 the multisets of their tokens.

    >>> evaluate_answers(["Denver Broncos", "Paris"], [["Denver Broncos"], ["Lyon"]])
    {'em': 0.5, 'f1': 0.5, 'n': 2}
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

__all__ = [
    "normalize_answer",
    "exact_match_score",
    "f1_score",
    "max_over_ground_truths",
    "best_exact_match",
    "best_f1",
    "evaluate_answers",
]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the, fold whitespace.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """SQuAD token-overlap F1 between normalised strings.

    When either side normalises to no tokens, F1 is 1.0 if both do and 0.0 otherwise (SQuAD v2's rule; v1.1 gave
    0.0 even for two empty strings, which would score a correct "The" against gold "the" as wrong).
    """
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(gold)
    return 2 * precision * recall / (precision + recall)


def max_over_ground_truths(metric, prediction: str, ground_truths: Iterable[str]) -> float:
    """The best ``metric(prediction, gold)`` over the gold answers (0.0 when there are none)."""
    return max((metric(prediction, g) for g in ground_truths), default=0.0)


def best_exact_match(prediction: str, ground_truths: Iterable[str]) -> float:
    return max_over_ground_truths(exact_match_score, prediction, ground_truths)


def best_f1(prediction: str, ground_truths: Iterable[str]) -> float:
    return max_over_ground_truths(f1_score, prediction, ground_truths)


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
