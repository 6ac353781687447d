"""Comparing two retrievers on the same questions: per-question metrics from first-hit ranks, and a paired bootstrap
interval of their difference.

A rank here is 1-based, 0 for "no hit in the list" (as written by the quickstart's runs). The pairs are resampled
together, so the interval reflects how much the difference depends on which questions were asked, not two
independent spreads.

Example::

    >>> import numpy as np
    >>> a, b = np.array([1, 0, 3, 12]), np.array([1, 2, 1, 4])
    >>> per_question(b, "top1").tolist()
    [1.0, 0.0, 1.0, 0.0]
    >>> round(paired_bootstrap(a, b, "mrr10", rounds=200)[0], 3)
    0.354
"""
from __future__ import annotations

import numpy as np

#: metrics :func:`per_question` knows: ``top<k>`` (a hit within the first k) and ``mrr10``
METRICS = ("top1", "top5", "top20", "top100", "mrr10")


def ranks_from_first_hits(firsts) -> np.ndarray:
    """1-based ranks (0: no hit) from :func:`fastdpr.eval.first_hit_ranks`' 0-based ranks or None."""
    return np.array([0 if r is None else r + 1 for r in firsts], dtype=np.int64)


def per_question(ranks, metric: str) -> np.ndarray:
    """Each question's value of ``metric`` (``top<k>`` or ``mrr10``) from its 1-based first-hit rank."""
    ranks = np.asarray(ranks, dtype=np.int64)
    found = ranks > 0
    if metric == "mrr10":
        return np.where(found & (ranks <= 10), 1.0 / np.maximum(ranks, 1), 0.0)
    if metric.startswith("top") and metric[3:].isdigit() and int(metric[3:]) > 0:
        return (found & (ranks <= int(metric[3:]))).astype(float)
    raise ValueError(f"unknown metric {metric!r}: top<k> or mrr10")


def paired_bootstrap(a, b, metric: str, rounds: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``metric`` on ``b`` minus on ``a`` over the same questions, with the 95% percentile interval of
    that mean over ``rounds`` resamples of the questions."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"need two equal, non-empty rank vectors, got shapes {a.shape} and {b.shape}")
    diff = per_question(b, metric) - per_question(a, metric)
    rng = np.random.default_rng(seed)
    # one (rounds, n) draw: a few MB for the quickstart's sets, and no Python loop over the rounds
    means = diff[rng.integers(0, len(diff), size=(rounds, len(diff)))].mean(axis=1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
