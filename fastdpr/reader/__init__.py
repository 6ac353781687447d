"""Extractive reader (DPR): span start/end logits and passage selection over retrieved passages; EM/F1.

    from fastdpr.reader import Reader, evaluate_answers
    reader = Reader.from_pretrained("reader/")
    predictions = reader.read(questions, retrieved, top_k=10, precision="bf16")   # or "fp32" (default on CPU)
    evaluate_answers([p["answer"] for p in predictions], gold_answers)   # {"em": .., "f1": .., "n": ..}

Training: ``reader.fit(dpr_results, ...)``; from questions and a retriever in one call,
:func:`train_reader_from_questions`; the benchmark's trained reader from the cache, :func:`load_cached_reader`;
offline span data with the test sets held out, :mod:`fastdpr.reader.data`.
"""
from __future__ import annotations

from fastdpr.reader.decode import best_spans
from fastdpr.reader.features import ReaderInputs, answer_char_spans, locate_answer_spans, tokenize_pairs
from fastdpr.reader.model import Reader, ReaderConfig, bf16_supported, select_answer
from fastdpr.reader.pipeline import load_cached_reader, reader_cache_dir, train_reader_from_questions


def evaluate_answers(predictions: list[str], gold: list[list[str]]) -> dict:
    """Mean SQuAD exact match and F1 (best over each question's gold answers), as fractions in 0..1."""
    from fastdpr.eval.qa import best_exact_match, best_f1

    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} questions")
    n = len(predictions)
    if n == 0:
        return {"em": 0.0, "f1": 0.0, "n": 0}
    em = sum(best_exact_match(p, g) for p, g in zip(predictions, gold)) / n
    f1 = sum(best_f1(p, g) for p, g in zip(predictions, gold)) / n
    return {"em": float(em), "f1": float(f1), "n": n}


__all__ = ["Reader", "ReaderConfig", "ReaderInputs", "answer_char_spans", "best_spans", "bf16_supported",
           "evaluate_answers", "load_cached_reader", "locate_answer_spans", "reader_cache_dir", "select_answer",
           "tokenize_pairs", "train_reader_from_questions"]
