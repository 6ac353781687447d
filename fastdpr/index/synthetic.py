"""Synthetic DPR-like vectors for tests and benchmarks.

``gaussian_mixture``: a non-normalised Gaussian mixture (cluster centres, low-rank spread within each cluster,
log-normal norms), where inner-product graphs meet high-norm hubs. It is far easier to partition than real
embeddings (an ideal IVF over 512 balanced lists covers 95% of a query's top-100 with 6 lists; real MiniLM vectors
need 22 with mean pooling, 128 with [CLS]; ``benchmarks/results/ann_calibration.md at c97483c``).

``calibrated(n, dim, profile)``: vectors shaped like all-MiniLM-L6-v2's, with profiles ``minilm-mean``
(unnormalised mean pooling) and ``minilm-cls`` (raw [CLS]) fitted to the real 23,582-passage pool by
``benchmarks/ann_fit_synthetic.py``, ``minilm-mean-growth`` fitted to how the larger real pool of
``benchmarks/real_pool.py`` (questions against a corpus mostly off their topic) grows from 10,000 to 30,000
passages, and ``minilm-mean-pool`` to how it grows from 10,000 to 100,000 with the queries' local intrinsic
dimensionality in the fit and the leaf count's growth searched. A passage is ``shared + r * u``: one vector every
passage shares (real sentence embeddings have a large common component: [CLS] nearly all of it), plus a unit
direction ``u`` at a distance ``r`` drawn from the measured quantile table. ``u`` is a topic centre, plus a leaf
centre around it, plus spread inside the leaf, each with variances decaying along the principal directions of a
random rotation; ``r`` is partly set by the leaf (real high-norm mean-pooled passages sit together). A query is a
passage-like direction mixed with isotropic noise (real questions sit off the passage manifold), at the query
distance table, around a shared vector of its own (real questions are longer and point elsewhere).

Scaling to other sizes: the spectrum is a function of ``j / dim`` (principal components for 90% of the variance
grow in proportion to ``dim``), distances and shared vectors are kept as measured at d = 384 (the norms a search
meets do not change with ``dim``), and the number of leaves and topics grows as ``n ** leaf_growth`` from the
profile's ``reference_n``: with growth 1 (the first three profiles) their sizes are fixed in passages and a corpus
grows by new topics (at 1M: about ``1e6 / leaf_size`` leaves); with growth 0 (``minilm-mean-pool``) their number is
fixed and a larger corpus is a larger sample of one distribution, each set the first rows of every larger one.
Which of the two a real corpus does is measured, not assumed: ``benchmarks/ann_growth.py`` sets each profile against
the real pool's nested prefixes up to 1M passages (``benchmarks/results/ann_growth.md``). The real pool gets easier to
partition as it grows (its queries' local intrinsic dimensionality falls), which no denser sample of full-dimensional
leaves does; ``minilm-mean-families`` adds near-repeat families, a fixed number of points inside the leaves around
which passages gather once the corpus is large enough to put several in one (real text repeats itself: templated
pages, versions of one document), fitted to the real curve from 10k to 1M (``benchmarks/results/ann_fit_curve.md``).
Generation is chunked (``BLOCK`` rows per random stream, any chunking gives the same rows) and float32 throughout:
memory is the ``dim x dim`` rotation, the leaf centres (one row per leaf), the families' offsets and a block.

>>> from fastdpr.index.synthetic import calibrated, gaussian_mixture
>>> base, queries = gaussian_mixture(1000, 32, n_queries=10, seed=0)
>>> base.shape, queries.shape
((1000, 32), (10, 32))
>>> base, queries = calibrated(1000, 32, "minilm-cls", n_queries=10, seed=0)
>>> base.dtype, queries.shape
(dtype('float32'), (10, 32))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from fastdpr.errors import InputError


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


# Quantile levels of a profile's norm tables: lengths are drawn by inverse-CDF interpolation in log space between
# them, which keeps the measured shape (mean pooling's heavy right tail) without choosing a parametric family.
NORM_LEVELS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)
BLOCK = 16384  # rows drawn from one random stream: any chunking of the output gives the same rows


@dataclass(frozen=True)
class Profile:
    """Parameters of :func:`calibrated`, fitted by ``benchmarks/ann_fit_synthetic.py`` to the real pool."""

    name: str
    spectrum_decay: float  # variance along the j-th principal direction ~ ((j - 1/2) / dim + spectrum_offset)^-decay
    spectrum_offset: float
    mean_length: float  # length of the vector every passage shares
    norm_table: tuple  # a passage's distance from the shared vector, at NORM_LEVELS
    leaf_size: float  # passages per leaf cluster, on average
    leaves_per_topic: float  # leaf clusters per topic, on average
    topic_share: float  # share of a direction's variance set by its topic centre
    leaf_share: float  # share set by the leaf centre around its topic (the rest: spread inside the leaf)
    query_mean: tuple  # the queries' shared vector: (along the passages' shared vector, orthogonal to it)
    query_norm_table: tuple  # a query's distance from the queries' shared vector, at NORM_LEVELS
    off_manifold: float  # share of a query's direction that is isotropic rather than drawn like a passage
    norm_by_leaf: float = 0.0  # share of a passage's (normal-score) length set by its leaf, inherited from topics
    # how the number of leaves (and topics) grows with n: ``reference_n / leaf_size * (n / reference_n) **
    # leaf_growth``. 1 keeps the leaves' size fixed (the corpus grows by new topics); 0 keeps their number fixed (the
    # corpus is a larger sample of one distribution, as the real pool's nested prefixes are)
    leaf_growth: float = 1.0
    reference_n: int = 10_000
    # near-repeat families: ``families`` points fixed for the whole distribution (not growing with n), each inside a
    # leaf, setting ``family_share`` of a passage's direction variance. While n is well under ``families`` a family
    # has at most one passage and the set looks like one without them; as n grows the families fill up, a query's
    # nearest passages gather into a few of them, and the local dimensionality falls (real text has near-repeated
    # and templated passages; without them no denser sample of Gaussian leaves gets easier to partition)
    families: int = 0
    family_share: float = 0.0


# Fitted by benchmarks/ann_fit_synthetic.py (its output pasted here); how close each comes to the real pool:
# benchmarks/results/ann_calibration.md at c97483c.
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile(name="minilm-mean", spectrum_decay=1.661, spectrum_offset=0.1, mean_length=0.4709,
            norm_table=(1.0146, 1.3619, 1.5648, 1.683, 1.9043, 2.2111, 2.5972, 3.2072, 4.4097, 6.3362, 7.4014,
                        8.1439),
            leaf_size=50.8, leaves_per_topic=22.627, topic_share=0.3, leaf_share=0.3, query_mean=(2.2473, 1.5809),
            query_norm_table=(3.7146, 4.0779, 4.4373, 4.5871, 4.885, 5.272, 5.6622, 6.0707, 6.3312, 6.6302, 7.0574,
                              7.0882),
            off_manifold=0.0, norm_by_leaf=0.3),
    Profile(name="minilm-cls", spectrum_decay=1.964, spectrum_offset=0.1, mean_length=5.9956,
            norm_table=(2.1284, 2.7296, 3.033, 3.2057, 3.5276, 3.9055, 4.3293, 4.794, 5.1117, 5.6548, 6.184, 6.8175),
            leaf_size=32.0, leaves_per_topic=22.65, topic_share=0.15, leaf_share=0.325, query_mean=(5.9283, 0.9651),
            query_norm_table=(3.0882, 3.472, 3.9218, 4.2716, 4.7514, 5.155, 5.5036, 5.7995, 5.979, 6.263, 6.4528,
                              6.5134),
            off_manifold=0.575, norm_by_leaf=0.375),
    # fitted to how the real pool of benchmarks/real_pool.py (Debian's documentation and dictionaries with the QA
    # corpus; NQ-open and DPR questions) grows from 10,000 to 30,000 passages: `python
    # benchmarks/ann_fit_synthetic.py --growth 10000,30000 --grid --pooling mean`. Questions against a corpus mostly
    # off their topic: weak clusters, a top-100 spread over many lists. The larger sizes of that pool are the test of
    # its growth: benchmarks/results/ann_growth.md
    Profile(name="minilm-mean-growth", spectrum_decay=1.7699, spectrum_offset=0.1, mean_length=0.7049,
            norm_table=(1.2332, 1.6756, 1.9176, 2.043, 2.2735, 2.557, 2.9377, 3.665, 4.2425, 5.252, 5.9916, 6.8281),
            leaf_size=50.0, leaves_per_topic=32.0, topic_share=0.1, leaf_share=0.0, query_mean=(-0.065, 0.7592),
            query_norm_table=(3.9956, 4.3865, 4.741, 4.8879, 5.2706, 5.6848, 6.0501, 6.353, 6.5706, 6.9618, 7.3488,
                              7.3668),
            off_manifold=0.625, norm_by_leaf=0.75),
    # fitted to the same pool's growth from 10,000 to 100,000 passages with the queries' LID in the loss and the
    # leaf count's growth searched: `python benchmarks/ann_fit_synthetic.py --growth 10000,30000,100000 --grid
    # --start-profile minilm-mean-growth --name minilm-mean-pool --pooling mean`. The fit chose a fixed number of
    # leaves (growth 0): a larger set is a larger sample of one distribution, as the pool's prefixes are.
    # 300,000 and 1,000,000 passages are the test: benchmarks/results/ann_growth.md
    Profile(name="minilm-mean-pool", spectrum_decay=1.7699, spectrum_offset=0.1, mean_length=0.7023,
            norm_table=(1.152, 1.676, 1.9169, 2.0456, 2.2751, 2.5574, 2.9448, 3.6664, 4.2366, 5.2453, 6.0417, 7.2327),
            leaf_size=100.0, leaves_per_topic=32.0, topic_share=0.02, leaf_share=0.1, query_mean=(-0.0648, 0.7592),
            query_norm_table=(3.9956, 4.3865, 4.741, 4.8879, 5.2706, 5.6848, 6.0501, 6.353, 6.5706, 6.9618, 7.3488,
                              7.3668),
            off_manifold=0.0, norm_by_leaf=0.975, leaf_growth=0.0, reference_n=10_000),
    # minilm-mean-pool with near-repeat families, fitted to the real pool's committed growth curve from 10,000 to
    # 1,000,000 passages: `python benchmarks/ann_fit_synthetic.py --targets benchmarks/results/ann_growth.json
    # --start-profile minilm-mean-pool --name minilm-mean-families --rounds 1 --finalists 2`
    # (benchmarks/results/ann_fit_curve.md)
    Profile(name="minilm-mean-families", spectrum_decay=1.7699, spectrum_offset=0.1, mean_length=0.7023,
            norm_table=(1.152, 1.676, 1.9169, 2.0456, 2.2751, 2.5574, 2.9448, 3.6664, 4.2366, 5.2453, 6.0417, 7.2327),
            leaf_size=100.0, leaves_per_topic=32.0, topic_share=0.02, leaf_share=0.1, query_mean=(-0.0648, 0.7592),
            query_norm_table=(3.9956, 4.3865, 4.741, 4.8879, 5.2706, 5.6848, 6.0501, 6.353, 6.5706, 6.9618, 7.3488,
                              7.3668),
            off_manifold=0.15, norm_by_leaf=0.975, leaf_growth=0.0, reference_n=10_000, families=100_000,
            family_share=0.75),
)}


def leaf_count(n: int, profile: Profile) -> int:
    """Leaf clusters of ``profile`` at ``n`` passages (``n / leaf_size`` where ``leaf_growth`` is 1)."""
    if profile.leaf_growth == 1.0:
        return max(1, round(n / profile.leaf_size))
    return max(1, round(profile.reference_n / profile.leaf_size * (n / profile.reference_n) ** profile.leaf_growth))


_phi = np.frompyfunc(lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), 1, 1)
_phi_inv = np.frompyfunc(NormalDist().inv_cdf, 1, 1)


def _norms_at(levels: np.ndarray, table) -> np.ndarray:
    """Lengths at quantile ``levels`` of a profile's table (log-linear between its quantiles)."""
    return np.exp(np.interp(levels, NORM_LEVELS, np.log(np.asarray(table, dtype=np.float64))))


class CalibratedGenerator:
    """The structure of a calibrated set (spectrum, rotation, topic and leaf centres, shared vectors) drawn once
    from ``seed``; passages are then produced in any chunks (:meth:`passages`) and always come out the same.

    Memory: the structure holds a ``dim x dim`` rotation, the leaf centres and the families' offsets (float16,
    ``2 x families x dim`` bytes); passages are
    produced in blocks of ``BLOCK`` rows (1M x 768 in chunks: 31-40 s on one thread, 0.47 GB peak for the whole
    process; ``benchmarks/results/ann_synthetic_generation.md``)."""

    def __init__(self, n: int, dim: int, profile: str | Profile, seed: int = 0):
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise InputError(f"unknown synthetic profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
            profile = PROFILES[profile]
        if n < 1 or dim < 2:
            raise InputError(f"need n >= 1 and dim >= 2, got n={n}, dim={dim}")
        if profile.families < 0 or profile.topic_share + profile.leaf_share + profile.family_share > 1.0:
            raise InputError(f"profile {profile.name!r}: need families >= 0 and topic + leaf + family shares <= 1")
        self.n, self.dim, self.profile, self.seed = int(n), int(dim), profile, int(seed)
        p = profile
        rng = np.random.default_rng([self.seed, 0])
        j = (np.arange(dim) + 0.5) / dim
        var = (j + p.spectrum_offset) ** -p.spectrum_decay
        self.scale = np.sqrt(var / var.sum()).astype(np.float32)  # unit expected length before normalising
        # a random rotation, so the spectrum is not aligned with the coordinates (product quantizers would notice)
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        self.rotation = (q * np.sign(np.diag(r))).astype(np.float32)
        self.n_leaves = leaf_count(n, p)
        n_topics = max(1, round(self.n_leaves / p.leaves_per_topic))
        topics = rng.standard_normal((n_topics, dim), dtype=np.float32) * (self.scale * math.sqrt(p.topic_share))
        topic_of = rng.integers(0, n_topics, self.n_leaves)
        self.leaves = topics[topic_of]
        self.leaves += rng.standard_normal((self.n_leaves, dim), dtype=np.float32) * (
            self.scale * math.sqrt(p.leaf_share))
        # real passages of similar length sit together (70% of the log-length variance of mean-pooled MiniLM
        # passages lies between 512 L2 lists, 30% for [CLS]): a leaf's normal score for length, shared with its
        # topic as much as its direction is
        kin = p.topic_share / max(p.topic_share + p.leaf_share, 1e-12)
        score = (math.sqrt(kin) * rng.standard_normal(n_topics)[topic_of]
                 + math.sqrt(1.0 - kin) * rng.standard_normal(self.n_leaves))
        # ranked onto evenly spaced normal quantiles: with a few hundred leaves a plain draw would move the norm
        # quantiles of the whole set by 10% and more
        rank = np.empty(self.n_leaves)
        rank[np.argsort(score, kind="stable")] = (np.arange(self.n_leaves) + 0.5) / self.n_leaves
        self.leaf_norm_score = _phi_inv(rank).astype(np.float64)
        self.inner_scale = self.scale * np.float32(
            math.sqrt(max(0.0, 1.0 - p.topic_share - p.leaf_share - p.family_share)))
        # leaves of long passages would pull the mean of the set away from the shared vector, by an amount that
        # shrinks as leaves are added; centring them on their length-weighted mean keeps the shared vector alone
        # setting the anisotropy at any n (a unit direction's mean is about centre / sqrt(|centre|^2 + spread))
        nodes, weights = np.polynomial.hermite_e.hermegauss(16)
        levels = _phi(np.sqrt(p.norm_by_leaf) * self.leaf_norm_score[:, None]
                      + np.sqrt(1.0 - p.norm_by_leaf) * nodes[None, :]).astype(np.float64)
        expected_length = _norms_at(levels, p.norm_table) @ (weights / weights.sum())
        spread = float(np.sum(self.inner_scale.astype(np.float64) ** 2))
        w = expected_length / np.sqrt(np.einsum("ij,ij->i", self.leaves, self.leaves) + spread)
        self.leaves -= (w @ self.leaves / w.sum()).astype(np.float32)
        shared = rng.standard_normal((2, dim))
        shared[0] /= np.linalg.norm(shared[0])
        shared[1] -= (shared[1] @ shared[0]) * shared[0]
        shared[1] /= np.linalg.norm(shared[1])
        self.mean = (p.mean_length * shared[0]).astype(np.float32)
        self.query_mean = (p.query_mean[0] * shared[0] + p.query_mean[1] * shared[1]).astype(np.float32)
        self.family_leaf = self.family_offset = None
        if p.families > 0:  # a stream of its own: the profiles without families keep their rows
            frng = np.random.default_rng([self.seed, 3])
            self.family_leaf = frng.integers(0, self.n_leaves, p.families)
            # float16 halves the largest table of the structure (1M families x 768: 1.5 GB); an offset's
            # rounding (2^-11 of its size) is far below the spread around it
            self.family_offset = np.empty((p.families, dim), dtype=np.float16)
            fscale = self.scale * np.float32(math.sqrt(p.family_share))
            for lo in range(0, p.families, BLOCK):
                hi = min(p.families, lo + BLOCK)
                self.family_offset[lo:hi] = frng.standard_normal((hi - lo, dim), dtype=np.float32) * fscale

    def _directions(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Unit passage-like directions in the spectral frame (a leaf centre, a family's offset where the profile
        has families, plus the spread inside) and their leaves."""
        if self.family_leaf is None:
            leaf = rng.integers(0, self.n_leaves, count)
            y = self.leaves[leaf]
        else:
            family = rng.integers(0, self.profile.families, count)
            leaf = self.family_leaf[family]
            y = self.leaves[leaf]
            y += self.family_offset[family]
        y += rng.standard_normal((count, self.dim), dtype=np.float32) * self.inner_scale
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        return y, leaf

    def _block(self, b: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, b])
        count = min(BLOCK, self.n - b * BLOCK)
        # a profile whose structure does not depend on n draws whole blocks, so that a smaller set is exactly the
        # first rows of a larger one; the others keep the rows they were drawn with (and their cached sets)
        drawn = BLOCK if self.profile.leaf_growth == 0.0 else count
        y, leaf = self._directions(rng, drawn)
        rho = self.profile.norm_by_leaf
        score = math.sqrt(rho) * self.leaf_norm_score[leaf] + math.sqrt(1.0 - rho) * rng.standard_normal(drawn)
        y *= _norms_at(_phi(score).astype(np.float64), self.profile.norm_table).astype(np.float32)[:, None]
        # the whole drawn block goes through one product: a product over fewer rows may take another BLAS kernel
        # and round differently, and the first rows of a nested set must be the larger set's rows bit for bit
        x = (y @ self.rotation)[:count]
        x += self.mean
        return x

    def passages(self, start: int = 0, stop: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the passages, float32, written into ``out`` when given (e.g. a memory map)."""
        stop = self.n if stop is None else stop
        if not 0 <= start <= stop <= self.n:
            raise InputError(f"rows {start}:{stop} outside 0:{self.n}")
        if out is None:
            out = np.empty((stop - start, self.dim), dtype=np.float32)
        elif out.shape != (stop - start, self.dim):
            raise InputError(f"out has shape {out.shape}, expected {(stop - start, self.dim)}")
        for b in range(start // BLOCK, (stop + BLOCK - 1) // BLOCK):
            lo, hi = max(start, b * BLOCK), min(stop, (b + 1) * BLOCK)
            out[lo - start:hi - start] = self._block(b)[lo - b * BLOCK:hi - b * BLOCK]
        return out

    def queries(self, count: int) -> np.ndarray:
        """``count`` queries: passage-like directions pushed off the passages by isotropic noise, at the query
        lengths, around the queries' own shared vector."""
        if count < 0:
            raise InputError(f"query count must be >= 0, got {count}")
        rng = np.random.default_rng([self.seed, 2])
        p = self.profile
        y, _ = self._directions(rng, count)
        noise = rng.standard_normal((count, self.dim), dtype=np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        y = math.sqrt(1.0 - p.off_manifold) * y + math.sqrt(p.off_manifold) * noise
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        y *= _norms_at(rng.random(count), p.query_norm_table).astype(np.float32)[:, None]
        x = y @ self.rotation
        x += self.query_mean
        return x


def calibrated(n: int, dim: int, profile: str | Profile = "minilm-mean", n_queries: int = 1000,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(base (n, dim), queries (n_queries, dim))`` float32 shaped like real sentence embeddings (see
    :class:`CalibratedGenerator`; profiles in ``PROFILES``)."""
    gen = CalibratedGenerator(n, dim, profile, seed)
    return gen.passages(), gen.queries(n_queries)
