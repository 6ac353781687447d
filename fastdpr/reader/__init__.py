"""Extractive reader (DPR): span start/end logits and passage selection over retrieved passages; EM/F1.

    from fastdpr.reader import Reader, evaluate_answers
    reader = Reader.from_pretrained("reader/")
    predictions = reader.read(questions, retrieved, top_k=10)
    evaluate_answers([p["answer"] for p in predictions], gold_answers)   # {"em": .., "f1": .., "n": ..}
"""
from __future__ import annotations

from fastdpr.reader.decode import best_spans
from fastdpr.reader.features import ReaderInputs, locate_answer_spans, tokenize_pairs
from fastdpr.reader.model import Reader, ReaderConfig


def evaluate_answers(predictions: list[str], gold: list[list[str]]) -> dict:
    """Mean SQuAD exact match and F1 (best over each question's gold answers), as fractions in 0..1."""
    from fastdpr.text.answers import best_exact_match, best_f1

    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} questions")
    n = len(predictions)
    if n == 0:
        return {"em": 0.0, "f1": 0.0, "n": 0}
    em = sum(best_exact_match(p, g) for p, g in zip(predictions, gold)) / n
    f1 = sum(best_f1(p, g) for p, g in zip(predictions, gold)) / n
    return {"em": float(em), "f1": float(f1), "n": n}


__all__ = ["Reader", "ReaderConfig", "ReaderInputs", "best_spans", "evaluate_answers", "locate_answer_spans",
           "tokenize_pairs"]
