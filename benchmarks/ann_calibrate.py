"""How the synthetic mixture of the ANN benchmark compares with real embeddings, measured at equal N and d.

For each data set (the real pool with MiniLM mean pooling and raw [CLS], see ``ann_data.py``; the synthetic
mixture of ``datasets.synthetic`` at the same n, d and query count) it reports:

- norms of passages and queries (min / 5% / median / 95% / max, and max / median): what an inner-product index
  meets as high-norm hubs;
- anisotropy: the length of the mean passage over the mean passage length (0: directions spread evenly; near 1:
  every vector shares one direction), and how many principal components hold 90% of the passage variance;
- partition spread: k-means over the passages (IVF's coarse quantizer, nlist lists, L2 assignment as fastdpr's
  IVF-PQ does by default); for each query, how many distinct lists hold its exact top-100, and how many lists an
  ideal IVF must probe (lists in order of <query, centroid>) to see 95% of the top-100 -- the nprobe below which
  no code, however exact, reaches recall@100 = 0.95.

    python benchmarks/ann_calibrate.py                 # writes benchmarks/results/ann_calibration.{json,md}
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import DEFAULT_OUT, markdown_table, write_results  # noqa: E402
from datasets import Dataset, ground_truth, synthetic  # noqa: E402

K = 100
COVER = 0.95


def centroids_of(base: np.ndarray, nlist: int, seed: int = 1234) -> np.ndarray:
    from fastdpr.index._native import native

    C = native()
    if C is not None:
        return C.kmeans(np.ascontiguousarray(base, dtype=np.float32), nlist, niter=20, seed=seed)[0]
    from fastdpr.index.kmeans import kmeans

    return kmeans(base, nlist, niter=20, seed=seed)


def norms(x: np.ndarray) -> dict:
    v = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1)
    p = np.percentile(v, [0, 5, 50, 95, 100])
    return {"min": p[0], "p5": p[1], "median": p[2], "p95": p[3], "max": p[4], "max/median": p[4] / p[2],
            "cv": float(v.std() / v.mean())}


def anisotropy(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0)
    centred = x - mean
    var = np.linalg.svd(centred[: min(len(x), 20000)], compute_uv=False) ** 2
    share = np.cumsum(var) / var.sum()
    return {"mean_length/mean_norm": float(np.linalg.norm(mean) / np.linalg.norm(x, axis=1).mean()),
            "pcs_for_90pct_variance": int(np.searchsorted(share, 0.90) + 1)}


def partition_spread(ds: Dataset, gt: np.ndarray, nlist: int) -> dict:
    from fastdpr.index.kmeans import nearest

    base = np.ascontiguousarray(ds.base, dtype=np.float32)
    cent = centroids_of(base, nlist)
    lists = nearest(base, cent, max_inner_product=False)
    sizes = np.bincount(lists, minlength=nlist)
    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    order = np.argsort(-(q @ cent.T), axis=1, kind="stable")  # the probe order of an IVF search
    rank_of = np.empty_like(order)
    rank_of[np.arange(len(q))[:, None], order] = np.arange(nlist)[None, :]
    distinct, needed = [], []
    need_hits = int(np.ceil(COVER * K))
    for i in range(len(q)):
        holder = lists[gt[i, :K]]
        distinct.append(len(np.unique(holder)))
        ranks = np.sort(rank_of[i, holder])
        needed.append(int(ranks[need_hits - 1]) + 1)  # probing this many lists covers 95% of the top-100
    distinct, needed = np.array(distinct), np.array(needed)
    pct = lambda a, p: float(np.percentile(a, p))  # noqa: E731
    return {"nlist": nlist, "list_size_max/mean": float(sizes.max() / sizes.mean()),
            "empty_lists": int((sizes == 0).sum()),
            "lists_holding_top100_median": pct(distinct, 50), "lists_holding_top100_p90": pct(distinct, 90),
            "nprobe_for_95pct_median": pct(needed, 50), "nprobe_for_95pct_p90": pct(needed, 90),
            "nprobe_for_95pct_mean": float(needed.mean())}


def measure(ds: Dataset, nlists: list[int]) -> dict:
    t0 = time.perf_counter()
    gt = ground_truth(ds, K)
    out = {"dataset": ds.name, "n": ds.n, "dim": ds.dim, "queries": len(ds.queries), "description": ds.description,
           "passage_norms": norms(ds.base), "query_norms": norms(ds.queries), "anisotropy": anisotropy(ds.base),
           "partitions": [partition_spread(ds, gt, nlist) for nlist in nlists]}
    print(f"{ds.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--nlist", default="auto", help="comma-separated list counts ('auto': fastdpr's default and "
                                                    "ScaNN's 2 sqrt(n))")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from ann_data import real_pool

    from fastdpr.index.ivfpq import default_nlist

    t0 = time.perf_counter()
    real = [real_pool(p, args.queries) for p in ("mean", "cls")]
    n, d = real[0].n, real[0].dim
    nlists = ([default_nlist(n), round(2 * np.sqrt(n))] if args.nlist == "auto"
              else [int(v) for v in args.nlist.split(",")])
    sets = real + [synthetic(n, d, args.queries)]
    results = [measure(ds, nlists) for ds in sets]

    rows = []
    for r in results:
        pn, qn, an = r["passage_norms"], r["query_norms"], r["anisotropy"]
        for part in r["partitions"]:
            rows.append({"data": r["dataset"],
                         "passage norm p5/median/p95 (max/median)":
                             f"{pn['p5']:.2f}/{pn['median']:.2f}/{pn['p95']:.2f} ({pn['max/median']:.2f})",
                         "query norm p5/median/p95": f"{qn['p5']:.2f}/{qn['median']:.2f}/{qn['p95']:.2f}",
                         "mean length / mean norm": an["mean_length/mean_norm"],
                         "PCs for 90% variance": an["pcs_for_90pct_variance"],
                         "nlist": part["nlist"],
                         "lists holding top-100 (median / p90)":
                             f"{part['lists_holding_top100_median']:.0f} / {part['lists_holding_top100_p90']:.0f}",
                         "nprobe to cover 95% of top-100 (median / p90 / mean)":
                             f"{part['nprobe_for_95pct_median']:.0f} / {part['nprobe_for_95pct_p90']:.0f} / "
                             f"{part['nprobe_for_95pct_mean']:.1f}",
                         "largest list / mean": part["list_size_max/mean"]})
    body = (f"{n} x {d}, {args.queries} queries each; exact top-{K} by inner product. Partitions: k-means "
            f"(20 iterations) over all passages, passages assigned to the nearest centroid (L2), lists probed in "
            f"order of <query, centroid>. 'nprobe to cover 95%': the number of lists an ideal IVF (exact scores "
            f"inside the lists) must probe before 95 of a query's true top-100 are among the candidates.\n\n"
            + markdown_table(rows, list(rows[0])) + "\n")
    write_results("ann_calibration", args.out, {"results": results, "wall_s": round(time.perf_counter() - t0, 1)},
                  body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
