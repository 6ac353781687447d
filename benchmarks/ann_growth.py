"""How the difficulty of inner-product search grows with n: the real MiniLM pool of ``real_pool.py`` against the
calibrated generator (``fastdpr.index.synthetic``), at the same sizes.

For each size n of ``--sizes`` (the real pool's nested prefixes: each is a uniform sample of the next) and each
data set, with one fixed index family, balanced L2 k-means lists as fastdpr's IVF-PQ trains them with
``nlist = round(--lists-per-sqrt * sqrt(n))``, it measures

- **lists and candidates for recall@100 >= 0.95**: per query, probing lists in order of <query, centroid>, how many
  lists an ideal IVF (exact scores inside the probed lists) must probe to see 95 of its exact top-100, and the share
  of the n passages those lists hold (median and 90th percentile over queries; ``ann_calibrate.partition_spread``);
- **local intrinsic dimensionality** (maximum-likelihood estimate over the 100 nearest neighbours, Levina and
  Bickel 2004) and **relative contrast** (mean distance to a random passage over the distance to the nearest one,
  He, Kumar and Chang 2012), each per query (median reported), on distances in the Euclidean space where inner
  product search is nearest-neighbour search: x -> [x, sqrt(M^2 - |x|^2)], q -> [q, 0] (Bachrach et al. 2014),
  so that |q' - x'|^2 = |q|^2 + M^2 - 2 <q, x>.

The real queries are the ``test`` half of the pool's questions (``--queries`` of them, in file order), or with
``--query-source passages`` passages of the pool itself that lie beyond every measured prefix (rows
``[largest size, largest size + --queries)`` of the permutation): queries from the corpus's own topics, against
questions that mostly have nothing close in it. The generator draws its own queries. Ground truth is exact search
(cached per set).

    python benchmarks/ann_growth.py                                  # every size the encoded pool reaches
    python benchmarks/ann_growth.py --sizes 10000,30000 --pooling mean
    python benchmarks/ann_growth.py --profiles minilm-mean,minilm-mean-pool   # the generator before and after the
                                                                               # fit to this curve

Writes ``ann_growth.{json,md,png}``; sizes beyond what ``real_pool.py encode`` has finished are skipped with a line
that says so. Each (set, n, nlist) row is kept beside its ground truth in the benchmark cache, so a later run with
one more size measures only that size (the 1M point takes the longest, and the pool reaches it last).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, write_results  # noqa: E402
from ann_calibrate import partition_spread  # noqa: E402
from datasets import Dataset, cache_dir, calibrated_synthetic, ground_truth  # noqa: E402

from fastdpr.atomic import write_json  # noqa: E402

K = 100
SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
PROFILE = {"mean": "minilm-mean", "cls": "minilm-cls"}


def mips_distances(q: np.ndarray, scores: np.ndarray, big_m_sq: float) -> np.ndarray:
    """Euclidean distances after the MIPS -> nearest-neighbour transform, from the inner products ``scores``
    (nq, m) of the queries ``q`` with some passages; ``big_m_sq`` is the largest squared passage norm. The appended
    coordinate makes every |x'| equal M, so no passage norm is needed: |q' - x'|^2 = |q|^2 + M^2 - 2 <q, x>."""
    q_sq = np.einsum("ij,ij->i", q, q)[:, None]
    return np.sqrt(np.maximum(q_sq + big_m_sq - 2.0 * scores, 0.0))


def lid_mle(nearest: np.ndarray) -> np.ndarray:
    """Levina-Bickel maximum-likelihood intrinsic dimensionality per row of ``nearest`` (distances to the k nearest
    neighbours, ascending): -1 / mean_i log(d_i / d_k), over the neighbours with a positive distance."""
    d = np.asarray(nearest, dtype=np.float64)
    dk = d[:, -1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(d[:, :-1] / dk)
    logs = np.where(np.isfinite(logs), logs, np.nan)
    mean = np.nanmean(logs, axis=1)
    # every neighbour as far as the k-th (mean 0): no estimate
    return np.divide(-1.0, mean, out=np.full_like(mean, np.nan), where=mean < 0)


def neighbourhood(ds: Dataset, gt: np.ndarray, sample: int = 1000, seed: int = 0) -> dict:
    """Median LID (k = 100) and relative contrast of the queries, in the MIPS -> NN space."""
    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    big_m_sq = 0.0
    for start in range(0, ds.n, 65536):
        block = np.asarray(ds.base[start:start + 65536], dtype=np.float32)
        big_m_sq = max(big_m_sq, float(np.einsum("ij,ij->i", block, block).max()))
    top = np.stack([np.asarray(ds.base[row], dtype=np.float32) for row in gt.T], axis=1)  # (nq, K, d)
    top_scores = np.einsum("qd,qkd->qk", q, top)
    nearest = np.sort(mips_distances(q, top_scores, big_m_sq), axis=1)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(ds.n, size=min(sample, ds.n), replace=False))
    random_scores = q @ np.asarray(ds.base[rows], dtype=np.float32).T
    mean_random = mips_distances(q, random_scores, big_m_sq).mean(axis=1)
    with np.errstate(divide="ignore"):
        contrast = mean_random / nearest[:, 0]
    lid = lid_mle(nearest)
    return {"lid_median": float(np.nanmedian(lid)), "lid_p90": float(np.nanpercentile(lid, 90)),
            "relative_contrast_median": float(np.median(contrast[np.isfinite(contrast)]))}


def real_set(work: Path, pooling: str, n: int, n_queries: int, query_source: str = "questions",
             beyond: int = 0) -> Dataset | None:
    """The first ``n`` passages of the real pool with ``n_queries`` queries: test-half questions, or (``query_source
    = "passages"``) the passages of rows ``[beyond, beyond + n_queries)``, outside every prefix measured."""
    import real_pool

    label = f"real {pooling} at {n:,}" + (" (passage queries)" if query_source == "passages" else "")
    try:
        base = real_pool.load_vectors(work, pooling, n)
        if query_source == "passages":
            queries = real_pool.load_vectors(work, pooling, beyond + n_queries)[beyond:]
        else:
            queries = real_pool.load_vectors(work, pooling, what="queries")
    except ValueError as err:
        print(f"{label}: skipped ({err})", flush=True)
        return None
    if queries.size == 0:
        print(f"{label}: skipped (no question vectors yet in {work}/encode/queries)", flush=True)
        return None
    if query_source == "passages":
        tag = f"p{beyond}-{n_queries}"
    else:
        records = real_pool._read_texts(work / "queries.jsonl")
        test = [i for i, r in enumerate(records) if r["split"] == "test"][:n_queries]
        queries, tag = queries[test], f"q{len(test)}"
    directory = cache_dir() / f"real-pool-{pooling}-{n}-{tag}"
    directory.mkdir(parents=True, exist_ok=True)
    name = f"real-{pooling}" + ("-passage-queries" if query_source == "passages" else "") + f"-{n}"
    return Dataset(name=name, base=np.asarray(base, dtype=np.float32),
                   queries=np.asarray(queries, dtype=np.float32), directory=directory,
                   description=f"real pool, MiniLM {pooling} pooling, first {n:,} rows of the fixed permutation")


ROW_VERSION = 1  # bump when what a row measures changes: older cached rows are then measured again


def measure(ds: Dataset, lists_per_sqrt: float) -> dict:
    nlist = max(1, int(round(lists_per_sqrt * math.sqrt(ds.n))))
    cached = ds.directory / f"growth-nlist{nlist}-v{ROW_VERSION}.json"
    if cached.exists():
        row = json.loads(cached.read_text())
        print(f"{row} (kept from {cached})", flush=True)
        return row
    t0 = time.perf_counter()
    gt = ground_truth(ds, K)
    part = partition_spread(ds, gt, nlist, "l2-balanced")
    row = {"set": ds.name.rsplit("-", 1)[0], "n": ds.n, "queries": len(ds.queries), "nlist": nlist,
           "lists for 95% (median)": part["nprobe_for_95pct_median"],
           "lists for 95% (p90)": part["nprobe_for_95pct_p90"],
           "share of lists (median)": part["nprobe_for_95pct_median"] / nlist,
           "candidates for 95% (median)": part["scanned_for_95pct_median"] * ds.n,
           "share of passages (median)": part["scanned_for_95pct_median"],
           "share of passages (p90)": part["scanned_for_95pct_p90"],
           **neighbourhood(ds, gt), "seconds": round(time.perf_counter() - t0, 1)}
    write_json(cached, row)
    print(row, flush=True)
    return row


def merged(rows: list[dict], path: Path) -> list[dict]:
    """The rows of an earlier result file ``path`` with ``rows`` in place of those of the same (set, n), ordered by
    n, then as they came."""
    try:
        earlier = json.loads(Path(path).read_text())["rows"]
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"--merge {path}: not an ann_growth.py result ({err})") from None
    mine = {(r["set"], r["n"]) for r in rows}
    kept = [r for r in earlier if (r["set"], r["n"]) not in mine] + rows
    return sorted(kept, key=lambda r: r["n"])


def plot(rows: list[dict], path: Path) -> None:
    """Share of the passages an ideal IVF scans for 95% of the top-100, and LID, against n: one line per set."""
    try:
        from fastdpr.plotting import pyplot

        plt = pyplot()
    except Exception as err:  # the numbers are written already; a missing plot extra must not lose them
        print(f"no plot: {err}", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["set"] for r in rows):
        mine = sorted((r for r in rows if r["set"] == name), key=lambda r: r["n"])
        n = [r["n"] for r in mine]
        style = "o-" if name.startswith("real") else "s--"
        axes[0].plot(n, [r["share of passages (median)"] for r in mine], style, label=name)
        axes[1].plot(n, [r["lid_median"] for r in mine], style, label=name)
    axes[0].set_ylabel("share of passages scanned\nfor 95% of the top-100 (median)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("local intrinsic dimensionality\n(median, k = 100)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("passages n (nested prefixes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="the real pool's folder (default: real_pool.py's)")
    ap.add_argument("--sizes", default=",".join(str(n) for n in SIZES))
    ap.add_argument("--pooling", default="mean", choices=sorted(PROFILE))
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--lists-per-sqrt", type=float, default=4.0,
                    help="nlist = round(this * sqrt(n)): faiss's guideline is 4 to 16")
    ap.add_argument("--query-source", choices=("questions", "passages"), default="questions",
                    help="test-half questions, or pool passages beyond the largest size")
    ap.add_argument("--no-synthetic", action="store_true", help="the real pool only")
    ap.add_argument("--no-real", action="store_true",
                    help="the generator only (at --dim): its rows are kept, so they need not wait for the encoding")
    ap.add_argument("--dim", type=int, default=384, help="with --no-real: the generator's dimension")
    ap.add_argument("--profiles", default=None,
                    help="the generator's profiles to measure beside the pool, comma-separated (default: the one "
                         "calibrated to the pooling, e.g. minilm-mean)")
    ap.add_argument("--merge", type=Path, default=None,
                    help="an earlier ann_growth.json whose rows are kept beside this run's (a row measured again "
                         "replaces its own), e.g. the committed real rows beside a new profile measured with --no-real")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import real_pool

    work = args.work or real_pool.default_work()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--sizes must be positive whole numbers, got {args.sizes!r}") from None
    if not sizes or min(sizes) <= 0:
        raise SystemExit(f"--sizes must be positive numbers, got {args.sizes!r}")
    from fastdpr.index.synthetic import PROFILES

    if args.no_real and args.no_synthetic:
        raise SystemExit("--no-real and --no-synthetic leave nothing to measure")
    profiles = [p for p in (args.profiles or PROFILE[args.pooling]).split(",") if p.strip()]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown:
        raise SystemExit(f"--profiles: unknown profile {unknown[0]!r}; known: {', '.join(sorted(PROFILES))}")
    rows = []
    for n in sizes:
        if args.no_real:  # the generator's rows, kept for a later run once the pool reaches n
            for profile in profiles:
                rows.append(measure(calibrated_synthetic(n, args.dim, profile, args.queries), args.lists_per_sqrt))
            continue
        real = real_set(work, args.pooling, n, args.queries, args.query_source, beyond=max(sizes))
        if real is None:
            continue
        rows.append(measure(real, args.lists_per_sqrt))
        for profile in [] if args.no_synthetic else profiles:
            rows.append(measure(calibrated_synthetic(n, real.dim, profile, args.queries), args.lists_per_sqrt))
    if not rows:
        raise SystemExit(f"{work}: no size of {sizes} is encoded yet (python benchmarks/real_pool.py encode)")
    if args.merge is not None:
        rows = merged(rows, args.merge)
    queries = "test-half questions" if args.query_source == "questions" else "pool passages as queries"
    body = (f"Real pool (`real_pool.py`, MiniLM {args.pooling} pooling, {queries}) against the calibrated "
            f"generator ({', '.join(profiles)}), balanced L2 lists, nlist = {args.lists_per_sqrt:g} sqrt(n); an "
            f"ideal IVF probing lists by <q, c> until 95 of the exact top-{K} are seen; LID (k = {K}) and relative "
            f"contrast in the MIPS -> nearest-neighbour space."
            + (f" The rows of the other sets are kept from `{args.merge}`." if args.merge else "") + "\n\n"
            + markdown_table(rows, floatfmt=".4g") + "\n")
    print(body)
    settings = vars(args) | {"work": str(work), "merge": args.merge and str(args.merge)}
    written = write_results("ann_growth", args.out, {"settings": settings, "rows": rows}, body)
    plot(rows, written.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
