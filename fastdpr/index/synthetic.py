"""Synthetic DPR-like vectors for tests and benchmarks: a non-normalised Gaussian mixture (cluster centres,
low-rank spread within each cluster, log-normal norms), where inner-product graphs meet high-norm hubs.

>>> from fastdpr.index.synthetic import gaussian_mixture
>>> base, queries = gaussian_mixture(1000, 32, n_queries=10, seed=0)
>>> base.shape, queries.shape
((1000, 32), (10, 32))
"""
from __future__ import annotations

import numpy as np


def gaussian_mixture(n: int, dim: int, n_queries: int = 100, n_clusters: int = 64, rank: int = 16,
                     norm_sigma: float = 0.35, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(base (n, dim), queries (n_queries, dim))`` float32. Each point is a cluster centre plus a spread inside
    a random ``rank``-dimensional subspace of its cluster plus isotropic noise, rescaled to a log-normal norm
    (``norm_sigma``); queries come from the same mixture with their own norms."""
    rng = np.random.default_rng(seed)
    rank = max(1, min(rank, dim))
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    bases = rng.standard_normal((n_clusters, rank, dim)).astype(np.float32) / np.sqrt(rank)

    def draw(count: int) -> np.ndarray:
        out = np.empty((count, dim), dtype=np.float32)
        step = 65536
        for start in range(0, count, step):
            m = min(step, count - start)
            c = rng.integers(0, n_clusters, size=m)
            coeff = rng.standard_normal((m, rank)).astype(np.float32)
            x = centres[c] + 0.8 * np.einsum("mr,mrd->md", coeff, bases[c]) \
                + 0.3 * rng.standard_normal((m, dim)).astype(np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            x *= rng.lognormal(0.0, norm_sigma, size=(m, 1)).astype(np.float32)
            out[start:start + m] = x
        return out

    return draw(n), draw(n_queries)


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean fraction of the true top-``k`` ids found in the first ``k`` results (``-1`` never counts)."""
    hits = 0
    for f, t in zip(found[:, :k], truth[:, :k]):
        hits += len(np.intersect1d(f[f >= 0], t[t >= 0]))
    return hits / float(truth.shape[0] * k)
