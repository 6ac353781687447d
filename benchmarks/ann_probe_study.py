"""Where compressed IVF-PQ loses recall at a million vectors: the lists it probes, or the codes it ranks by.

On the calibrated 1M x 768 set of ``ann_compressed.py`` (MiniLM mean-pooling profile, 1,000 queries, top-100) and the
same index (``ivfpq,nbits=4,m=64,store=fp16,aniso=0.2``, 2,048 balanced L2 lists), it measures two ceilings:

- **partition recall**: the share of each query's exact top-100 that lies in the first ``nprobe`` lists, for
  several orders of the lists:
    - ``q.c``: the inner product with the centroid (what IVF-PQ probes by);
    - ``+ spread``: q.c + beta * |q| * s_l, with s_l = rms residual / sqrt(d) * sqrt(2 ln n_l), the expected
      largest q.(x - c) of a list of n_l Gaussian residuals: lists whose members spread further get probed earlier;
    - ``+ ellipsoid k``: the same with the list's residuals modelled by their k principal directions and variances
      (SVD per list), q.(x - c) having variance sum_i s_i^2 (q.u_i)^2 + s_rest^2 (|q|^2 - sum_i (q.u_i)^2);
    - ``oracle``: lists in order of the best exact score among their members (no index can know it; it shows how
      few lists hold the top-100);
- **code recall**: the share of the top-100 among the ``R`` best candidates by 4-bit code score (no re-rank) within
  ``nprobe`` lists: what re-ranking ``R`` vectors can reach at best.

    FASTDPR_BENCH_CACHE=... python benchmarks/ann_probe_study.py     # writes benchmarks/results/ann_probe_study.*
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, write_results  # noqa: E402

SPEC = "ivfpq,nbits=4,m=64,store=fp16,aniso=0.2"


def partition_recall(score: np.ndarray, gt_lists: np.ndarray, nprobes: list[int]) -> dict[str, float]:
    """Share of the top-100 whose list ranks within the first nprobe lists when lists are ordered by ``score``."""
    nq, nlist = score.shape
    order = np.argsort(-score, axis=1)
    rank = np.empty_like(order)
    rank[np.arange(nq)[:, None], order] = np.arange(nlist)[None, :]
    r = rank[np.arange(nq)[:, None], gt_lists]
    return {f"nprobe {p}": round(float((r < p).mean()), 4) for p in nprobes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--profile", default="minilm-mean")
    ap.add_argument("--components", type=int, default=8, help="principal directions per list (ellipsoid order)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from threadpoolctl import threadpool_limits

    import datasets
    from fastdpr.index import build_index, load_index

    ds = datasets.calibrated_synthetic(args.n, args.dim, args.profile, args.queries)
    gt = datasets.ground_truth(ds, 100)
    path = ds.directory / f"probe-study-{SPEC.replace(',', '_').replace('=', '-')}.fdpr"
    if not path.exists():
        with threadpool_limits(1):
            index = build_index(np.asarray(ds.base, dtype=np.float32), SPEC)
        index.save(path)
    index = load_index(path, mmap=True)
    lists, _ = index.codes()
    centroids = index._impl.centroids()
    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    nq, d, nlist = len(q), q.shape[1], len(centroids)
    gt_lists = lists[gt]
    nprobes = [32, 64, 128, 256, 512]
    qc = q @ centroids.T
    qnorm = np.linalg.norm(q, axis=1)[:, None]

    # per list: member count, residual rms, principal directions of the residuals, best exact score per query
    t0 = time.perf_counter()
    order = np.argsort(lists, kind="stable")
    bounds = np.searchsorted(lists[order], np.arange(nlist + 1))
    k = args.components
    dirs = np.zeros((nlist, k, d), np.float32)
    sd = np.zeros((nlist, k), np.float32)
    rest = np.zeros(nlist, np.float32)
    rms = np.zeros(nlist, np.float32)
    count = np.diff(bounds).astype(np.float64)
    best = np.full((nq, nlist), -np.inf, np.float32)
    for ln in range(nlist):
        members = np.sort(order[bounds[ln]:bounds[ln + 1]])
        if len(members) == 0:
            continue
        x = np.asarray(ds.base[members], dtype=np.float32)
        best[:, ln] = (q @ x.T).max(axis=1)
        r = x - centroids[ln]
        rms[ln] = np.sqrt((r * r).sum(1).mean())
        _, s, vt = np.linalg.svd(r, full_matrices=False)
        kk = min(k, len(s))
        dirs[ln, :kk], sd[ln, :kk] = vt[:kk], s[:kk] / np.sqrt(len(members))
        rest[ln] = np.sqrt((s[kk:] ** 2).sum() / len(members) / max(d - kk, 1))
    per_list_s = time.perf_counter() - t0
    extreme = np.sqrt(2 * np.log(np.maximum(count, 2)))[None, :]

    rows = [{"order": "q.c", **partition_recall(qc, gt_lists, nprobes)}]
    for beta in (0.25, 0.5, 1.0):
        spread = qnorm * (rms / np.sqrt(d))[None, :] * extreme
        rows.append({"order": f"q.c + spread, beta {beta}", **partition_recall(qc + beta * spread, gt_lists, nprobes)})
    for kk in sorted({2, k}):
        p = np.einsum("qd,lkd->qlk", q, dirs[:, :kk])
        var = (p ** 2 * sd[None, :, :kk] ** 2).sum(2) + rest[None, :] ** 2 * np.maximum(
            qnorm ** 2 - (p ** 2).sum(2), 0)
        for gamma in (0.25, 0.5):
            rows.append({"order": f"q.c + ellipsoid {kk}, gamma {gamma}",
                         **partition_recall(qc + gamma * np.sqrt(var) * extreme, gt_lists, nprobes)})
        del p, var
    rows.append({"order": "oracle (best member)", **partition_recall(best, gt_lists, nprobes)})

    codes = []
    ceiling = {r: rows[0][f"nprobe {r}"] for r in nprobes}
    for nprobe in (128, 256, 512):
        for r in (500, 1000, 2000, 4000):
            _, ids = index.search(q, r, nprobe=nprobe, rerank=0, threads=1)
            rec = float(np.mean([len(np.intersect1d(ids[i], gt[i])) / 100 for i in range(nq)]))
            codes.append({"nprobe": nprobe, "R (candidates by code)": r, "recall in candidates": round(rec, 4),
                          "share of partition recall": round(rec / ceiling[nprobe], 4)})
    body = "\n".join([
        f"{ds.description}; {ds.n} x {ds.dim}, {nq} queries, top-100. Index `{SPEC}` ({nlist} lists). Per-list "
        f"statistics (SVD, best member per query) took {per_list_s:.0f} s.", "",
        "Partition recall (share of the exact top-100 inside the first nprobe lists):", "", markdown_table(rows), "",
        "Code recall (share of the top-100 among the R best candidates by 4-bit code score, no re-rank):", "",
        markdown_table(codes), "",
    ])
    out = write_results("ann_probe_study", args.out, {"partition": rows, "codes": codes, "n": ds.n, "dim": ds.dim,
                                                      "nlist": nlist, "spec": SPEC}, body)
    print(body)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
