"""The coarse level with many lists (``csrc/coarse.h``): training, filing and the search's centroid ranking.

On calibrated 768-dimensional MiniLM-like vectors (``fastdpr.index.synthetic``, ``minilm-mean``), with 16,384 lists:

- ``two_level_kmeans`` (``groups=128``, 20 iterations, balanced) on 16,384 x 32 sample rows, against one flat Lloyd
  assignment of the same sample (flat k-means pays that every iteration, before its k-means++ seeding);
- filing 200,000 rows through ``CoarseGroups`` (16 of its groups probed, as ``IVFPQ`` does from 16,384 lists on;
  also 8) against flat ``assign_nearest``: seconds and the share of rows filed under their exact nearest centroid;
- ranking every centroid in the search, per question: an IVF-PQ index of random centroids searched with nprobe 1 at
  4,096 to 65,536 lists (the coarse products and the probe, nearly nothing else).

    python benchmarks/coarse_bench.py [--rows 200000] [--out DIR]

Writes ``coarse.{json,md}``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_results  # noqa: E402


def clock(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def ranking_cost(dim: int, nlists: list[int], queries: int = 400) -> list[dict]:
    """Milliseconds per question of a search that probes one list, best of 3, at 1 and 2 threads."""
    from fastdpr.index.ivfpq import IVFPQIndex

    rng = np.random.default_rng(0)
    q = rng.standard_normal((queries, dim)).astype(np.float32)
    rows = []
    for nlist in nlists:
        impl = IVFPQIndex(dim, nlist=nlist, nbits=4, m=dim // 8)._make_impl(nlist)
        impl.set_trained(rng.standard_normal((nlist, dim)).astype(np.float32),
                         rng.standard_normal((dim // 8, 16, 8)).astype(np.float32))
        impl.add(rng.standard_normal((2000, dim)).astype(np.float32))
        row = {"nlist": nlist}
        for threads in (1, 2):
            best = min(clock(lambda: impl.search(q, 10, 1, 0, threads, 0.0, 0))[1] for _ in range(3))
            row[f"ms/question, {threads} thread{'s' if threads > 1 else ''}"] = round(best / queries * 1e3, 3)
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="rows filed")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from fastdpr import _C as C
    from fastdpr.index.synthetic import calibrated

    d, nlist, groups, per_list = 768, 16_384, 128, 32
    n_sample = nlist * per_list
    x, _ = calibrated(n_sample + args.rows, d, "minilm-mean", n_queries=1, seed=7)
    rows, sample = np.ascontiguousarray(x[:args.rows]), np.ascontiguousarray(x[args.rows:])
    del x
    cent, t_train = clock(lambda: C.two_level_kmeans(sample, nlist, groups, niter=20, seed=1234,
                                                     max_points_per_centroid=per_list, balance=0.5))
    part = min(65_536, n_sample)
    _, t_part = clock(lambda: C.assign_nearest(cent, sample[:part]))
    t_lloyd = t_part * n_sample / part
    del sample
    exact, t_flat = clock(lambda: C.assign_nearest(cent, rows))
    (_, n_groups), t_build = clock(lambda: C.coarse_assign(cent, rows[:1], 1))
    filing = [{"method": "flat assign_nearest", "seconds": round(t_flat, 2), "in exact list": 1.0}]
    for probe in (16, 8):
        (labels, _), t = clock(lambda: C.coarse_assign(cent, rows, probe))
        filing.append({"method": f"groups, {probe} of {n_groups} probed (build {t_build:.2f} s included)",
                       "seconds": round(t, 2), "in exact list": round(float(np.mean(labels == exact)), 4)})
        print(filing[-1], flush=True)
    ranking = ranking_cost(d, [4096, 8192, 16384, 65536])
    body = (f"Calibrated `minilm-mean` vectors, {d} dimensions, {nlist:,} lists, default threads.\n\n"
            f"- two_level_kmeans (groups={groups}, 20 iterations, balance 0.5) on {n_sample:,} sample rows: "
            f"{t_train:.1f} s; one flat Lloyd assignment of the same rows (timed on {part:,}, scaled): "
            f"{t_lloyd:.1f} s, which flat k-means pays every iteration, after its k-means++ seeding\n\n"
            f"### Filing {args.rows:,} rows\n\n" + markdown_table(filing) +
            "\n### Ranking every centroid in the search (nprobe 1, 400 questions of random data, best of 3)\n\n"
            + markdown_table(ranking))
    print(body)
    write_results("coarse", args.out, {"train_s": t_train, "flat_lloyd_assign_s": t_lloyd, "filing": filing,
                                       "ranking": ranking}, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
