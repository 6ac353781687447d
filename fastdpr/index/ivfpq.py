"""IVF-PQ for maximum inner product: k-means coarse lists + residual product quantization, with an exact re-rank.

The coarse centroids come from L2 k-means with balanced lists (the default): a vector x is filed under its nearest
centroid c in L2 and its residual r = x - c is stored as m one-byte codes. Since <q, x> = <q, c> + <q, r>, a query scores a code row as <q, c> + sum_j LUT_j[code_j]
with one m x 256 table per query (for inner product the table does not depend on the list). Lists are probed in
order of <q, c>. Optionally the full vectors are kept (fp16/fp32, memory-mappable) and the best ``rerank``
candidates are re-scored exactly, which lifts recall@10 to nearly that of exact search.

Why balanced L2 lists (``balance=0.5``: during k-means a list under half the mean size is re-seeded by splitting
the largest one, as ScaNN's partitioner does with its minimum partition size): on real MiniLM passages with
unnormalised mean pooling (norms 1.1 to 8.3; benchmarks/ann_calibrate.py, 23,582 passages, 1,000 NQ questions),
an ideal IVF (exact scores inside the probed lists, nlist 512) must scan a median 21.6% of the vectors to hold
95% of a query's top-100 with spherical lists, 3.3% with L2 lists and 3.6% with balanced L2 lists. Spherical lists group by
direction only, so a list mixes hubs and low-norm passages and <q, c> (c of unit norm) cannot rank lists by the
norms MIPS rewards; L2 lists separate norms, and the high-norm lists come first in order of <q, c>. Without
balance, L2 lists are very uneven (largest 12x the mean): few vectors are scanned, but over many small lists
(a median 114 of 512), so nprobe must be large and stops being a measure of work; balance keeps about the same
scan at a median 22 of 512 lists. Measured with this index (nlist 512, m 48, rerank 400): recall@100 0.57 / 0.54 / 0.95
at nprobe 32 (spherical / L2 / balanced L2). Spherical lists (``spherical=true,balance=0``, the default before)
remain an option; plain L2 lists with IP filing (``assign=ip``) leave half the lists empty (130 of 256).

Example::

    from fastdpr.index import build_index
    index = build_index(vectors, "ivfpq,nlist=1024,m=48,store=fp16")
    scores, ids = index.search(queries, k=100, nprobe=32, rerank=400)

4-bit codes (``nbits=4``): 16 codewords per sub-space, stored in blocks of 32 vectors and
scored with uint8 tables inside SIMD registers (csrc/pq4.h); the best ``rerank`` candidates are then re-scored
exactly from the stored vectors. ``aniso=T`` (0 < T < 1) trains the codebooks for the score-aware (anisotropic) loss
of ScaNN's paper (fastdpr/index/pq4.py) and chooses codes for the same loss. It is off by default because, with an
exact re-rank behind it, it measured no better than plain k-means on the real MiniLM pool and worse on raw [CLS]
vectors (nlist 512, rerank 200, recall@100: mean pooling, 1,000 questions, nprobe 128: T = 0.2 0.980, plain 0.978;
[CLS], 300 questions, every list probed: T = 0 / 0.1 / 0.15 / 0.2 / 0.4 give 0.948 / 0.908 / 0.866 / 0.824 /
0.833), while without a re-rank it ranks better (synthetic mixture, 20k x 64, nprobe 8: recall@10 0.80 vs 0.66)::

    index = build_index(vectors, "ivfpq,nbits=4,nlist=1024,store=fp16")   # m: d/2 two-dimensional sub-spaces
    scores, ids = index.search(queries, k=100, nprobe=32, rerank=400)

Probe order: lists are probed by <q, c> + ``spread`` |q| s_l, where s_l = sqrt(mean ||x - c_l||^2 / d) sqrt(2 ln n_l)
is how far list l's n_l members reach beyond their centroid along a direction (the largest of n_l Gaussian
residuals); ``spread=0`` (the default) is plain <q, c>. At 1M x 768 with 2,048 lists, spread 0.5 put 0.971 of a
query's top-100 inside the first 256 lists against 0.958 (benchmarks/results/ann_probe_study.md). The sums behind
s_l are kept per list and saved; files written before them probe by <q, c> whatever the spread.

4-bit rows (``sq=4``): every vector is also kept as a d/2-byte scalar-quantized row (csrc/sq4.h),
in the file and memory-mapped with the full vectors. A search ranks its ``rerank`` candidates by those rows first
and reads the full vectors of only the best ``exact`` (``"auto"``: 3 k; 0: all of them, the rows unused); without
stored vectors the 4-bit scores are the answer. A 4-bit row is a quarter of an fp16 row's bytes, but scattered
reads are bound by latency: read one query at a time, a 4-bit row cost ~0.2 us at 1M x 768 against ~0.27 us in fp16.
So with a re-rank the queries of one call go in batches of 128 whose candidates' rows (4-bit, then full vectors)
are visited in address order (each query still gets the list it would get alone): with the 1,000 queries in one
call, 2,092 q/s at recall@100 0.951 (nprobe 224, rerank 1,750, spread 0.5, exact 150), 34.0x exact search; one
query per call, 1,361 q/s (benchmarks/results/ann_compressed.md). In a file, the 4-bit rows of DPR's 21M
passages (7.5 GiB) fit the page cache of a 24 GB machine where the fp16 rows (30 GiB) do not::

    index = build_index(vectors, "ivfpq,nbits=4,m=96,store=fp16,aniso=0.2,sq=4,spread=0.5")   # 1M x 768
    index.save("index.fdpr")
    index = load_index("index.fdpr", mmap=True)    # codes in RAM, rows read through the page cache
    scores, ids = index.search(queries, k=100, nprobe=224, rerank=2500, exact=150)

Spec parameters: ``nlist`` (0: about 4 sqrt(n), 2 sqrt(n) for 4-bit codes, a power of two), ``m`` (0: d/8
sub-quantizers, d/2 for 4-bit codes), ``nbits`` (8 or 4), ``aniso`` (4-bit: the anisotropic threshold T; 0, off)
and ``aniso_niter`` (8),
``store`` (none|fp16|fp32; bare ``fp16``/``fp32`` flags work too), ``sq`` (4: 4-bit rows; 0), ``nprobe``,
``rerank``, ``spread`` and ``exact`` (search defaults),
``assign`` (l2|ip: how vectors are filed under centroids), ``niter``, ``pq_niter``, ``seed``,
``max_points_per_centroid`` (coarse k-means subsample, 64), ``pq_max_points_per_centroid`` (256), ``spherical``
(false), ``balance`` (0.5; 0: lists of any size), ``groups`` (0: one flat k-means; see below), ``backend``
(auto|compiled|numpy).

Many lists (``groups``): flat k-means costs n x nlist x d per iteration, ~200 TFLOP for 2M sample rows into 65,536
lists of 768 dimensions. ``groups=G`` (at most nlist; about sqrt(nlist), e.g. ``"ivfpq,nlist=65536,groups=256"``)
trains in two levels, G top clusters and then each cluster's share of the lists (in proportion to its points) on
its own points: n x (G + nlist / G) x d per iteration (csrc/coarse.h). The compiled index also files rows through
groups of its centroids from 16,384 lists on (csrc/ivfpq.cpp), where comparing each row with every centroid would
cost as much again; the numpy backend trains the same two levels and files exactly.

``rerank`` is a number of candidates re-scored exactly, or ``"auto"`` (the default): 4 k when the full vectors are
stored, else none. ``search(..., rerank=None, nprobe=None)`` (the defaults) use the index's own settings. The older
spellings still work: ``rerank=-1`` means ``"auto"``, and in ``search`` ``rerank=-2`` and ``nprobe=0`` mean the
index's setting.

The compiled backend (``fastdpr._C.IVFPQ``) and the numpy backend here give the same codes and scores from the
same trained state and read and write the same file; ``FASTDPR_NO_NATIVE=1`` (or ``force_fallback``) makes
``backend=auto`` pick numpy. That holds for 4-bit codes and 4-bit rows too (fastdpr/index/numpy_pq4.py): numpy
reads, searches and writes them with the compiled answers (scores to float rounding, ties by id), but training
and adding to such an index need the compiled core.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastdpr.errors import InputError, MissingDependency
from fastdpr.index import numpy_pq4
from fastdpr.index._native import fallback_forced, native
from fastdpr.index.base import Index
from fastdpr.index.checks import check_matrix, take_params
from fastdpr.index.rows import check_finite_section
from fastdpr.index.kmeans import kmeans, magnitude_exponent, nearest  # noqa: F401  (kmeans: re-exported)
from fastdpr.index.kmeans import two_level_kmeans
from fastdpr.index.spec import check_storage_flags

KSUB = 256  # codewords per sub-quantizer (8-bit codes)
MAX_M4 = 2048  # 4-bit codes: most sub-quantizers (csrc/pq4.h kMaxM)

SPEC_PARAMS: dict[str, Any] = {
    "nlist": 0,
    "m": 0,
    "nbits": 8,
    # three choices, not the other indexes' fp16 flag: IVF-PQ may keep no vectors at all; "fp16"/"fp32" flags map here
    "store": "none",
    "nprobe": 16,
    "rerank": "auto",
    "assign": "l2",
    "niter": 20,
    "pq_niter": 20,
    "seed": 1234,
    "max_points_per_centroid": 64,
    "pq_max_points_per_centroid": 256,
    "spherical": False,
    "balance": 0.5,
    "groups": 0,
    "backend": "auto",
    "aniso": 0.0,
    "aniso_niter": 8,
    "spread": 0.0,
    "sq": 0,
    "exact": "auto",
}
NBITS = (4, 8)
# 4-bit codes: points the anisotropic refinement of the codebooks learns from (subsampled above)
ANISO_TRAIN_POINTS = 16384
STORE_CODES = {"none": 0, "fp16": 1, "fp32": 2}

# spread: the probe order adds spread |q| s_l to <q, c> in float32. Useful values are near 1 (0.5 measured best);
# far beyond it the order is that of s_l alone, and 1e300 is not even a float32 (every search refused it)
MAX_SPREAD = 1e6
RERANK_AUTO = "auto"  # re-rank 4 k candidates when the full vectors are stored, else none
EXACT_PER_K = 3  # exact="auto" with sq=4: the best 3 k candidates by 4-bit rows get their exact scores
_LEGACY_RERANK_AUTO = -1  # the old spelling of "auto" (spec strings, files, search)
_LEGACY_INDEX_SETTING = -2  # the old search() spelling of "the index's own setting"


# residuals x - c are float32 and c is a mean of such rows: |x| <= 2^126 keeps them finite (csrc/ivfpq.cpp)
MAX_MAGNITUDE = 2.0 ** 126


def check_magnitude(x: np.ndarray, what: str) -> None:
    """Components beyond ``MAX_MAGNITUDE`` are an ``InputError`` naming the first such row (in chunks)."""
    if x.dtype.kind != "f" or float(np.finfo(x.dtype).max) <= MAX_MAGNITUDE:
        return
    for start in range(0, x.shape[0], 65536):
        big = np.abs(x[start:start + 65536]) > MAX_MAGNITUDE
        if big.any():
            row = start + int(np.argwhere(big)[0, 0])
            raise InputError(f"ivfpq: {what} row {row} has a component beyond 2^126 (8.5e37): its residuals would "
                             "leave float32; rescale the vectors")


def rerank_setting(value: Any, where: str = "ivfpq") -> int | str:
    """A ``rerank`` setting: a count >= 0 or ``"auto"`` (also spelled -1)."""
    if isinstance(value, str) and value.strip().lower() == RERANK_AUTO:
        return RERANK_AUTO
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{where}: rerank must be a count >= 0 or 'auto', got {value!r}")
    if value == _LEGACY_RERANK_AUTO:
        return RERANK_AUTO
    if value < 0:
        raise InputError(f"{where}: rerank must be a count >= 0 or 'auto', got {value}")
    return int(value)


def exact_setting(value: Any, where: str = "ivfpq") -> int | str:
    """An ``exact`` setting (with ``sq=4``): how many of the candidates ranked by their 4-bit rows are re-scored
    from the full vectors, a count >= 0 (0: all of them, the 4-bit rows unused) or ``"auto"`` (3 k)."""
    if isinstance(value, str) and value.strip().lower() == RERANK_AUTO:
        return RERANK_AUTO
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{where}: exact must be a count >= 0 or 'auto', got {value!r}")
    return int(value)


def spread_setting(value: Any, where: str = "ivfpq") -> float:
    """A ``spread`` setting: a number in [0, MAX_SPREAD] (0: lists probed in order of <q, c> alone)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not math.isfinite(value) or not 0 <= value <= MAX_SPREAD:
        raise InputError(f"{where}: spread must be a number in [0, {MAX_SPREAD:g}], got {value!r}")
    return float(value)


def check_groups(groups: Any, nlist: int, where: str = "ivfpq") -> None:
    """``groups`` (two-level coarse k-means): an integer in [0, nlist] (0: one flat k-means; nlist 0, not yet
    chosen, bounds nothing)."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 0:
        raise InputError(f"{where}: groups must be an integer >= 0 (0: one flat k-means), got {groups!r}")
    if nlist > 0 and groups > nlist:
        raise InputError(f"{where}: groups={groups} exceeds nlist={nlist}; use groups <= nlist, about sqrt(nlist)")


def default_nlist(n: int, nbits: int = 8) -> int:
    """About 4 sqrt(n) lists (4-bit codes: 2 sqrt(n)), a power of two, with at least 39 training points per list
    where possible.

    4-bit codes are scanned several times faster than 8-bit ones, so fewer, larger lists pay: the coarse ranking
    (nlist x d per query) is the cost that shrinks."""
    if n <= 0:
        return 1
    per_root = 2 if nbits == 4 else 4
    nlist = 2 ** max(0, round(math.log2(per_root * math.sqrt(n))))
    return int(max(1, min(nlist, n // 39 if n >= 39 else 1)))


def default_m(dim: int, dims_per_code: int = 8) -> int:
    """The divisor of ``dim`` closest to dim / 8 (8-dimensional sub-vectors; 4-bit codes: dim / 2)."""
    target = max(1.0, dim / dims_per_code)
    divisors = [m for m in range(1, dim + 1) if dim % m == 0]
    return min(divisors, key=lambda m: (abs(m - target), m))


class IVFPQIndex(Index):
    """IVF-PQ index (see the module docstring). Train on a sample, then add; ``build_index`` does both."""

    kind = "ivfpq"
    ranks_past_float32 = True  # its ids are the same at any scale (tests/test_index_reliability.py)
    # None: the index's own settings
    search_params = {"nprobe": None, "rerank": None, "threads": 0, "spread": None, "exact": None}

    def __init__(self, dim: int, nlist: int = 0, m: int = 0, nbits: int = 8, store: str = "none", nprobe: int = 16,
                 rerank: int | str = RERANK_AUTO, assign: str = "l2", niter: int = 20, pq_niter: int = 20,
                 seed: int = 1234,
                 max_points_per_centroid: int = 64, pq_max_points_per_centroid: int = 256, spherical: bool = False,
                 balance: float = 0.5, backend: str = "auto", aniso: float = 0.0, aniso_niter: int = 8,
                 spread: float = 0.0, sq: int = 0, exact: int | str = RERANK_AUTO, groups: int = 0):
        super().__init__(dim)
        where = "ivfpq"
        if nbits not in NBITS:
            raise InputError(f"{where}: nbits={nbits} is not supported; codes are 8-bit (nbits=8) or 4-bit (nbits=4)")
        if isinstance(aniso, bool) or not isinstance(aniso, (int, float)) or not 0 <= aniso < 1:
            raise InputError(f"{where}: aniso (the anisotropic threshold) must be in [0, 1), got {aniso!r}")
        if aniso and nbits != 4:  # 8-bit codes are chosen by plain nearest codeword: the setting would do nothing
            raise InputError(f"{where}: aniso applies to 4-bit codes only (nbits=4), not nbits={nbits}")
        if aniso_niter < 0:
            raise InputError(f"{where}: aniso_niter must be >= 0, got {aniso_niter}")
        spread = spread_setting(spread, where)
        if isinstance(sq, bool) or sq not in (0, 4):
            raise InputError(f"{where}: sq must be 4 (keep 4-bit rows for a first re-rank) or 0, got {sq!r}")
        exact = exact_setting(exact, where)
        if m == 0:
            m = default_m(self.dim, 2) if nbits == 4 else default_m(self.dim)
            if nbits == 4 and m > MAX_M4:
                m = max(d for d in range(1, MAX_M4 + 1) if self.dim % d == 0)
        if m < 1 or self.dim % m != 0:
            raise InputError(f"{where}: m={m} must divide the dimension {self.dim} "
                             f"(e.g. m={default_m(self.dim)})")
        if nlist < 0:
            raise InputError(f"{where}: nlist must be positive (or 0 for automatic), got {nlist}")
        if store not in STORE_CODES:
            raise InputError(f"{where}: store must be one of {sorted(STORE_CODES)}, got {store!r}")
        if assign not in ("l2", "ip"):
            raise InputError(f"{where}: assign must be 'l2' or 'ip', got {assign!r}")
        if nprobe < 1:
            raise InputError(f"{where}: nprobe must be >= 1, got {nprobe}")
        rerank = rerank_setting(rerank, where)
        if rerank != RERANK_AUTO and rerank > 0 and store == "none" and not sq:
            raise InputError(f"{where}: rerank={rerank} needs the full vectors; add store=fp16 or store=fp32")
        for name, value in (("niter", niter), ("pq_niter", pq_niter),
                            ("max_points_per_centroid", max_points_per_centroid),
                            ("pq_max_points_per_centroid", pq_max_points_per_centroid)):
            if value < 1:
                raise InputError(f"{where}: {name} must be >= 1, got {value}")
        if backend not in ("auto", "compiled", "numpy"):
            raise InputError(f"{where}: backend must be auto, compiled or numpy, got {backend!r}")
        if isinstance(balance, bool) or not isinstance(balance, (int, float, np.floating)) or not 0 <= balance < 1:
            raise InputError(f"{where}: balance must be in [0, 1) (0: lists of any size), got {balance!r}")
        if nbits == 4 and m > MAX_M4:
            raise InputError(f"{where}: 4-bit codes take at most {MAX_M4} sub-quantizers, got m={m}")
        check_groups(groups, nlist, where)
        self.backend = backend
        self.sq = int(sq)  # _native() reads it
        self.nbits, self.aniso, self.aniso_niter = int(nbits), float(aniso), int(aniso_niter)
        self.train_losses: list[float] = []  # 4-bit: the anisotropic loss before and after each refinement sweep
        self._native()  # backend=compiled without the compiled core: say so now
        self.nlist, self.m, self.store, self.assign = int(nlist), int(m), store, assign
        self.nprobe, self.rerank, self.spread, self.exact = int(nprobe), rerank, spread, exact
        self.train_params = dict(niter=int(niter), pq_niter=int(pq_niter), seed=int(seed),
                                 max_points_per_centroid=int(max_points_per_centroid),
                                 pq_max_points_per_centroid=int(pq_max_points_per_centroid), spherical=bool(spherical),
                                 balance=float(balance), groups=int(groups))
        self._impl: Any = None  # created by train() (nlist may depend on the training set) or on load
        if self.nlist > 0:
            self._impl = self._make_impl(self.nlist)

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "IVFPQIndex":
        params = dict(params)
        check_storage_flags(params, "ivfpq")
        for flag in ("fp16", "fp32"):
            if flag in params and not isinstance(params[flag], bool):
                raise InputError(f"ivfpq: {flag} is a flag; write {flag} or store={flag}")
            if params.pop(flag, False) is True:
                if "store" in params:
                    raise InputError(f"ivfpq: store={params['store']} and {flag} conflict; give one of them")
                params["store"] = flag
        if "spherical" in params:  # a spec string spells it "spherical", "spherical=true|false|1|0"
            value = params["spherical"]
            words = {"true": True, "1": True, "false": False, "0": False}
            if str(value).lower() not in words:
                raise InputError(f"ivfpq: spherical must be true or false, got {value!r}")
            params["spherical"] = words[str(value).lower()]
        return cls(dim, **take_params(params, SPEC_PARAMS, "ivfpq"))

    def _native(self):
        """The compiled module this index uses, or None for the numpy backend."""
        C = native() if self.backend != "numpy" else None
        if C is None and (self.backend == "compiled" or self.nbits == 4 or self.sq):
            why = ("is disabled (FASTDPR_NO_NATIVE / force_fallback)" if fallback_forced() else
                   "is not used with backend=numpy" if self.backend == "numpy" else
                   "is not available (reinstall fastdpr with a C++ compiler, or use backend=numpy)")
            what = ("backend=compiled" if self.backend == "compiled" else
                    "building nbits=4 (fast-scan codes)" if self.nbits == 4 else "building sq=4 (4-bit rows)")
            raise MissingDependency(f"ivfpq: {what}, but the compiled extension fastdpr._C {why}")
        return C

    def _make_impl(self, nlist: int):
        C = self._native()
        if C is not None:
            impl = C.IVFPQ(self.dim, nlist, self.m, self.nbits, self.store, self.assign == "ip")
            impl.sq = self.sq
            return impl
        return NumpyIVFPQ(self.dim, nlist, self.m, 8, self.store, self.assign == "ip")

    @property
    def compiled(self) -> bool:
        """True when the C++ backend does the work."""
        return self._impl is not None and not isinstance(self._impl, NumpyIVFPQ)

    # -- training -----------------------------------------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return self._impl is not None and self._impl.is_trained

    def train(self, vectors: np.ndarray) -> None:
        """Learn the coarse centroids and the PQ codebooks from sample vectors (n >= nlist and n >= 256)."""
        if self._ntotal() > 0:
            raise InputError("ivfpq: the index already holds vectors; train a new index instead")
        x = vectors if isinstance(vectors, np.ndarray) else np.asarray(vectors)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(f"ivfpq: training vectors must have shape (n, {self.dim}), got {x.shape}")
        n = x.shape[0]
        nlist = self.nlist or default_nlist(n, self.nbits)
        ksub = 2 ** self.nbits
        if n < ksub:
            raise InputError(f"ivfpq: training needs at least {ksub} vectors for {self.nbits}-bit codes, got {n}")
        if nlist > n:
            raise InputError(f"ivfpq: nlist={nlist} exceeds the {n} training vectors; use nlist <= {n} "
                             f"(ideally n >= 39 * nlist)")
        check_groups(self.train_params["groups"], nlist, "ivfpq")
        # k-means subsamples anyway: convert only the rows it can use (a huge fp16 input needs no fp32 copy)
        keep = max(nlist * self.train_params["max_points_per_centroid"],
                   KSUB * self.train_params["pq_max_points_per_centroid"])
        if n > keep:
            rows = np.sort(np.random.default_rng(self.train_params["seed"]).choice(n, keep, replace=False))
            x = x[rows]
        check_magnitude(x, "training vectors")
        x = check_matrix(x, self.dim, "training vectors")
        if self._impl is None or self._impl.nlist != nlist:
            self._impl = self._make_impl(nlist)
        self.nlist = nlist
        self._impl.train(x, **self.train_params)
        if self.nbits == 4 and self.aniso > 0:
            self._train_anisotropic(x)

    def _train_anisotropic(self, x: np.ndarray) -> None:
        """Refine the k-means codebooks of a 4-bit index for the score-aware loss (fastdpr/index/pq4.py) and make
        add() choose codes for the same loss."""
        from fastdpr.index import pq4

        if x.shape[0] > ANISO_TRAIN_POINTS:
            rng = np.random.default_rng(self.train_params["seed"] + 2)
            x = x[np.sort(rng.choice(x.shape[0], ANISO_TRAIN_POINTS, replace=False))]
        eta = pq4.anisotropic_eta(self.dim, self.aniso)
        centroids = self._impl.centroids()
        lists, _ = self._impl.encode(x)
        codebooks, _, self.train_losses = pq4.train_anisotropic(x, x - centroids[lists], self._impl.codebooks(), eta,
                                                                self.aniso_niter)
        self._impl.set_trained(centroids, codebooks)
        self._impl.aniso_eta = eta

    def set_trained(self, centroids: np.ndarray, codebooks: np.ndarray) -> None:
        """Install a trained state: centroids (nlist, dim) and codebooks (m, 2^nbits, dim/m), e.g. from another
        index."""
        centroids = np.ascontiguousarray(centroids, dtype=np.float32)
        codebooks = np.ascontiguousarray(codebooks, dtype=np.float32)
        if centroids.ndim != 2 or centroids.shape[1] != self.dim:
            raise InputError(f"ivfpq: centroids must have shape (nlist, {self.dim}), got {centroids.shape}")
        want = (self.m, 2 ** self.nbits, self.dim // self.m)
        if codebooks.shape != want:
            raise InputError(f"ivfpq: codebooks must have shape {want}, got {codebooks.shape}")
        if self._impl is None or self._impl.nlist != centroids.shape[0]:
            self._impl = self._make_impl(centroids.shape[0])
        self.nlist = centroids.shape[0]
        self._impl.set_trained(centroids, codebooks)

    # -- Index protocol -----------------------------------------------------------------------------------------
    @property
    def stores_fp16(self) -> bool:
        return self.store == "fp16"

    def _takes_half(self) -> bool:
        return self.compiled

    def _ntotal(self) -> int:
        return 0 if self._impl is None else len(self._impl)

    def _check_rows(self, x: np.ndarray) -> None:
        super()._check_rows(x)
        check_magnitude(x, "vectors")

    def _add(self, x: np.ndarray) -> None:
        self._impl.add(x)

    def reserve(self, n: int) -> None:
        """Make room for the rows of ``n`` vectors in all, so that adding up to ``n`` in many calls never moves
        them (without it each growth copies them once, holding two copies while it lasts). The numpy backend
        grows its arrays as it goes: nothing to do there."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InputError(f"ivfpq: reserve needs a count >= 0, got {n!r}")
        if self.compiled:
            self._impl.reserve(int(n))

    def _search(self, q: np.ndarray, k: int, nprobe: int | None = None, rerank: int | str | None = None,
                threads: int = 0, spread: float | None = None, exact: int | str | None = None):
        if nprobe is None or (nprobe == 0 and not isinstance(nprobe, bool)):  # 0: the old spelling of "default"
            nprobe = self.nprobe
        if isinstance(nprobe, bool) or not isinstance(nprobe, (int, np.integer)) or nprobe < 1:
            raise InputError(f"ivfpq: nprobe must be >= 1, got {nprobe!r}")
        if rerank is None or (rerank == _LEGACY_INDEX_SETTING and not isinstance(rerank, bool)):
            rerank = self.rerank
        rerank = rerank_setting(rerank, "ivfpq search")
        if rerank == RERANK_AUTO:
            rerank = 4 * k if self.store != "none" or self.sq else 0
        if rerank > 0 and self.store == "none" and not self.sq:
            raise InputError("ivfpq: rerank needs the full vectors; this index was built without store=fp16|fp32 "
                             "(or sq=4)")
        spread = self.spread if spread is None else spread_setting(spread, "ivfpq search")
        exact = self.exact if exact is None else exact_setting(exact, "ivfpq search")
        rerank = min(rerank, self._ntotal())  # candidates beyond the index size do not exist
        if not self.sq:
            return self._impl.search(q, k, int(nprobe), rerank, threads, spread)
        if exact == RERANK_AUTO:
            exact = EXACT_PER_K * k
        return self._impl.search(q, k, int(nprobe), rerank, threads, spread, exact)

    def stored_vectors(self) -> np.ndarray | None:
        """A copy of the fp16/fp32 rows kept for the re-rank (None with store=none); of a mapped index too, so
        read a large one's rows from its file instead."""
        if self._impl is None or self.store == "none":
            return None
        vec = self._impl.vectors()
        if vec is None:
            return None
        return vec.view(np.float16) if vec.dtype == np.uint16 else vec

    def codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(list of every row, its m codes), rows in the order added — for inspection and tests."""
        lists = np.empty(self._ntotal(), dtype=np.int64)
        codes = np.empty((self._ntotal(), self.m), dtype=np.uint8)
        for ln in range(self.nlist):
            pos = self._impl.list_positions(ln)
            lists[pos] = ln
            codes[pos] = self._impl.list_codes(ln)
        return lists, codes

    def bytes_per_vector(self) -> float:
        """Memory per stored vector, index structures included (codes, list positions, optional full vector)."""
        n = self._ntotal()
        return self._impl.memory_bytes() / n if n else float("nan")

    # -- files --------------------------------------------------------------------------------------------------
    def _uses_compiled_writer(self) -> bool:
        return self.compiled

    def _write(self, writer: Any) -> None:
        if self._impl is None:
            raise InputError("ivfpq: nothing to save; train the index first")
        writer.meta("nprobe", self.nprobe)
        writer.meta("rerank", self.rerank)
        writer.meta("spread", repr(self.spread))
        writer.meta("exact", self.exact)
        if self.compiled and hasattr(writer, "raw"):
            self._impl.save(writer.raw)
        elif self.compiled:  # a pure-Python writer: go through a numpy copy of the state
            NumpyIVFPQ.from_compiled(self._impl).write_sections(writer)
        else:
            self._impl.write_sections(writer)

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "IVFPQIndex":
        C = native()
        if C is not None and hasattr(reader, "raw"):
            impl = C.IVFPQ.load(reader.raw, mmap)
        else:
            impl = NumpyIVFPQ.read_sections(reader, mmap)
        store = impl.store
        nprobe = reader.meta_int("nprobe", 1, 1 << 30) if reader.has_meta("nprobe") else 16
        rerank: int | str = RERANK_AUTO
        if reader.has_meta("rerank") and reader.meta("rerank") != RERANK_AUTO:
            rerank = reader.meta_int("rerank", _LEGACY_RERANK_AUTO, 1 << 30)
        rerank = rerank_setting(rerank)
        spread = reader.meta_float("spread") if reader.has_meta("spread") else 0.0
        exact: int | str = RERANK_AUTO
        if reader.has_meta("exact") and reader.meta("exact") != RERANK_AUTO:
            exact = reader.meta_int("exact", 0, 1 << 30)
        if not (math.isfinite(spread) and 0 <= spread <= MAX_SPREAD):
            reader.fail(f"spread must be a number in [0, {MAX_SPREAD:g}]")
        if store == "none" and rerank != RERANK_AUTO and rerank > 0:
            rerank = 0
        compiled = not isinstance(impl, NumpyIVFPQ)
        # without the compiled core the constructor refuses to build 4-bit codes or rows; a read index is not
        # built, so the numpy one is made with 8-bit settings and then takes the file's
        index = cls(impl.dim, nlist=impl.nlist if compiled else 0, m=impl.m, nbits=impl.nbits if compiled else 8,
                    store=store, nprobe=nprobe, rerank=rerank, assign="ip" if impl.assign_by_ip else "l2",
                    spread=spread, exact=exact, sq=impl.sq if compiled else 0,
                    backend="compiled" if compiled else "numpy")
        index.nlist, index.nbits, index.sq = impl.nlist, impl.nbits, impl.sq
        index._impl = impl
        return index


# ---------------------------------------------------------------------------------------------------------------
# numpy backend: the same algorithm as csrc/ivfpq.cpp and csrc/kmeans.cpp, used when the extension is absent


def _top(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best (score descending, id ascending on ties) — the order csrc/topk.h produces."""
    return np.lexsort((ids, -scores))[:k]


class NumpyIVFPQ:
    """Pure-numpy IVF-PQ with the compiled class's interface (used when ``fastdpr._C`` is absent). Indexes with
    4-bit codes or 4-bit rows are read, searched and written here (fastdpr/index/numpy_pq4.py) but built by the
    compiled core only."""

    def __init__(self, dim: int, nlist: int, m: int, nbits: int = 8, store: str = "none", assign_by_ip: bool = False):
        if dim < 1 or nlist < 1 or m < 1 or dim % m:
            raise InputError(f"ivfpq: bad shape dim={dim}, nlist={nlist}, m={m} (m must divide dim)")
        if nbits not in NBITS:
            raise InputError(f"ivfpq: nbits={nbits} is not supported; codes are 8-bit or 4-bit")
        self.dim, self.nlist, self.m, self.dsub = dim, nlist, m, dim // m
        self.nbits, self.ksub, self.store, self.assign_by_ip = nbits, 2 ** nbits, store, assign_by_ip
        self.aniso_eta = 1.0  # 4-bit: how the stored codes were chosen (kept for the file)
        self.sq = 0  # 4: 4-bit rows, set by a reader or from_compiled
        self._sq_ranges: tuple[np.ndarray, np.ndarray] | None = None  # (lo, step) of the 4-bit rows
        self._sq_rows = np.empty((0, numpy_pq4.row_bytes(dim)), np.uint8)
        self.vectors_mapped = False
        self._centroids: np.ndarray | None = None
        self._codebooks: np.ndarray | None = None
        self._codes = [np.empty((0, m), np.uint8) for _ in range(nlist)]  # unpacked, whatever nbits
        self._pos = [np.empty(0, np.int64) for _ in range(nlist)]
        self._sq = np.zeros(nlist, np.float64)  # per list: sum of ||x - c||^2 over its members
        self._vectors = np.empty((0, dim), {"none": np.float32, "fp16": np.float16, "fp32": np.float32}[store])
        self._n = 0

    @classmethod
    def from_compiled(cls, impl) -> "NumpyIVFPQ":
        """A numpy copy of a compiled index's state (for writing through a pure-Python file writer)."""
        out = cls(impl.dim, impl.nlist, impl.m, impl.nbits, impl.store, impl.assign_by_ip)
        if impl.is_trained:
            out.set_trained(impl.centroids(), impl.codebooks())
        if impl.nbits == 4:
            out.aniso_eta = float(impl.aniso_eta)
        out.sq = int(impl.sq)
        if out.sq and impl.sq_ranges() is not None:
            out._sq_ranges = impl.sq_ranges()
            out._sq_rows = impl.sq_rows()
        out._codes = [impl.list_codes(ln) for ln in range(impl.nlist)]
        out._pos = [impl.list_positions(ln) for ln in range(impl.nlist)]
        out._sq = np.array([impl.list_residual_sq(ln) for ln in range(impl.nlist)], np.float64)
        out._n = len(impl)
        vec = impl.vectors()
        if vec is not None:
            out._vectors = vec.view(np.float16) if vec.dtype == np.uint16 else vec
        return out

    @property
    def is_trained(self) -> bool:
        return self._centroids is not None

    def __len__(self) -> int:
        return self._n

    def memory_bytes(self) -> int:
        vb = {"none": 0, "fp16": 2, "fp32": 4}[self.store] * self.dim
        trained = 0 if self._centroids is None else 4 * (self._centroids.size + self._codebooks.size)
        return self._n * (self.m + 8 + vb) + trained + self._sq.nbytes + self._sq_rows.nbytes

    def train(self, x: np.ndarray, niter: int = 20, pq_niter: int = 20, seed: int = 1234,
              max_points_per_centroid: int = 64, pq_max_points_per_centroid: int = 256,
              spherical: bool = False, balance: float = 0.0, groups: int = 0) -> None:
        numpy_pq4.refuse_build(self.nbits, self.sq, "training")
        check_groups(groups, self.nlist)
        n = x.shape[0]
        if n < self.nlist or n < KSUB:
            raise InputError(f"ivfpq: training needs at least max(nlist={self.nlist}, 256) vectors, got {n}")
        if groups:
            self._centroids = two_level_kmeans(x, self.nlist, groups, niter, seed, spherical, max_points_per_centroid,
                                               balance)
        else:
            self._centroids = kmeans(x, self.nlist, niter, seed, spherical, max_points_per_centroid, balance=balance)
        rng = np.random.default_rng(seed + 1)
        sample = x[np.sort(rng.choice(n, min(n, KSUB * pq_max_points_per_centroid), replace=False))]
        resid = sample - self._centroids[nearest(sample, self._centroids, self.assign_by_ip)]
        self._codebooks = np.stack([
            kmeans(np.ascontiguousarray(resid[:, j * self.dsub:(j + 1) * self.dsub]), KSUB, pq_niter, seed + 1 + j,
                   False, pq_max_points_per_centroid)
            for j in range(self.m)])

    def set_trained(self, centroids: np.ndarray, codebooks: np.ndarray) -> None:
        if self._n:
            raise InputError("ivfpq: cannot replace the trained state of an index holding vectors")
        self._centroids = np.ascontiguousarray(centroids, dtype=np.float32).reshape(self.nlist, self.dim)
        self._codebooks = np.ascontiguousarray(codebooks, dtype=np.float32).reshape(self.m, self.ksub, self.dsub)

    def centroids(self) -> np.ndarray:
        return self._centroids.copy()

    def codebooks(self) -> np.ndarray:
        return self._codebooks.copy()

    def list_codes(self, ln: int) -> np.ndarray:
        return self._codes[ln]

    def list_positions(self, ln: int) -> np.ndarray:
        return self._pos[ln]

    def vectors(self):
        return None if self.store == "none" else self._vectors

    def list_residual_sq(self, ln: int) -> float:
        return float(self._sq[ln])

    def sq_rows(self) -> np.ndarray | None:
        """(n, ceil(dim / 2)) 4-bit rows, or None (the compiled class's accessor)."""
        return self._sq_rows if self.sq and self._sq_ranges is not None else None

    def sq_ranges(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self._sq_ranges

    def list_spread(self, ln: int) -> float:
        """s_l of the spread-aware probe order (csrc/ivfpq.h list_spread)."""
        n = len(self._pos[ln])
        return 0.0 if n < 2 else float(np.float32(math.sqrt(self._sq[ln] / n / self.dim * 2.0 * math.log(n))))

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.is_trained:
            raise InputError("ivfpq: the index is not trained; call train() before encode()")
        if self.nbits == 4 and self.aniso_eta != 1.0:  # codes chosen for the anisotropic loss: csrc/ivfpq.cpp
            numpy_pq4.refuse_build(self.nbits, self.sq, "encoding vectors for")
        lists = nearest(x, self._centroids, self.assign_by_ip)
        resid = x - self._centroids[lists]
        codes = np.empty((x.shape[0], self.m), np.uint8)
        for j in range(self.m):
            sub = np.ascontiguousarray(resid[:, j * self.dsub:(j + 1) * self.dsub])
            codes[:, j] = nearest(sub, self._codebooks[j], False)
        return lists, codes

    def add(self, x: np.ndarray) -> None:
        if not self.is_trained:
            raise InputError("ivfpq: the index is not trained; call train() before add()")
        numpy_pq4.refuse_build(self.nbits, self.sq, "adding vectors to")
        lists, codes = self.encode(x)
        resid = x.astype(np.float64) - self._centroids[lists]
        np.add.at(self._sq, lists, np.einsum("ij,ij->i", resid, resid))
        pos = np.arange(self._n, self._n + x.shape[0], dtype=np.int64)
        order = np.argsort(lists, kind="stable")
        bounds = np.searchsorted(lists[order], np.arange(self.nlist + 1))
        for ln in np.flatnonzero(np.diff(bounds)):
            rows = order[bounds[ln]:bounds[ln + 1]]
            self._codes[ln] = np.concatenate([self._codes[ln], codes[rows]])
            self._pos[ln] = np.concatenate([self._pos[ln], pos[rows]])
        if self.store != "none":
            self._vectors = np.concatenate([self._vectors, x.astype(self._vectors.dtype)])
        self._n += x.shape[0]

    def search(self, q: np.ndarray, k: int, nprobe: int = 16, rerank: int = 0, threads: int = 0,
               spread: float = 0.0, exact: int = 0):
        """csrc/ivfpq.h search: the same candidates, re-ranks and order (ties by position)."""
        if not self.is_trained:
            raise InputError("ivfpq: the index is not trained; call train() before search()")
        if rerank > 0 and self.store == "none" and not self.sq:
            raise InputError("ivfpq: rerank needs the full vectors (store=fp16 or fp32) or 4-bit rows (sq=4)")
        # queries of extreme magnitude searched scaled, their scores scaled back (as csrc/ivfpq.cpp does)
        exps = np.array([magnitude_exponent(qv) for qv in q], np.int64)
        if exps.any():
            scores, out = self.search(np.ldexp(q, -exps[:, None]).astype(np.float32), k, nprobe, rerank, threads,
                                      spread, exact)
            with np.errstate(over="ignore"):  # a score beyond float32 is Inf, as in the compiled search
                return np.ldexp(scores, exps[:, None]).astype(np.float32), out
        nprobe = min(nprobe, self.nlist)
        # candidates beyond the index size cannot exist: k and rerank beyond it only pad the output
        kf = min(k, self._n)
        kc = min(max(k, rerank), self._n) if rerank > 0 else kf
        scores = np.full((q.shape[0], k), -np.inf, dtype=np.float32)
        out = np.full((q.shape[0], k), -1, dtype=np.int64)
        coarse = q @ self._centroids.T
        list_ids = np.arange(self.nlist)
        if spread > 0:  # the compiled order in float32: <q, c> + |q| (spread s_l)
            spreads = np.float32(spread) * np.array([self.list_spread(ln) for ln in range(self.nlist)], np.float32)
        for i, qv in enumerate(q):
            order = coarse[i]
            if spread > 0:
                order = coarse[i] + np.sqrt(np.float32(qv @ qv)) * spreads
            probe = _top(order, list_ids, nprobe)
            probe = probe[[len(self._pos[ln]) > 0 for ln in probe]]
            if not len(probe):
                continue
            codes = np.concatenate([self._codes[ln] for ln in probe])
            pos = np.concatenate([self._pos[ln] for ln in probe])
            list_score = np.repeat(coarse[i, probe], [len(self._pos[ln]) for ln in probe]).astype(np.float32)
            if self.nbits == 4:
                table, bias, delta = numpy_pq4.quantize_tables(numpy_pq4.query_tables(qv[None], self._codebooks))
                s = numpy_pq4.code_scores(list_score, bias[0], delta[0], numpy_pq4.scan(codes, table[0]))
                live = ~np.isnan(s)  # a non-finite table scores nothing
                s, pos = s[live], pos[live]
            else:
                # the same float32 accumulation order as the compiled scan: list score first, then j = 0..m-1
                lut = np.einsum("jcd,jd->jc", self._codebooks, qv.reshape(self.m, self.dsub))
                s = list_score
                for j in range(self.m):
                    s += lut[j, codes[:, j]]
            best = _top(s, pos, kc)
            s, pos = s[best], pos[best]
            if rerank > 0:
                s, pos = self._rerank(qv, pos, kf, kc, exact)
            s, pos = s[:kf], pos[:kf]
            scores[i, :len(s)] = s
            out[i, :len(pos)] = pos
        return scores, out

    def _rerank(self, qv: np.ndarray, pos: np.ndarray, kf: int, kc: int, exact: int):
        """The re-ranks of one query's candidates: by 4-bit rows where they cut the candidates to the best
        max(kf, exact) (all of them without stored vectors: their scores are then the answer), then by the full
        vectors."""
        if self.sq and (self.store == "none" or exact > 0):
            keep = kf if self.store == "none" else min(max(kf, exact), kc)
            if self.store == "none" or len(pos) > keep:
                lo, step = self._sq_ranges
                s = numpy_pq4.row_scores(qv, self._sq_rows[pos], lo, step)
                best = _top(s, pos, keep)
                s, pos = s[best], pos[best]
                if self.store == "none":
                    return s, pos
        s = self._vectors[pos].astype(np.float32) @ qv
        best = _top(s, pos, kf)
        return s[best], pos[best]

    # -- the file sections csrc/ivfpq.cpp writes and reads -------------------------------------------------------
    def write_sections(self, writer) -> None:
        # the compiled writer's order of metadata and sections (csrc/ivfpq.cpp save), so the files are the same
        meta: list[tuple[str, Any]] = [("dim", self.dim), ("nlist", self.nlist), ("m", self.m),
                                       ("nbits", self.nbits)]
        if self.nbits == 4:
            meta.append(("aniso_eta", "%.17g" % self.aniso_eta))  # the compiled writer's text for a float
        meta.append(("storage", STORE_CODES[self.store]))
        if self.sq:
            meta.append(("sq_bits", self.sq))
        meta += [("assign_by_ip", int(self.assign_by_ip)), ("trained", int(self.is_trained)), ("ntotal", self._n)]
        for key, value in meta:
            writer.meta(key, value)
        if self.is_trained:
            writer.add("centroids", self._centroids)
            writer.add("codebooks", self._codebooks)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in self._pos])]).astype(np.int64)
        writer.add("list_offsets", offsets)
        writer.add("codes", numpy_pq4.pack_lists(self._codes, self.m) if self.nbits == 4 else
                   np.concatenate(self._codes).astype(np.uint8))
        writer.add("list_pos", np.concatenate(self._pos).astype(np.int64))
        writer.add("list_resid_sq", self._sq)
        if self.store != "none":
            writer.add("vectors", np.ascontiguousarray(self._vectors))
        if self.sq and self._sq_ranges is not None:
            numpy_pq4.write_rows(writer, self._sq_ranges, self._sq_rows)

    @classmethod
    def read_sections(cls, reader, mmap: bool = False) -> "NumpyIVFPQ":
        # The second reader of the format (the first: IVFPQ::load and IVFLists::load in csrc/). It stays because this
        # backend is for installs without the compiled core, which therefore cannot read for it; the two are held to
        # one format by tests that read the same files, good and broken, with both (tests/test_index_ivfpq_units.py,
        # tests/test_index_ivfpq.py) and by files written by older code (tests/test_ivfpq_file_compat.py).
        if reader.type != "ivfpq":
            reader.fail(f"it holds a {reader.type!r} index, not an ivfpq one")
        d = reader.meta_int("dim", 1, 1 << 20)
        nlist = reader.meta_int("nlist", 1, 1 << 28)
        m = reader.meta_int("m", 1, d)
        if d % m:
            reader.fail("m does not divide dim")
        nbits, eta = numpy_pq4.read_code_settings(reader, m, MAX_M4)
        store = {v: k for k, v in STORE_CODES.items()}[reader.meta_int("storage", 0, 2)]
        by_ip = reader.meta_int("assign_by_ip", 0, 1) == 1
        trained = reader.meta_int("trained", 0, 1) == 1
        n = reader.meta_int("ntotal", 0, 1 << 40)
        if not trained and n:
            reader.fail("untrained index with vectors")
        # every section's size is checked against the metadata before anything is allocated from it
        if trained:
            centroids = reader.array("centroids", np.float32, nlist * d)
            codebooks = reader.array("codebooks", np.float32, m * 2 ** nbits * (d // m))
            check_finite_section(reader, "centroids", centroids)
            check_finite_section(reader, "codebooks", codebooks)
        off = reader.array("list_offsets", np.int64, nlist + 1)
        if off[0] != 0 or off[-1] != n or (np.diff(off) < 0).any():
            reader.fail("list offsets do not cover the vectors")
        if nbits == 4:
            codes4 = numpy_pq4.read_codes(reader, np.diff(off), m)
        else:
            codes = reader.array("codes", np.uint8, n * m).reshape(n, m)
        pos = reader.array("list_pos", np.int64, n)
        if n and (pos.min() < 0 or pos.max() >= n):
            reader.fail("list position out of range")
        if n and np.bincount(pos, minlength=n).max() != 1:
            reader.fail("list positions repeat a vector")
        sq_bits, sq_ranges, sq_rows = numpy_pq4.read_rows(reader, d, n)
        out = cls(d, nlist, m, nbits, store, by_ip)
        if trained:
            out.set_trained(centroids, codebooks)
        out.aniso_eta, out.sq, out._sq_ranges = eta, sq_bits, sq_ranges
        if sq_ranges is not None:
            out._sq_rows = sq_rows if mmap else np.array(sq_rows)
            out.vectors_mapped = bool(mmap) and sq_rows.size > 0
        if nbits == 4:
            out._codes = codes4
        else:
            out._codes = [np.array(codes[off[ln]:off[ln + 1]]) for ln in range(nlist)]
        out._pos = [np.array(pos[off[ln]:off[ln + 1]]) for ln in range(nlist)]
        out._n = n
        if reader.has("list_resid_sq"):  # absent from files written before the spreads were kept
            sq = reader.array("list_resid_sq", np.float64, nlist)
            if not (np.isfinite(sq).all() and (sq >= 0).all()):
                reader.fail("list residual sums must be finite and >= 0")
            out._sq = np.array(sq)
            sizes = np.diff(off).astype(np.float64)
            big = sizes >= 2  # (lists of fewer members have no spread)
            spreads = np.sqrt(sq[big] / sizes[big] / d * 2.0 * np.log(sizes[big]))
            if (spreads > np.finfo(np.float32).max).any():
                reader.fail("list residual sums too large for their spreads")
        if store != "none":
            dtype = np.float16 if store == "fp16" else np.float32
            vec = reader.array("vectors", dtype, n * d).reshape(n, d)
            check_finite_section(reader, "vectors", vec)
            out._vectors = vec if mmap else np.array(vec)
            out.vectors_mapped = bool(mmap)
        return out
