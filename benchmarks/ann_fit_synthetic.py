"""Fit the calibrated synthetic profiles (``fastdpr.index.synthetic.PROFILES``) to the real MiniLM pool.

For each pooling (``mean``, ``cls``; the real pool of ``ann_data.py``: the quickstart's corpus x 384, 1,000 NQ-open dev
questions; the committed profiles were fitted to the pool of that time, 23,582 passages of the earlier data sets):

1. measured directly: the passages' shared vector (its length), each passage's distance from it (quantile table),
   the queries' shared vector (its part along the passages' one and orthogonal to it) and their distances from it;
2. the spectrum: ``(decay, offset)`` of ``((j - 1/2) / d + offset)^-decay`` closest to the real eigenvalues (log
   space, least squares) among those whose principal components for 90% of the variance match the real count;
3. the cluster structure and the queries' isotropic share, by a few rounds of coordinate search at the real size,
   minimising the squared log ratios to the real partition statistic (an ideal IVF over 512 balanced L2 lists:
   nprobe to cover 95% of a query's top-100, median and p90; lists holding the top-100, median and p90, half weight)
   as ``ann_calibrate.py`` measures it.

It prints each fitted profile as Python (to paste into ``PROFILES``) and the synthetic statistics next to the real
ones. One thread; a few minutes per pooling.

    python benchmarks/ann_fit_synthetic.py [--pooling mean,cls] [--rounds 2]
    python benchmarks/ann_fit_synthetic.py --growth 10000,30000,100000 --pooling mean   # to real_pool.py's curve
    python benchmarks/ann_fit_synthetic.py --growth 10000,30000 --grid --pooling mean   # from a coarse grid
    # minilm-mean-pool (the queries' LID in the loss, the leaf count's growth scanned on every size, then searched)
    # came from this with --start-profile minilm-mean-growth --name minilm-mean-pool:
    python benchmarks/ann_fit_synthetic.py --pooling mean --growth 10000,30000,100000 --grid
    python benchmarks/ann_fit_synthetic.py --time 1000000x768   # generation time and memory, 1 thread, written
                                                                # to benchmarks/results/ann_synthetic_generation.*
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ann_calibrate import anisotropy, norms, partition_spread  # noqa: E402
from datasets import Dataset, ground_truth  # noqa: E402

from fastdpr.index.synthetic import NORM_LEVELS, CalibratedGenerator, Profile  # noqa: E402

NLIST = 512
SCHEME = "l2-balanced"
# the structure searched in step 3: name -> (lower, upper bound, multiplicative step or None for additive)
SEARCHED = {"spectrum_decay": (0.1, 20.0, 1.1), "leaf_size": (2.0, 2000.0, 2.0), "leaves_per_topic": (1.0, 500.0, 2.0),
            "topic_share": (0.0, 0.95, None), "leaf_share": (0.0, 0.95, None), "off_manifold": (0.0, 0.95, None),
            "norm_by_leaf": (0.0, 0.98, None), "leaf_growth": (0.0, 1.0, None),
            "families": (1000.0, 1e8, 2.0), "family_share": (0.0, 0.95, None)}
ADDITIVE_STEP = 0.15
# searched at one size; leaf_growth only in a growth fit (at one size it changes nothing), the families only in a
# fit to a measured curve (--targets)
STRUCTURE = [k for k in SEARCHED if k not in ("spectrum_decay", "leaf_growth", "families", "family_share")]
# the leaf growth exponents a growth fit of several sizes tries on every size before its coordinate search
GROWTH_SCAN = (0.0, 0.25, 0.5, 0.75, 1.0)
# where the search starts (the result of an earlier, longer run of this search from leaf size 64, 16 leaves per
# topic, shares 0.3 / 0.3, off-manifold 0.4, norm by leaf 0.5); --from-profiles starts from PROFILES instead
START = {"mean": {"leaf_size": 50.8, "leaves_per_topic": 32.0, "topic_share": 0.3, "leaf_share": 0.3,
                  "off_manifold": 0.075, "norm_by_leaf": 0.525},
         "cls": {"leaf_size": 32.0, "leaves_per_topic": 45.3, "topic_share": 0.15, "leaf_share": 0.325,
                 "off_manifold": 0.575, "norm_by_leaf": 0.45}}


def stats(ds: Dataset, work: Path, nlist: int = NLIST, lid: bool = False) -> dict:
    """The statistics the fit compares (passage/query norms, anisotropy, the partition statistic over ``nlist``
    lists; with ``lid``, the queries' median LID and relative contrast as ``ann_growth.py`` measures them)."""
    with tempfile.TemporaryDirectory(dir=work) as d:
        ds = dataclasses.replace(ds, directory=Path(d))
        gt = ground_truth(ds, 100)
        part = partition_spread(ds, gt, nlist, SCHEME)
        if lid:
            from ann_growth import neighbourhood

            part |= neighbourhood(ds, gt)
    return {"passage_norms": norms(ds.base), "query_norms": norms(ds.queries), "anisotropy": anisotropy(ds.base),
            "partition": part}


def synthetic_set(profile: Profile, n: int, dim: int, n_queries: int, seed: int = 0) -> Dataset:
    gen = CalibratedGenerator(n, dim, profile, seed)
    return Dataset(name=f"synthetic-{profile.name}", base=gen.passages(), queries=gen.queries(n_queries),
                   directory=Path("."), description=profile.name)


def measured_profile(name: str, real: Dataset) -> dict:
    """Step 1: what is read straight off the real vectors."""
    x = np.asarray(real.base, dtype=np.float64)
    q = np.asarray(real.queries, dtype=np.float64)
    m, mq = x.mean(axis=0), q.mean(axis=0)
    along = float(mq @ m / np.linalg.norm(m))
    ortho = float(np.linalg.norm(mq - along * m / np.linalg.norm(m)))
    table = lambda v: tuple(round(float(t), 4) for t in np.quantile(v, NORM_LEVELS))  # noqa: E731
    return {"name": name, "mean_length": round(float(np.linalg.norm(m)), 4),
            "norm_table": table(np.linalg.norm(x - m, axis=1)),
            "query_mean": (round(along, 4), round(ortho, 4)),
            "query_norm_table": table(np.linalg.norm(q - mq, axis=1))}


def pcs_for_90(var: np.ndarray) -> int:
    share = np.cumsum(var) / var.sum()
    return int(np.searchsorted(share, 0.90) + 1)


def fit_spectrum(real: Dataset) -> tuple[float, float]:
    """Step 2, analytically: the profile's directions have covariance proportional to the spectrum."""
    x = np.asarray(real.base, dtype=np.float64)
    centred = x - x.mean(axis=0)
    eig = np.linalg.svd(centred[:20000], compute_uv=False) ** 2
    target = pcs_for_90(eig)
    dim = x.shape[1]
    j = (np.arange(dim) + 0.5) / dim
    best = None
    for offset in (0.0, 0.001, 0.003, 0.01, 0.03, 0.1):
        lo, hi = 0.0, 20.0
        for _ in range(60):  # bisection on decay: more decay, fewer components
            mid = (lo + hi) / 2
            if pcs_for_90((j + offset) ** -mid) > target:
                lo = mid
            else:
                hi = mid
        decay = hi
        var = (j + offset) ** -decay
        var = var / var.sum() * eig.sum()
        misfit = float(np.mean((np.log(var) - np.log(np.maximum(eig, 1e-12))) ** 2))
        if best is None or misfit < best[0]:
            best = (misfit, round(decay, 4), offset)
    return best[1], best[2]


def loss(got: dict, want: dict) -> float:
    g, w = got["partition"], want["partition"]
    terms = [(g["nprobe_for_95pct_median"], w["nprobe_for_95pct_median"], 1.0),
             (g["nprobe_for_95pct_p90"], w["nprobe_for_95pct_p90"], 1.0),
             (g["lists_holding_top100_median"], w["lists_holding_top100_median"], 0.5),
             (g["lists_holding_top100_p90"], w["lists_holding_top100_p90"], 0.5),
             # the spectrum trades against the clusters for the partition statistic: weighed up, or the search
             # buys a better nprobe with 15% too few components
             (got["anisotropy"]["pcs_for_90pct_variance"], want["anisotropy"]["pcs_for_90pct_variance"], 4.0),
             (got["anisotropy"]["mean_length/mean_norm"], want["anisotropy"]["mean_length/mean_norm"], 1.0)]
    if "lid_median" in g and "lid_median" in w:
        # the partition statistic alone is matched by nearly isotropic data whose neighbourhoods do not tighten
        # as n grows; the local dimensionality is what sets how they tighten
        terms.append((g["lid_median"], w["lid_median"], 1.0))
    return float(sum(wt * np.log(max(a, 0.5) / b) ** 2 for a, b, wt in terms))


def fmt(s: dict) -> str:
    pn, qn, an, pt = s["passage_norms"], s["query_norms"], s["anisotropy"], s["partition"]
    lid = f"  LID {pt['lid_median']:.0f}" if "lid_median" in pt else ""
    return (f"passage norms {pn['p5']:.2f}/{pn['median']:.2f}/{pn['p95']:.2f}  query norms "
            f"{qn['p5']:.2f}/{qn['median']:.2f}/{qn['p95']:.2f}  mean/norm {an['mean_length/mean_norm']:.3f}  "
            f"PCs90 {an['pcs_for_90pct_variance']}  nprobe95 {pt['nprobe_for_95pct_median']:.0f}/"
            f"{pt['nprobe_for_95pct_p90']:.0f}  lists {pt['lists_holding_top100_median']:.0f}/"
            f"{pt['lists_holding_top100_p90']:.0f}{lid}")


def fit(pooling: str, rounds: int, start: dict, work: Path) -> tuple[Profile, dict, dict]:
    from ann_data import real_pool

    real = real_pool(pooling, 1000)
    want = stats(real, work)
    print(f"real {pooling}: {fmt(want)}", flush=True)
    fields = measured_profile(f"minilm-{pooling}", real)
    params = dict(start)
    params["spectrum_decay"], fields["spectrum_offset"] = fit_spectrum(real)

    def evaluate(values: dict) -> tuple[float, dict]:
        profile = Profile(**fields, **values)
        got = stats(synthetic_set(profile, real.n, real.dim, len(real.queries)), work)
        return loss(got, want), got

    params, best_loss, best_stats = coordinate_search(evaluate, params, rounds, fmt)
    profile = Profile(**fields, **params)
    return profile, want, best_stats


def coordinate_search(evaluate, params: dict, rounds: int, show, start: tuple[float, object] | None = None,
                      keys: tuple | None = None) -> tuple[dict, float, object]:
    """Step 3: from ``params``, each round tries one step up and one down for every key of ``SEARCHED`` (or of
    ``keys``, in their order) that ``params`` has (steps shrinking round by round) and keeps the first that lowers ``evaluate``'s loss; returns
    (params, loss, the statistics ``evaluate`` gave for them). ``start``: the (loss, statistics) of ``params``
    where they are known already."""
    best_loss, best_stats = start if start is not None else evaluate(params)
    print(f"  start {params}: loss {best_loss:.3f}  {show(best_stats)}", flush=True)
    for r in range(rounds):
        shrink = 1.0 / (r + 1)
        for key, (lo, hi, mult) in (SEARCHED.items() if keys is None else [(k, SEARCHED[k]) for k in keys]):
            if key not in params:
                continue
            for direction in (+1, -1):
                trial = dict(params)
                if mult is None:
                    trial[key] = round(float(np.clip(params[key] + direction * ADDITIVE_STEP * shrink, lo, hi)), 4)
                else:
                    trial[key] = round(float(np.clip(params[key] * mult ** (direction * shrink), lo, hi)), 3)
                shares = trial["topic_share"] + trial["leaf_share"] + trial.get("family_share", 0.0)
                if trial[key] == params[key] or shares > 0.98:
                    continue
                value, got = evaluate(trial)
                print(f"  round {r} {key}={trial[key]}: loss {value:.3f}  {show(got)}", flush=True)
                if value < best_loss:
                    params, best_loss, best_stats = trial, value, got
                    break
    return params, best_loss, best_stats


# the coarse grid a growth fit may start from (--grid): the structure that sets how hard a set is to partition, from
# tight clusters and on-manifold queries to nearly none and mostly isotropic ones. A pool far from where START was
# fitted (ten times the lists to probe) is out of reach of a few rounds of one-step coordinate moves.
GRID = {"off_manifold": (0.1, 0.4, 0.7, 0.9), "topic_share": (0.02, 0.1, 0.3), "leaf_share": (0.02, 0.1, 0.3),
        "leaf_size": (8.0, 50.0)}


def grid_start(evaluate, params: dict, show, grid: dict | None = None) -> tuple[float, dict, object]:
    """(loss, params, statistics) of the point of ``grid`` (default :data:`GRID`; other keys as in ``params``)
    with the lowest ``evaluate`` loss."""
    import itertools

    grid = GRID if grid is None else grid
    best = None
    for values in itertools.product(*grid.values()):
        trial = dict(params, **dict(zip(grid, values)))
        value, got = evaluate(trial)
        print(f"  grid {dict(zip(grid, values))}: loss {value:.3f}  {show(got)}", flush=True)
        if best is None or value < best[0]:
            best = (value, trial, got)
    print(f"  grid start {best[1]}: loss {best[0]:.3f}", flush=True)
    return best


def growth_nlist(n: int, lists_per_sqrt: float) -> int:
    """The list count of ``ann_growth.py``'s index family at ``n`` passages."""
    return max(1, int(round(lists_per_sqrt * math.sqrt(n))))


def fit_growth(pooling: str, sizes: list[int], rounds: int, start: dict, work: Path, pool: Path,
               n_queries: int = 1000, query_source: str = "questions",
               lists_per_sqrt: float = 4.0, grid: bool = False, name: str | None = None) -> tuple[Profile, dict, dict]:
    """The fit of :func:`fit` against the real pool's growth curve (``real_pool.py``, nested prefixes of
    ``sizes``) instead of one size: norms, query offset and spectrum read off the largest prefix, the structure
    searched to minimise the mean over sizes of :func:`loss` (the queries' median LID included), each size
    partitioned into ``lists_per_sqrt * sqrt(n)`` lists as ``ann_growth.py`` measures it. The leaf size is the one
    at the smallest size (``reference_n``); how the leaf count grows from there (``leaf_growth``) is first scanned
    over :data:`GROWTH_SCAN` on every size, then searched with the rest. Returns (profile, real statistics by
    size, synthetic statistics by size). With ``grid``, the search starts from the best point of :data:`GRID` at
    the smallest size alone (a fifth to a tenth of the cost of an evaluation at every size)."""
    from ann_growth import real_set

    reals = [ds for ds in (real_set(pool, pooling, n, n_queries, query_source, beyond=max(sizes)) for n in sizes)
             if ds is not None]
    if not reals:
        raise SystemExit(f"{pool}: no size of {sizes} is encoded yet (python benchmarks/real_pool.py encode)")
    want = {ds.n: stats(ds, work, growth_nlist(ds.n, lists_per_sqrt), lid=True) for ds in reals}
    for n, w in want.items():
        print(f"real {pooling} at {n:,}: {fmt(w)}", flush=True)
    largest, smallest = reals[-1], reals[0]
    fields = measured_profile(name or f"minilm-{pooling}-growth", largest)
    fields["reference_n"] = smallest.n
    params = dict(start)
    params["spectrum_decay"], fields["spectrum_offset"] = fit_spectrum(largest)

    def evaluate(values: dict) -> tuple[float, dict]:
        profile = Profile(**fields, **values)
        got = {ds.n: stats(synthetic_set(profile, ds.n, ds.dim, len(ds.queries)), work,
                           growth_nlist(ds.n, lists_per_sqrt), lid=True) for ds in reals}
        return float(np.mean([loss(got[n], want[n]) for n in want])), got

    def show(got: dict) -> str:
        return " | ".join(f"{n:,}: {fmt(s)}" for n, s in got.items())

    if grid:
        nlist = growth_nlist(smallest.n, lists_per_sqrt)

        def evaluate_smallest(values: dict) -> tuple[float, dict]:
            got = stats(synthetic_set(Profile(**fields, **values), smallest.n, smallest.dim, len(smallest.queries)),
                        work, nlist, lid=True)
            return loss(got, want[smallest.n]), {smallest.n: got}

        params = grid_start(evaluate_smallest, params, show)[1]
    known = None
    if len(reals) > 1:  # the growth exponent changes nothing at the smallest size: scanned on all of them
        for growth in GROWTH_SCAN:
            trial = dict(params, leaf_growth=growth)
            value, got = evaluate(trial)
            print(f"  growth {growth}: loss {value:.3f}  {show(got)}", flush=True)
            if known is None or value < known[0]:
                known, params = (value, got), trial
    params, _, best = coordinate_search(evaluate, params, rounds, show, start=known)
    return Profile(**fields, **params), want, best


# --targets: the search starts from the best point of this grid over the families (other keys as the start
# profile's), then moves these keys
FAMILY_GRID = {"families": (100_000, 300_000, 1_000_000), "family_share": (0.6, 0.75, 0.85)}
CURVE_SEARCHED = ("families", "family_share", "leaf_share", "off_manifold")


def curve_targets(path: Path, sizes: list[int], set_name: str) -> dict[int, dict]:
    """The rows of ``set_name`` at ``sizes`` from an ``ann_growth.json`` (a committed measurement of the real
    pool), by n."""
    import json

    try:
        rows = json.loads(Path(path).read_text())["rows"]
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"--targets {path}: not an ann_growth.py result ({err})") from None
    got = {int(r["n"]): r for r in rows if r.get("set") == set_name and int(r["n"]) in sizes}
    missing = [n for n in sizes if n not in got]
    if missing:
        raise SystemExit(f"--targets {path}: no {set_name!r} row at n = {', '.join(map(str, missing))}")
    return dict(sorted(got.items()))


def curve_loss(got: dict, row: dict) -> float:
    """Squared log ratios to a growth row: lists an ideal IVF probes for 95 of the top-100 (median, p90) and the
    queries' median LID, weighted alike."""
    terms = [(got["nprobe_for_95pct_median"], row["lists for 95% (median)"]),
             (got["nprobe_for_95pct_p90"], row["lists for 95% (p90)"]), (got["lid_median"], row["lid_median"])]
    return float(sum(np.log(max(a, 0.5) / b) ** 2 for a, b in terms))


def fit_to_curve(targets: dict[int, dict], fit_sizes: list[int], start: Profile, rounds: int, work: Path,
                 name: str, finalists: int = 3, dim: int = 384, n_queries: int = 1000) -> tuple[Profile, list]:
    """The near-repeat families (and the leaf share and off-manifold share they trade with) fitted to a measured
    growth curve: norms, spectrum, shared vectors and leaves as in ``start``; a grid over :data:`FAMILY_GRID`, then
    a coordinate search over :data:`CURVE_SEARCHED`, each point scored by the mean :func:`curve_loss` over
    ``fit_sizes``; the ``finalists`` best points seen are then measured at every size of ``targets`` (the largest
    ones cost the most, so only they see them) and the lowest mean loss over all of them wins. Returns (profile,
    every evaluation as a row)."""
    import hashlib
    import json

    from datasets import cache_dir

    from fastdpr.atomic import write_json

    curve_cache = cache_dir() / "fit-curve"
    seen: dict[tuple, tuple[float, dict]] = {}
    log: list[dict] = []

    def profile_of(values: dict) -> Profile:
        values = dict(values, families=int(round(values["families"])))
        return dataclasses.replace(start, name=name, **values)

    def measure(values: dict, sizes: list[int]) -> dict:
        prof = profile_of(values)
        out = {}
        for n in sizes:
            nlist = int(targets[n]["nlist"])
            # kept in the benchmark cache: a fit that stops (or a wider one later) measures no point twice
            path = curve_cache / (hashlib.sha1(f"{prof!r} {n} {dim} {n_queries} {nlist}".encode()).hexdigest()[:16]
                                  + ".json")
            if path.exists():
                out[n] = json.loads(path.read_text())
                continue
            pt = stats(synthetic_set(prof, n, dim, n_queries), work, nlist, lid=True)["partition"]
            out[n] = {k: pt[k] for k in ("nprobe_for_95pct_median", "nprobe_for_95pct_p90", "lid_median")}
            write_json(path, out[n])
        return out

    def evaluate(values: dict) -> tuple[float, dict]:
        key = tuple(sorted(values.items()))
        if key not in seen:
            got = measure(values, fit_sizes)
            value = float(np.mean([curve_loss(got[n], targets[n]) for n in fit_sizes]))
            seen[key] = (value, got)
            log.append({"stage": "fit", **{k: values[k] for k in CURVE_SEARCHED}, "loss": round(value, 4),
                        **{f"{n:,}": show_one(got[n]) for n in fit_sizes}})
        return seen[key]

    def show_one(pt: dict) -> str:
        return (f"{pt['nprobe_for_95pct_median']:.0f}/{pt['nprobe_for_95pct_p90']:.0f} LID "
                f"{pt['lid_median']:.0f}")

    def show(got: dict) -> str:
        return " | ".join(f"{n:,}: {show_one(pt)}" for n, pt in got.items())

    for n, row in targets.items():
        print(f"real at {n:,}: {row['lists for 95% (median)']:.0f}/{row['lists for 95% (p90)']:.0f} LID "
              f"{row['lid_median']:.0f}", flush=True)
    # the topic share stays as the start has it, but the search's budget of shares counts it
    params = {k: getattr(start, k) for k in (*CURVE_SEARCHED, "topic_share")}
    value, params, got = grid_start(evaluate, params, show, FAMILY_GRID)
    coordinate_search(evaluate, params, rounds, show, start=(value, got), keys=CURVE_SEARCHED)
    ranked = sorted(seen.items(), key=lambda kv: kv[1][0])[:finalists]
    rest = [n for n in targets if n not in fit_sizes]
    final = None
    for key, (value, got) in ranked:
        values = dict(key)
        got = {**got, **measure(values, rest)}
        total = float(np.mean([curve_loss(got[n], targets[n]) for n in targets]))
        log.append({"stage": "final", **{k: values[k] for k in CURVE_SEARCHED}, "loss": round(total, 4),
                    **{f"{n:,}": show_one(got[n]) for n in targets}})
        print(f"  finalist {values}: loss over every size {total:.3f}  {show(got)}", flush=True)
        if final is None or total < final[0]:
            final = (total, values)
    return profile_of(final[1]), log


def time_generation(n: int, dim: int, out: Path) -> None:
    """Seconds to draw ``n x dim`` passages of each profile in the chunks ``datasets.calibrated_synthetic`` writes
    (kept nowhere: the drawing is timed, not the disk), and the process's peak memory."""
    import resource

    from _common import markdown_table, write_results

    from fastdpr.index.synthetic import BLOCK, PROFILES

    rows = []
    for name in PROFILES:
        t0 = time.perf_counter()
        gen = CalibratedGenerator(n, dim, name, seed=0)
        setup = time.perf_counter() - t0
        for start in range(0, n, 4 * BLOCK):
            gen.passages(start, min(n, start + 4 * BLOCK))
        gen.queries(1000)
        rows.append({"profile": name, "n": n, "dim": dim, "setup_s": round(setup, 2),
                     "total_s": round(time.perf_counter() - t0, 1), "leaves": gen.n_leaves,
                     "peak_rss_mib_so_far": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024})
        print(rows[-1], flush=True)
    body = (f"Drawing {n} x {dim} float32 passages (+ 1,000 queries) of each calibrated profile, 1 thread, in chunks "
            f"of {4 * BLOCK} rows, discarded (no disk); setup: the rotation, topic and leaf centres.\n\n"
            + markdown_table(rows, list(rows[0])) + "\n")
    write_results("ann_synthetic_generation", out, {"rows": rows}, body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pooling", default="mean,cls")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--from-profiles", dest="from_profiles", action="store_true",
                    help="start from the profiles in fastdpr.index.synthetic.PROFILES")
    ap.add_argument("--time", metavar="NxD", help="time generating NxD passages instead of fitting")
    ap.add_argument("--growth", metavar="SIZES", default=None,
                    help="fit to the real pool of real_pool.py at these nested sizes (comma-separated), "
                         "nlist = --lists-per-sqrt * sqrt(n), instead of the quickstart's pool at one size")
    ap.add_argument("--pool", type=Path, default=None, help="with --growth: real_pool.py's folder")
    ap.add_argument("--queries", type=int, default=1000, help="with --growth: real queries per size")
    ap.add_argument("--query-source", choices=("questions", "passages"), default="questions")
    ap.add_argument("--lists-per-sqrt", type=float, default=4.0)
    ap.add_argument("--grid", action="store_true",
                    help="with --growth: start from the best point of a coarse grid at the smallest size")
    ap.add_argument("--start-profile", default=None,
                    help="with --growth: start the search from this profile of PROFILES (e.g. minilm-mean-growth)")
    ap.add_argument("--name", default=None, help="with --growth: the fitted profile's name")
    ap.add_argument("--targets", type=Path, default=None,
                    help="fit the near-repeat families to a measured growth curve: an ann_growth.json whose real "
                         "rows are the targets (the real pool itself is not needed); with --start-profile, "
                         "--fit-sizes, --name")
    ap.add_argument("--targets-set", default="real-mean", help="with --targets: the rows' set")
    ap.add_argument("--fit-sizes", default="10000,30000,100000,300000",
                    help="with --targets: the sizes every point of the search is measured at (the finalists: "
                         "every size of the targets)")
    ap.add_argument("--finalists", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    if args.time:
        try:
            n, dim = (int(v) for v in args.time.lower().split("x"))
        except ValueError:
            ap.error(f"--time takes NxD, e.g. 1000000x768; got {args.time!r}")
        time_generation(n, dim, args.out)
        return 0
    from fastdpr.index.synthetic import PROFILES

    if args.targets is not None:
        return curve_main(args, ap)
    if args.growth is not None:
        try:
            sizes = sorted({int(v) for v in args.growth.split(",") if v.strip()})
        except ValueError:
            ap.error(f"--growth takes comma-separated passage counts, e.g. 10000,30000; got {args.growth!r}")
        if not sizes or sizes[0] <= 0:
            ap.error(f"--growth takes positive passage counts; got {args.growth!r}")
        import real_pool

        with tempfile.TemporaryDirectory() as work:
            for pooling in args.pooling.split(","):
                name = args.start_profile or (f"minilm-{pooling}" if args.from_profiles else None)
                if name is not None and name not in PROFILES:
                    ap.error(f"--start-profile {name!r}: known: {', '.join(sorted(PROFILES))}")
                start = {k: getattr(PROFILES[name], k) for k in STRUCTURE} if name else START[pooling]
                profile, want, got = fit_growth(pooling, sizes, args.rounds, start, Path(work),
                                                args.pool or real_pool.default_work(), args.queries,
                                                args.query_source, args.lists_per_sqrt, args.grid, args.name)
                print(f"\n{pooling}, fitted to the growth curve:", flush=True)
                for n in want:
                    print(f"  {n:,} real      {fmt(want[n])}\n  {n:,} synthetic {fmt(got[n])}", flush=True)
                print(f"{profile!r}\n", flush=True)
        return 0

    with tempfile.TemporaryDirectory() as work:
        for pooling in args.pooling.split(","):
            t0 = time.perf_counter()
            name = f"minilm-{pooling}"
            start = ({k: getattr(PROFILES[name], k) for k in STRUCTURE} if args.from_profiles
                     else START[pooling])
            profile, want, got = fit(pooling, args.rounds, start, Path(work))
            print(f"\n{pooling}: fitted in {time.perf_counter() - t0:.0f} s\n  real      {fmt(want)}\n"
                  f"  synthetic {fmt(got)}\n{profile!r}\n", flush=True)
    return 0


def curve_main(args, ap) -> int:
    """--targets: fit, print the profile, write ``ann_fit_curve.{json,md}`` with every evaluation."""
    from _common import markdown_table, write_results

    from fastdpr.index.synthetic import PROFILES

    start_name = args.start_profile or "minilm-mean-pool"
    if start_name not in PROFILES:
        ap.error(f"--start-profile {start_name!r}: known: {', '.join(sorted(PROFILES))}")
    try:
        fit_sizes = sorted({int(v) for v in args.fit_sizes.split(",") if v.strip()})
    except ValueError:
        ap.error(f"--fit-sizes takes comma-separated passage counts; got {args.fit_sizes!r}")
    import json

    try:
        rows = json.loads(args.targets.read_text()).get("rows", [])
    except (OSError, ValueError) as err:
        ap.error(f"--targets {args.targets}: {err}")
    sizes = sorted(set(fit_sizes) | {int(r["n"]) for r in rows if r.get("set") == args.targets_set})
    targets = curve_targets(args.targets, sizes, args.targets_set)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        profile, log = fit_to_curve(targets, fit_sizes, PROFILES[start_name], args.rounds, Path(work),
                                    args.name or f"{start_name}-families", args.finalists)
    print(f"{profile!r}", flush=True)
    body = (f"Near-repeat families fitted to the `{args.targets_set}` rows of `{args.targets}` from "
            f"`{start_name}`: every point measured at {', '.join(f'{n:,}' for n in fit_sizes)} passages, the "
            f"{args.finalists} best at every size of the targets ({', '.join(f'{n:,}' for n in targets)}); loss: "
            f"mean squared log ratio of lists for 95% (median, p90) and LID. {time.perf_counter() - t0:.0f} s.\n\n"
            f"Targets: " + "; ".join(f"{n:,}: {r['lists for 95% (median)']:.0f}/{r['lists for 95% (p90)']:.0f} LID "
                                    f"{r['lid_median']:.0f}" for n, r in targets.items())
            + "\n\n" + markdown_table(log, list(dict.fromkeys(k for r in log for k in r)), floatfmt=".4g")
            + f"\n\nResult:\n\n```\n{profile!r}\n```\n")
    write_results("ann_fit_curve", args.out, {"settings": {k: str(v) for k, v in vars(args).items()},
                                              "profile": dataclasses.asdict(profile), "evaluations": log}, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
