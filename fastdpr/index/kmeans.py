"""k-means for the numpy IVF-PQ backend (coarse centroids, PQ codebooks): the numpy twin of csrc/kmeans.cpp, used
when the compiled core is absent or disabled.

>>> import numpy as np
>>> c = kmeans(np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32), k=16)
>>> c.shape
(16, 8)
"""
from __future__ import annotations

import math

import numpy as np

from fastdpr.errors import InputError


def magnitude_exponent(a: np.ndarray) -> int:
    """e such that a * 2^-e has its largest finite magnitude in [0.5, 1), or 0 when that magnitude lies in
    [2^-30, 2^30] already (csrc/kmeans.h magnitude_exponent: where float32 distances neither overflow nor fall below
    the normal range)."""
    finite = a[np.isfinite(a)] if a.size else a
    top = float(np.abs(finite).max(initial=0.0))
    if top == 0.0 or 2.0 ** -30 <= top <= 2.0 ** 30:
        return 0
    return int(np.frexp(top)[1])


def nearest(x: np.ndarray, centroids: np.ndarray, max_inner_product: bool, block: int = 4096) -> np.ndarray:
    """Row-wise argmin ||x - c||^2 (or argmax <x, c>), ties to the lowest index, in blocks (both sides scaled by a
    power of two where the centroids' magnitude is extreme, which changes no ranking)."""
    e = magnitude_exponent(centroids)
    if e:
        centroids = np.ldexp(centroids, -e).astype(np.float32)
    half = np.zeros(centroids.shape[0], np.float32) if max_inner_product else \
        0.5 * np.einsum("ij,ij->i", centroids, centroids, dtype=np.float32)
    out = np.empty(x.shape[0], dtype=np.int64)
    for s in range(0, x.shape[0], block):
        xb = np.ldexp(x[s:s + block], -e).astype(np.float32) if e else x[s:s + block]
        out[s:s + block] = np.argmax(xb @ centroids.T - half, axis=1)
    return out


def small_cluster_floor(balance: float, n: int, k: int) -> int:
    """Fewest points a cluster may keep with ``balance`` (csrc/kmeans.cpp computes it the same way)."""
    return int(float(balance) * float(n) / float(k))


def kmeans(x: np.ndarray, k: int, niter: int = 20, seed: int = 1234, spherical: bool = False,
           max_points_per_centroid: int = 256, kmeanspp: bool = True, balance: float = 0.0) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding and empty-cluster splitting (numpy twin of csrc/kmeans.cpp; the
    random streams differ, so the centroids are equally good rather than identical).

    ``balance`` (in [0, 1)): after every update but the last, a cluster holding fewer than balance x the mean
    cluster size is re-seeded by splitting the largest one, as empty clusters always are."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, d = x.shape
    for name, value in (("k", k), ("niter", niter), ("max_points_per_centroid", max_points_per_centroid)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"k-means: {name} must be a positive integer, got {value!r}")
    if isinstance(balance, bool) or not isinstance(balance, (int, float, np.floating)) or not 0 <= balance < 1:
        raise InputError(f"k-means: balance must be in [0, 1), got {balance!r}")
    if n < k:
        raise InputError(f"k-means: need at least k={k} training points, got {n}")
    if not np.isfinite(x).all():
        raise InputError(f"k-means: training point {int(np.argwhere(~np.isfinite(x))[0, 0])} contains NaN or Inf")
    # trained at a largest magnitude in [0.5, 1) where float32 distances would overflow or vanish (csrc/kmeans.cpp)
    e = magnitude_exponent(x)
    if e:
        c = _kmeans(np.ldexp(x, -e).astype(np.float32), k, niter, seed, spherical, max_points_per_centroid, kmeanspp,
                    balance)
        return c if spherical else np.ldexp(c, e).astype(np.float32)
    return _kmeans(x, k, niter, seed, spherical, max_points_per_centroid, kmeanspp, balance)


def _kmeans(x: np.ndarray, k: int, niter: int, seed: int, spherical: bool, max_points_per_centroid: int,
            kmeanspp: bool, balance: float) -> np.ndarray:
    n, d = x.shape
    rng = np.random.default_rng(seed)
    if n > k * max_points_per_centroid:
        x = x[np.sort(rng.choice(n, k * max_points_per_centroid, replace=False))]
        n = x.shape[0]
    c = np.empty((k, d), dtype=np.float32)
    if kmeanspp:  # greedy k-means++, as in csrc/kmeans.cpp
        sample = x[rng.permutation(n)[:min(n, max(4 * k, 2048))]]
        sq = np.einsum("ij,ij->i", sample, sample, dtype=np.float64)
        trials = 2 + int(math.log(k))
        c[0] = sample[rng.integers(sample.shape[0])]
        d2 = np.maximum(sq - 2 * (sample @ c[0]) + float(c[0] @ c[0]), 0)
        for j in range(1, k):
            total = d2.sum()
            if total > 0:
                at = np.searchsorted(np.cumsum(d2), rng.random(trials) * total)
                at = np.minimum(at, sample.shape[0] - 1)
            else:
                at = rng.integers(sample.shape[0], size=trials)
            cand = sample[at]
            dist = sq[None, :] - 2 * (cand @ sample.T) + np.einsum("ij,ij->i", cand, cand)[:, None]
            pots = np.minimum(d2[None, :], np.maximum(dist, 0))
            best = int(np.argmin(pots.sum(1)))
            c[j] = cand[best]
            d2 = pots[best]
    else:
        c[:] = x[rng.permutation(n)[:k]]

    def normalise():
        norms = np.linalg.norm(c, axis=1, keepdims=True)
        np.divide(c, norms, out=c, where=norms > 0)

    if spherical:
        normalise()
    eps = np.where(np.arange(d) % 2 == 0, 1.0 / 1024, -1.0 / 1024).astype(np.float32)
    for it in range(niter):
        labels = nearest(x, c, spherical)
        counts = np.bincount(labels, minlength=k)
        sums = np.stack([np.bincount(labels, weights=x[:, t], minlength=k) for t in range(d)], axis=1)
        filled = counts > 0
        c[filled] = (sums[filled] / counts[filled, None]).astype(np.float32)
        floor = max(1, small_cluster_floor(balance, n, k)) if it + 1 < niter else 1
        for j in range(k):
            if counts[j] >= floor:
                continue
            big = int(np.argmax(counts))
            if counts[big] < 2 * floor:
                break
            c[j] = c[big] * (1 + eps)
            c[big] = c[big] * (1 - eps)
            counts[j] = counts[big] // 2
            counts[big] -= counts[j]
        if spherical:
            normalise()
    return c


def split_children(counts: np.ndarray, k: int) -> np.ndarray:
    """Children per group for ``k`` centroids in all (csrc/coarse.h split_children): in proportion to ``counts``
    by largest remainder (ties to the lower group), every non-empty group at least 1 and none more than its count.
    An ``InputError`` when that is impossible."""
    counts = np.asarray(counts, np.int64)
    total, nonempty = int(counts.sum()), int((counts > 0).sum())
    if k < nonempty:
        raise InputError(f"two-level k-means: {k} centroids cannot give each of the {nonempty} non-empty groups one")
    if k > total:
        raise InputError(f"two-level k-means: need at least k={k} training points, got {total}")
    quota = k * counts.astype(np.float64) / total
    out = np.where(counts > 0, np.minimum(counts, np.maximum(1, np.floor(quota).astype(np.int64))), 0)
    # the floors leave fewer than len(counts) to place, the floors of 1 at most that many too many
    while out.sum() < k:
        rem = np.where(out < counts, quota - out, -np.inf)
        out[int(np.argmax(rem))] += 1  # the first of the largest remainders: the lower group
    while out.sum() > k:
        excess = np.where(out > 1, out - quota, -np.inf)
        out[len(out) - 1 - int(np.argmax(excess[::-1]))] -= 1  # the most over-served, the higher group on ties
    return out


# a group with more than this many times the mean share of children is trained in two levels itself, this many
# levels deep at most (csrc/coarse.cpp: one oversized top cluster would bring back most of the flat cost)
OVERSIZED_GROUP = 4
MAX_GROUP_DEPTH = 3


def two_level_kmeans(x: np.ndarray, k: int, groups: int, niter: int = 20, seed: int = 1234, spherical: bool = False,
                     max_points_per_centroid: int = 256, balance: float = 0.0, _depth: int = 0) -> np.ndarray:
    """k centroids in two levels (numpy twin of csrc/coarse.h two_level_kmeans): k-means into ``groups`` clusters,
    the points filed under them, k split over the groups in proportion to their points (split_children), then
    k-means per group (seed + 1 + g; a group of more than OVERSIZED_GROUP times the mean share in two levels
    again). Per iteration n x (groups + k / groups) x d instead of n x k x d."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or not 1 <= groups <= k:
        raise InputError(f"two-level k-means: groups must be in [1, k={k}], got {groups!r}")
    if groups == 1:
        return kmeans(x, k, niter, seed, spherical, max_points_per_centroid, balance=balance)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[0] < k:
        raise InputError(f"k-means: need at least k={k} training points, got {x.shape[0]}")
    top = kmeans(x, groups, niter, seed, spherical, max_points_per_centroid, balance=balance)
    label = nearest(x, top, spherical)
    counts = np.bincount(label, minlength=groups)
    children = split_children(counts, k)
    out = []
    for g in np.flatnonzero(children):
        points = x[label == g]
        if children[g] == counts[g]:  # k-means of n points into n clusters would end with the points
            if spherical:
                norms = np.linalg.norm(points.astype(np.float64), axis=1, keepdims=True)
                points = np.divide(points, norms, out=points.astype(np.float64), where=norms > 0).astype(np.float32)
            out.append(points)
        else:
            kg, share = int(children[g]), -(-k // groups)
            sub = -(-kg // share) if _depth < MAX_GROUP_DEPTH and kg > OVERSIZED_GROUP * share else 1
            out.append(two_level_kmeans(points, kg, sub, niter, seed + 1 + int(g), spherical, max_points_per_centroid,
                                        balance, _depth + 1))
    return np.concatenate(out).astype(np.float32)
