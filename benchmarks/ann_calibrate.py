"""How the synthetic mixture of the ANN benchmark compares with real embeddings, measured at equal N and d.

For each data set (the real pool with MiniLM mean pooling and raw [CLS], see ``ann_data.py``; the synthetic
mixture of ``datasets.synthetic`` and the two calibrated profiles of ``datasets.calibrated_synthetic``, fitted to the
real pool by ``ann_fit_synthetic.py``, at the same n, d and query count) it reports:

- norms of passages and queries (min / 5% / median / 95% / max, and max / median): what an inner-product index
  meets as high-norm hubs;
- anisotropy: the length of the mean passage over the mean passage length (0: directions spread evenly; near 1:
  every vector shares one direction), and how many principal components hold 90% of the passage variance;
- partition spread, for several ways of building IVF lists over the passages (plain L2 k-means, spherical k-means,
  L2 k-means with balanced lists as fastdpr's IVF-PQ trains them, the same with SOAR-style spilling, and ScaNN's
  own k-means tree read back from its serialized files): for each query, how many distinct lists hold its exact
  top-100, and how many lists -- and what share of the passages -- an ideal IVF must probe (lists in order of
  <query, centroid>) to see 95% of the top-100: the work below which no code, however exact, reaches
  recall@100 = 0.95.

Measured on the real pool of that time (23,582 passages of the earlier data sets; mean pooling, 1,000 NQ test
questions): the share of passages to scan, not the list count, is the cost that
matters. Spherical lists (fastdpr's default before) needed a median 21.6% of the passages at 512 lists, L2 lists
3.3%, balanced L2 lists 3.6%, ScaNN's tree 4.4-4.6% (at 307 leaves; its partition changes from run to run). L2
lists without balancing are very uneven, so their 3.3% is spread over 114 of 512 lists; balanced lists need 22
(16 of 307, about as many as ScaNN's 13-16: its partitioner re-seeds partitions under a minimum size). SOAR-style spilling halves the lists to probe but not the
passages to scan. On [CLS] vectors (norms within 1.26x of each other) every partition needs 25-30% of the
passages (spherical: 48%).

The calibrated profiles hit what they were fitted to (balanced L2 lists at 512: nprobe median / p90 25 / 57 vs
22 / 59 on mean pooling, 137 / 198 vs 128 / 212 on [CLS]; norms within 2.5%, PCs for 90% variance 171 vs 184 and
163 vs 165), and the last table checks each statistic against ``TOLERANCE``. Partitions they were not fitted to
agree less: the mean profile's plain L2 and spherical lists need about a third of the real lists (40 vs 114, 37 vs
120), the [CLS] profile's spherical lists about twice as many (244 vs 115); ScaNN's tree is close on both.

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
from datasets import Dataset, calibrated_synthetic, ground_truth, synthetic  # noqa: E402

K = 100
COVER = 0.95


# Partitions compared (name -> k-means settings as fastdpr's IVF-PQ trains its lists: 20 iterations, k-means++
# seeding, at most 64 training points per list). "l2" is what this calibration measured first (plain k-means, every
# point used), "spherical" the index's default until the lists were balanced, "l2-balanced" the default now.
SCHEMES = {
    "l2": dict(spherical=False, balance=0.0, max_points_per_centroid=256),
    "spherical": dict(spherical=True, balance=0.0, max_points_per_centroid=64),
    "l2-balanced": dict(spherical=False, balance=0.5, max_points_per_centroid=64),
}
SOAR_LAMBDA = 1.0
# How close a calibrated profile (fastdpr.index.synthetic.PROFILES) must come to the real pool it was fitted to,
# relative: norms and the shared vectors are read off the real vectors, so they are held tight; the spectrum and the
# partition statistic (an ideal IVF over the default number of balanced L2 lists) are what the fit searches for,
# with a coarse search and a statistic that moves with k-means seeding
TOLERANCE = {"norm": 0.10, "mean length / mean norm": 0.10, "PCs for 90% variance": 0.15, "nprobe": 0.25}


def centroids_of(base: np.ndarray, nlist: int, spherical: bool = False, balance: float = 0.0,
                 max_points_per_centroid: int = 256, seed: int = 1234) -> np.ndarray:
    from fastdpr.index._native import native

    C = native()
    x = np.ascontiguousarray(base, dtype=np.float32)
    if C is not None:
        return C.kmeans(x, nlist, niter=20, seed=seed, spherical=spherical, balance=balance,
                        max_points_per_centroid=max_points_per_centroid)[0]
    from fastdpr.index.kmeans import kmeans

    return kmeans(x, nlist, niter=20, seed=seed, spherical=spherical, balance=balance,
                  max_points_per_centroid=max_points_per_centroid)


def scann_partition(base: np.ndarray, nlist: int) -> tuple[np.ndarray, np.ndarray] | None:
    """ScaNN's k-means tree as benchmarks/ann_bench.py builds it (dot product, nlist leaves, every point used for
    training), read back from its serialized form: (leaf centroids, each passage's leaf)."""
    try:
        import scann
        from scann.partitioning import partitioner_pb2
    except ImportError:
        print("scann not installed: its partition is not measured", file=sys.stderr)
        return None
    import tempfile

    x = np.ascontiguousarray(base, dtype=np.float32)
    builder = (scann.scann_ops_pybind.builder(x, K, "dot_product")
               .tree(num_leaves=nlist, num_leaves_to_search=max(1, nlist // 10), training_sample_size=len(x))
               .score_ah(2, anisotropic_quantization_threshold=0.2).reorder(400))
    builder.set_n_training_threads(1)
    searcher = builder.build()
    with tempfile.TemporaryDirectory() as d:
        searcher.serialize(d)
        part = partitioner_pb2.SerializedPartitioner()
        part.ParseFromString((Path(d) / "serialized_partitioner.pb").read_bytes())
        root = part.kmeans.kmeans_tree.root
        cent = np.array([list(c.dimension) for c in root.centers], dtype=np.float32)
        leaf_of_child = np.array([c.leaf_id for c in root.children])
        tokens = np.load(Path(d) / "datapoint_to_token.npy")
    if len(cent) != nlist or len(tokens) != len(x) or (leaf_of_child != np.arange(nlist)).any():
        print("scann: unexpected serialized partition layout; not measured", file=sys.stderr)
        return None
    return cent, tokens.astype(np.int64)


def soar_spill(base: np.ndarray, cent: np.ndarray, lists: np.ndarray, lam: float = SOAR_LAMBDA) -> np.ndarray:
    """A second list for every passage in the manner of SOAR (Sun et al., 2023): the list c' != c minimising
    ||x - c'||^2 + lam * <r, x - c'>^2 / ||r||^2, r = x - c, so the copy is filed where its residual is nearly
    orthogonal to the first one's (a query the first list scores badly is then scored well by the second)."""
    x = np.asarray(base, dtype=np.float32)
    out = np.empty(len(x), dtype=np.int64)
    csq = np.einsum("ij,ij->i", cent, cent)
    for s in range(0, len(x), 2048):
        xb, lb = x[s:s + 2048], lists[s:s + 2048]
        r = xb - cent[lb]
        rn = r / np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
        xc = xb @ cent.T
        d2 = np.einsum("ij,ij->i", xb, xb)[:, None] - 2 * xc + csq[None, :]
        proj = np.einsum("ij,ij->i", rn, xb)[:, None] - rn @ cent.T  # <r/|r|, x - c'>
        loss = d2 + lam * proj ** 2
        loss[np.arange(len(xb)), lb] = np.inf
        out[s:s + 2048] = np.argmin(loss, axis=1)
    return out


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


def partition_spread(ds: Dataset, gt: np.ndarray, nlist: int, scheme: str) -> dict | None:
    """How well lists probed in order of <query, centroid> hold a query's exact top-100 (ideal IVF: exact scores
    inside the probed lists): lists and share of the passages scanned to see 95 of them."""
    from fastdpr.index.kmeans import nearest

    base = np.ascontiguousarray(ds.base, dtype=np.float32)
    spill = None
    if scheme == "scann":
        got = scann_partition(base, nlist)
        if got is None:
            return None
        cent, lists = got
    else:
        settings = SCHEMES[scheme.removesuffix("+soar")]
        cent = centroids_of(base, nlist, **settings)
        lists = nearest(base, cent, max_inner_product=settings["spherical"])
        if scheme.endswith("+soar"):
            spill = soar_spill(base, cent, lists)
    sizes = np.bincount(lists, minlength=nlist) + (0 if spill is None else np.bincount(spill, minlength=nlist))
    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    order = np.argsort(-(q @ cent.T), axis=1, kind="stable")  # the probe order of an IVF search
    rank_of = np.empty_like(order)
    rank_of[np.arange(len(q))[:, None], order] = np.arange(nlist)[None, :]
    distinct, needed, scanned = [], [], []
    need_hits = int(np.ceil(COVER * K))
    for i in range(len(q)):
        holder = lists[gt[i, :K]]
        distinct.append(len(np.unique(holder)))
        first = rank_of[i, holder]
        if spill is not None:  # a passage is found in whichever of its two lists is probed first
            first = np.minimum(first, rank_of[i, spill[gt[i, :K]]])
        probe = int(np.sort(first)[need_hits - 1]) + 1  # probing this many lists covers 95% of the top-100
        needed.append(probe)
        scanned.append(sizes[order[i, :probe]].sum() / len(base))
    distinct, needed, scanned = np.array(distinct), np.array(needed), np.array(scanned)
    pct = lambda a, p: float(np.percentile(a, p))  # noqa: E731
    base_sizes = np.bincount(lists, minlength=nlist)
    return {"nlist": nlist, "scheme": scheme, "list_size_max/mean": float(base_sizes.max() / base_sizes.mean()),
            "empty_lists": int((base_sizes == 0).sum()), "copies_per_passage": 1 if spill is None else 2,
            "lists_holding_top100_median": pct(distinct, 50), "lists_holding_top100_p90": pct(distinct, 90),
            "nprobe_for_95pct_median": pct(needed, 50), "nprobe_for_95pct_p90": pct(needed, 90),
            "nprobe_for_95pct_mean": float(needed.mean()),
            "scanned_for_95pct_median": pct(scanned, 50), "scanned_for_95pct_p90": pct(scanned, 90),
            "scanned_for_95pct_mean": float(scanned.mean())}


def measure(ds: Dataset, nlists: list[int], scann_nlist: int) -> dict:
    t0 = time.perf_counter()
    gt = ground_truth(ds, K)
    parts = [partition_spread(ds, gt, nlist, scheme) for nlist in nlists
             for scheme in ("l2", "spherical", "l2-balanced", "l2-balanced+soar")]
    parts.append(partition_spread(ds, gt, scann_nlist, "scann"))
    out = {"dataset": ds.name, "n": ds.n, "dim": ds.dim, "queries": len(ds.queries), "description": ds.description,
           "passage_norms": norms(ds.base), "query_norms": norms(ds.queries), "anisotropy": anisotropy(ds.base),
           "partitions": [p for p in parts if p is not None]}
    print(f"{ds.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def calibration_rows(results: list[dict], nlist: int) -> list[dict]:
    """Each calibrated synthetic set against the real pool of its pooling, statistic by statistic."""
    rows = []
    for r in results:
        if not r["dataset"].startswith("synthetic-minilm-"):
            continue
        pooling = r["dataset"].split("-")[2]
        real = next(x for x in results if x["dataset"].startswith(f"real-minilm-{pooling}-"))
        checks = [(f"{what} norm {q}", real[f"{what}_norms"][q], r[f"{what}_norms"][q], TOLERANCE["norm"])
                  for what in ("passage", "query") for q in ("p5", "median", "p95")]
        for key, label in (("mean_length/mean_norm", "mean length / mean norm"),
                           ("pcs_for_90pct_variance", "PCs for 90% variance")):
            checks.append((label, real["anisotropy"][key], r["anisotropy"][key], TOLERANCE[label]))
        part = {p["scheme"]: p for p in r["partitions"] if p["nlist"] == nlist}["l2-balanced"]
        real_part = {p["scheme"]: p for p in real["partitions"] if p["nlist"] == nlist}["l2-balanced"]
        for q in ("median", "p90"):
            checks.append((f"nprobe to cover 95% of top-100, {q} ({nlist} l2-balanced lists)",
                           real_part[f"nprobe_for_95pct_{q}"], part[f"nprobe_for_95pct_{q}"], TOLERANCE["nprobe"]))
        for label, want, got, tol in checks:
            rows.append({"profile": r["dataset"], "statistic": label, "real": want, "synthetic": got,
                         "tolerance": f"{100 * tol:.0f}%", "within": "yes" if abs(got / want - 1) <= tol else "NO"})
    return rows


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
    scann_nlist = round(2 * np.sqrt(n))  # what benchmarks/ann_bench.py gives ScaNN
    nlists = ([default_nlist(n), scann_nlist] if args.nlist == "auto"
              else [int(v) for v in args.nlist.split(",")])
    sets = real + [synthetic(n, d, args.queries)] + [calibrated_synthetic(n, d, profile, args.queries)
                                                     for profile in ("minilm-mean", "minilm-cls")]
    results = [measure(ds, nlists, scann_nlist) for ds in sets]

    data_rows, part_rows = [], []
    for r in results:
        pn, qn, an = r["passage_norms"], r["query_norms"], r["anisotropy"]
        data_rows.append({"data": r["dataset"],
                          "passage norm p5/median/p95 (max/median)":
                              f"{pn['p5']:.2f}/{pn['median']:.2f}/{pn['p95']:.2f} ({pn['max/median']:.2f})",
                          "query norm p5/median/p95": f"{qn['p5']:.2f}/{qn['median']:.2f}/{qn['p95']:.2f}",
                          "mean length / mean norm": an["mean_length/mean_norm"],
                          "PCs for 90% variance": an["pcs_for_90pct_variance"]})
        for part in r["partitions"]:
            part_rows.append({
                "data": r["dataset"], "nlist": part["nlist"], "partition": part["scheme"],
                "lists holding top-100 (median / p90)":
                    f"{part['lists_holding_top100_median']:.0f} / {part['lists_holding_top100_p90']:.0f}",
                "nprobe to cover 95% of top-100 (median / p90 / mean)":
                    f"{part['nprobe_for_95pct_median']:.0f} / {part['nprobe_for_95pct_p90']:.0f} / "
                    f"{part['nprobe_for_95pct_mean']:.1f}",
                "% of passages scanned for 95% (median / p90 / mean)":
                    f"{100 * part['scanned_for_95pct_median']:.1f} / {100 * part['scanned_for_95pct_p90']:.1f} / "
                    f"{100 * part['scanned_for_95pct_mean']:.1f}",
                "largest list / mean": part["list_size_max/mean"]})
    body = (f"{n} x {d}, {args.queries} queries each; exact top-{K} by inner product.\n\n"
            + markdown_table(data_rows, list(data_rows[0])) + "\n\n"
            "Partitions: lists probed in order of <query, centroid>; an ideal IVF (exact scores inside the probed "
            "lists) probes lists until 95 of a query's true top-100 are among the candidates. 'nprobe' counts the "
            "lists it needs, '% scanned' the passages in them (the work a list scan does). "
            "l2: k-means (20 iterations, k-means++ seeding, every passage), passages filed under the nearest "
            "centroid; spherical: unit-norm centroids, filed by largest inner product (fastdpr IVF-PQ's default "
            "before balanced lists); l2-balanced: L2 k-means re-seeding lists under half the mean size (balance "
            "0.5, fastdpr IVF-PQ's default; both of these with the index's 64 training points per list); "
            f"+soar: each passage also filed under a second list chosen as in SOAR (lambda {SOAR_LAMBDA}; "
            "two copies, so twice the passages to scan per list); scann: the partition of ScaNN's k-means tree as "
            "benchmarks/ann_bench.py builds it (read from its serialized files).\n\n"
            + markdown_table(part_rows, list(part_rows[0])) + "\n")
    check = calibration_rows(results, nlists[0])
    if check:
        body += ("\nCalibrated profiles (fastdpr.index.synthetic.calibrated, fitted by "
                 "benchmarks/ann_fit_synthetic.py) against the real pool of their pooling, with the tolerances the "
                 "fit is held to:\n\n"
                 + markdown_table(check, list(check[0])) + "\n")
    write_results("ann_calibration", args.out, {"results": results, "calibration": check,
                                                "wall_s": round(time.perf_counter() - t0, 1)},
                  body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
