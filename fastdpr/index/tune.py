"""``index.tune(queries, target_recall=0.95, k=100)``: the cheapest search settings that reach a recall target.

Recall@k is measured against exact search on a sample of queries (training questions, or vectors held out of the
index): the exact top-k comes from the index's own stored vectors (``store=fp16|fp32``), from ``vectors`` (the
index's rows in the order added) or is given as ``truth`` (the ids ``search`` would return).

For IVF-PQ the search walks the settings a few at a time instead of sweeping a grid. For each re-rank depth R of a
geometric ladder (2k, 4k, 8k, ...; none without rows to re-rank), nprobe doubles until the recall reaches the
target and bisection then finds the smallest nprobe that does; a deeper re-rank is tried only while it lowers that
nprobe. Each depth's cheapest setting is timed (alternating rounds, the best of each), the fastest wins, and with
4-bit rows (``sq=4``) bisection finally lowers ``exact`` (the candidates read in full) as far as the target
allows. Recall grows with nprobe, R and exact, which is what makes doubling and bisection sound.

A setting reaches the target when the sample's recall clears it by ``MARGIN_SE`` standard errors of its mean (the
spread of the per-query recalls over the square root of the sample size). A sample's recall is as likely to lie
above the true one as below it, and the cheapest setting that merely touches the target is picked where it lies
above, so it can fall short on other queries (on vectors calibrated to MiniLM, 100k x 768: 0.9508 on the sample,
0.9478 on held-out queries, ``benchmarks/results/ann_auto_more.md`` at commit b3f1768). A smaller sample gets a
wider margin.

The margin alone does not undo that choice: bisection over nprobe and then over ``exact`` tests dozens of settings
near the target and keeps the cheapest one whose sample recall happens to clear it (1M x 768 calibrated: 0.9530 on
the sample, 0.9483 held out, ``ann_auto_1m768.md`` at commit 106ed59). So a sample of at least
``2 * CONFIRM_MIN`` queries is split in two, alternate rows: the settings are chosen on one half, and the other half,
which took no part in the choice, must confirm the winner with the same margin; where it does not, nprobe grows
by an eighth at a time (then the re-rank depth doubles, then every candidate is read in full) until it does. The
reported recall is the confirming half's.

The result becomes the index's own search settings (``search`` uses them whenever the caller gives none; explicit
parameters still win) and is kept, with what it was tuned for, in the index file by the next ``save``
(``save=path`` writes it now; the file is replaced atomically).

>>> result = index.tune(train_question_vectors, target_recall=0.95, k=100)   # doctest: +SKIP
>>> result.params, result.recall                                              # doctest: +SKIP
({'nprobe': 37, 'rerank': 400}, 0.953)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index.checks import check_matrix, check_shape, check_threads
from fastdpr.index.exact import numpy_exact_search

MAX_QUERIES = 1000  # sample size used by default: enough for a recall estimate within about +-0.01
MARGIN_SE = 2.0  # standard errors of the sample's mean recall by which a setting must clear the target
CONFIRM_MIN = 100  # queries in each half when the sample is split into a choosing and a confirming half
TIMING_ROUNDS = 2  # rounds of timing over the cheapest settings, best of each


@dataclass
class TuneResult:
    """The settings ``tune`` chose and what they measured on the sample (``qps`` at ``threads``)."""

    params: dict[str, Any]
    recall: float
    qps: float
    target_recall: float
    k: int
    queries: int
    evaluations: int  # settings measured on the sample
    candidates: list[dict] = field(default_factory=list)  # each re-rank depth's cheapest setting, timed
    chosen: dict[str, Any] | None = None  # the choosing half's pick, before confirmation (None: no split)
    confirmed_on: int = 0  # queries of the confirming half (0: no split; recall is then the whole sample's)

    def record(self) -> dict[str, Any]:
        """What the index file keeps (metadata ``tuned``)."""
        return {"target_recall": self.target_recall, "k": self.k, "recall": round(self.recall, 4),
                "queries": self.queries, "params": self.params}


def check_target(target_recall: Any, k: Any) -> tuple[float, int]:
    if isinstance(target_recall, bool) or not isinstance(target_recall, (int, float, np.integer, np.floating)) or \
            not math.isfinite(target_recall) or not 0 < target_recall <= 1:
        raise InputError(f"tune: target_recall must be a number in (0, 1], got {target_recall!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"tune: k must be a positive integer, got {k!r}")
    return float(target_recall), int(k)


def recall_per_query(found: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|found ∩ truth| / |truth| of each query (ids; -1 pads both and counts for nothing)."""
    both = np.sort(np.concatenate([found, truth], axis=1), axis=1)
    hits = ((both[:, 1:] == both[:, :-1]) & (both[:, 1:] >= 0)).sum(axis=1)
    size = np.maximum((truth >= 0).sum(axis=1), 1)
    return hits / size


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / |truth| (ids; -1 pads both and counts for nothing)."""
    return float(np.mean(recall_per_query(found, truth)))


def lower_bound(per_query: np.ndarray) -> float:
    """The mean recall less ``MARGIN_SE`` standard errors of it (no margin from a single query)."""
    n = len(per_query)
    margin = MARGIN_SE * float(np.std(per_query, ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return float(np.mean(per_query)) - margin


def sample_rows(nq: int, max_queries: int) -> np.ndarray:
    """At most ``max_queries`` of ``nq`` query rows, evenly spread (deterministic)."""
    if nq <= max_queries:
        return np.arange(nq)
    return np.unique(np.linspace(0, nq - 1, max_queries).round().astype(np.int64))


def exact_truth(index, queries: np.ndarray, k: int, vectors: Any = None) -> np.ndarray:
    """Exact top-k ids of ``queries`` over ``vectors`` (the index's rows) or the index's stored vectors."""

    if vectors is not None:
        base = check_shape(vectors, index.dim, "tune: vectors")
        if base.shape[0] != len(index):
            raise InputError(f"tune: vectors must be the index's {len(index)} rows in the order added, "
                             f"got {base.shape[0]}")
    else:
        base = index.stored_vectors()
        if base is None:
            raise InputError(f"tune: this {type(index).__name__} keeps no vectors to compute exact results from; "
                             "pass vectors= (its rows in the order added) or truth= (exact top-k ids)")
    _, rows = numpy_exact_search(base, queries, min(k, base.shape[0]))
    labels = index._labels
    return rows if labels is None else np.where(rows >= 0, labels[np.maximum(rows, 0)], -1)


def tune(index, queries: Any, target_recall: float = 0.95, k: int = 100, vectors: Any = None, truth: Any = None,
         max_queries: int = MAX_QUERIES, threads: int = 0, save: Any = None) -> TuneResult:
    """See the module docstring; ``index.tune(...)`` calls this."""

    target_recall, k = check_target(target_recall, k)
    if isinstance(max_queries, bool) or not isinstance(max_queries, (int, np.integer)) or max_queries < 1:
        raise InputError(f"tune: max_queries must be a positive integer, got {max_queries!r}")
    threads = check_threads(threads)
    q = check_matrix(queries, index.dim, "tune: queries")
    nq = q.shape[0]
    if nq == 0:
        raise InputError("tune: the sample of queries is empty")
    if len(index) == 0:
        raise InputError(f"tune: the {type(index).__name__} is empty; add vectors first")
    if vectors is not None and truth is not None:
        raise InputError("tune: give vectors or truth, not both")
    kk = min(k, len(index))
    if truth is not None:
        truth = np.asarray(truth)
        if truth.ndim != 2 or truth.shape[0] != nq or truth.shape[1] < kk or truth.dtype.kind not in "iu":
            raise InputError(f"tune: truth must be integer ids of shape ({nq}, >= {kk}), "
                             f"got {truth.dtype} {truth.shape}")
    rows = sample_rows(nq, int(max_queries))
    q = np.ascontiguousarray(q[rows])
    if truth is not None:
        truth = truth[rows, :kk].astype(np.int64)

    tuner = TUNERS.get(index.kind)
    if tuner is None:
        raise InputError(f"tune: {index.kind} indexes are not tuned; tune works on ivfpq (and flat, which is exact)")
    if tuner is _tune_flat:
        result = tuner(index, q, kk, target_recall, truth, threads)
    else:
        if truth is None:
            truth = exact_truth(index, q, kk, vectors)
        result = tuner(index, q, kk, target_recall, truth, threads)
    result.k = k
    index.tuned = result.record()
    if save is not None:
        index.save(save)
    return result


def _tune_flat(index, q, k, target_recall, truth, threads) -> TuneResult:
    """Exact search: nothing to choose (recall 1 by definition)."""
    return TuneResult({}, 1.0, float("nan"), target_recall, k, q.shape[0], 0)


class _Evaluator:
    """Recall (cached) and timing of settings on the sample."""

    def __init__(self, index, q, k, truth, threads):
        self.index, self.q, self.k, self.truth, self.threads = index, q, k, truth, threads
        self.recalls: dict[tuple, float] = {}
        self.bounds: dict[tuple, float] = {}

    def recall(self, **params) -> float:
        key = tuple(sorted(params.items()))
        if key not in self.recalls:
            _, ids = self.index.search(self.q, self.k, threads=self.threads, **params)
            per_query = recall_per_query(ids, self.truth)
            self.recalls[key], self.bounds[key] = float(np.mean(per_query)), lower_bound(per_query)
        return self.recalls[key]

    def reaches(self, target: float, **params) -> bool:
        """Whether the setting's recall clears ``target`` with the sample's margin (module docstring)."""
        self.recall(**params)
        return self.bounds[tuple(sorted(params.items()))] >= target

    def seconds(self, params: dict) -> float:
        start = time.perf_counter()
        self.index.search(self.q, self.k, threads=self.threads, **params)
        return time.perf_counter() - start


def smallest(reaches, lo: int, hi: int) -> int | None:
    """The smallest integer v in [lo, hi] with ``reaches(v)``, for a ``reaches`` that stays true once true: doubling
    from ``lo`` to the first v that reaches, then bisection below it. None when even ``hi`` does not reach."""
    prev, v = lo - 1, lo
    while True:
        if reaches(v):
            break
        if v >= hi:
            return None
        prev, v = v, min(hi, 2 * v)
    lo_fail, hi_ok = prev, v  # reaches(hi_ok); not reaches(lo_fail), or lo_fail below the range
    while hi_ok - lo_fail > 1:
        mid = (lo_fail + hi_ok) // 2
        if reaches(mid):
            hi_ok = mid
        else:
            lo_fail = mid
    return hi_ok


def _tune_ivfpq(index, q, k, target_recall, truth, threads) -> TuneResult:
    if q.shape[0] < 2 * CONFIRM_MIN:
        return _choose_ivfpq(index, q, k, target_recall, truth, threads)
    result = _choose_ivfpq(index, q[0::2], k, target_recall, truth[0::2], threads)
    check = _Evaluator(index, q[1::2], k, truth[1::2], threads)
    params = dict(result.params)
    result.chosen = dict(params)
    n = len(index)
    while not check.reaches(target_recall, **params):
        if params["nprobe"] < index.nlist:
            params["nprobe"] = min(index.nlist, params["nprobe"] + max(1, params["nprobe"] // 8))
        elif params["rerank"] and params["rerank"] < n:
            params["rerank"] = min(n, 2 * params["rerank"])
        elif params.get("exact"):
            params["exact"] = 0
        else:
            raise InputError(f"tune: recall@{k} {target_recall} is out of reach of this index: the chosen settings "
                             f"{result.chosen} and every larger setting tried (up to {params}) give "
                             f"{check.recall(**params):.4f} on the confirming half of the sample")
    if params != result.chosen:
        index.nprobe, index.rerank = int(params["nprobe"]), int(params["rerank"])
        if "exact" in params:
            index.exact = int(params["exact"])
        result.qps = check.q.shape[0] / min(check.seconds(params) for _ in range(TIMING_ROUNDS))
    result.params, result.recall = params, check.recall(**params)
    result.queries, result.confirmed_on = q.shape[0], check.q.shape[0]
    result.evaluations += len(check.recalls)
    return result


def _choose_ivfpq(index, q, k, target_recall, truth, threads) -> TuneResult:
    ev = _Evaluator(index, q, k, truth, threads)
    n, nlist = len(index), index.nlist
    has_rows = index.store != "none" or bool(index.sq)
    two_stage = bool(index.sq) and index.store != "none"  # 4-bit rows first, then the full vectors
    if has_rows:
        ladder, r = [], 2 * k
        while r < n:
            ladder.append(r)
            r *= 2
        ladder.append(n)
    else:
        ladder = [0]
    # with two stages: exact=3k while choosing nprobe and R; if no R reaches, every candidate read in full (0)
    exact_modes = [min(3 * k, n), 0] if two_stage else [None]
    candidates: list[dict] = []
    best_seen = 0.0
    for exact in exact_modes:
        extra = {} if exact is None else {"exact": exact}
        upper = nlist
        for rerank in ladder:
            def reaches(nprobe, rerank=rerank):
                return ev.reaches(target_recall, nprobe=nprobe, rerank=rerank, **extra)

            nprobe = smallest(reaches, 1, upper)
            best_seen = max([best_seen] + list(ev.bounds.values()))
            if nprobe is None:
                continue
            if candidates and candidates[-1]["nprobe"] == nprobe:
                break  # a deeper re-rank no longer saves lists
            candidates.append(dict(nprobe=nprobe, rerank=rerank, **extra))
            upper = nprobe
            if nprobe == 1:
                break
        if candidates:
            break
    if not candidates:
        hint = "" if has_rows else " (build with store=fp16 or sq=4 so that candidates can be re-ranked)"
        raise InputError(f"tune: recall@{k} {target_recall} is out of reach of this index: the best measured was "
                         f"{best_seen:.4f} (the sample's recall less {MARGIN_SE:g} standard errors){hint}")
    timings = [math.inf] * len(candidates)
    for _ in range(TIMING_ROUNDS):
        for i, params in enumerate(candidates):
            timings[i] = min(timings[i], ev.seconds(params))
    best = dict(candidates[int(np.argmin(timings))])
    if two_stage and best["exact"]:
        def reaches_exact(exact):
            return ev.reaches(target_recall, **{**best, "exact": exact})

        best["exact"] = smallest(reaches_exact, k, best["exact"]) or best["exact"]
    seconds = min(ev.seconds(best) for _ in range(TIMING_ROUNDS))
    for params, t in zip(candidates, timings):
        params["qps"] = round(q.shape[0] / t, 1)
        params["recall"] = round(ev.recall(**{key: params[key] for key in params if key not in ("qps", "recall")}), 4)
    index.nprobe, index.rerank = int(best["nprobe"]), int(best["rerank"])
    if "exact" in best:
        index.exact = int(best["exact"])
    return TuneResult(best, ev.recall(**best), q.shape[0] / seconds, target_recall, k, q.shape[0],
                      len(ev.recalls), candidates)


TUNERS = {"flat": _tune_flat, "ivfpq": _tune_ivfpq}
