"""Evaluation: DPR top-k accuracy, MRR/nDCG/recall through ir-measures, SQuAD EM/F1 for answers.

    >>> from fastdpr.eval import topk_accuracy
    >>> topk_accuracy([[False, True], [True, False]], ks=(1, 2))
    {'top1': 0.5, 'top2': 1.0}
"""
from fastdpr.eval.qa import evaluate_answers
from fastdpr.eval.retrieval import (
    DEFAULT_KS,
    evaluate_retrieval,
    first_hit_ranks,
    ir_metrics,
    ranking_hits,
    result_hits,
    topk_accuracy,
)

__all__ = [
    "DEFAULT_KS",
    "evaluate_answers",
    "evaluate_retrieval",
    "first_hit_ranks",
    "ir_metrics",
    "ranking_hits",
    "result_hits",
    "topk_accuracy",
]
