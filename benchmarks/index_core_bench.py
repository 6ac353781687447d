"""Exact and HNSW search of fastdpr side by side with faiss (IndexFlatIP, IndexHNSWFlat IP) and hnswlib, on the
synthetic non-normalised Gaussian mixture. Prints medians of repeated runs, thread count and the command.

    python benchmarks/index_core_bench.py flat --n 50000 --dim 768 --nq 1000 --threads 1
    python benchmarks/index_core_bench.py hnsw --n 50000 --dim 384 --M 16 --efc 200 --ef 100,200,400
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model  # noqa: E402

CLOCK = time.perf_counter


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = CLOCK()
        fn()
        times.append(CLOCK() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["flat", "hnsw"])
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--efc", type=int, default=200)
    ap.add_argument("--ef", default="100,200,400")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process CPU clock (1 thread on a shared machine: other load then counts less)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    # fastdpr and faiss each bring an OpenMP runtime; with the default (active) waiting, one library's idle threads
    # spin on the cores the other's threads need after every call, which halved fastdpr's 2-thread speed here
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

    import faiss

    from fastdpr.index import build_index
    from fastdpr.index.flat import exact_search
    from fastdpr.index.synthetic import gaussian_mixture, recall_at

    faiss.omp_set_num_threads(args.threads)
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cpus, threads={args.threads}, "
          f"clock: {'process CPU time' if args.cpu_time else 'wall'}, load average {os.getloadavg()[0]:.1f}")
    x, q = gaussian_mixture(args.n, args.dim, n_queries=args.nq, seed=1)

    if args.what == "flat":
        spec = "flat,fp16" if args.fp16 else "flat"
        ours = build_index(x, spec)
        ref = faiss.IndexFlatIP(args.dim)
        ref.add(x)
        for nq in (1, 16, args.nq):
            qq = q[:nq]
            t_ours = median_time(lambda: ours.search(qq, args.k, threads=args.threads), args.repeats)
            t_faiss = median_time(lambda: ref.search(qq, args.k), args.repeats)
            print(f"{spec:10s} nq={nq:5d}: fastdpr {nq / t_ours:9.1f} q/s   faiss IndexFlatIP {nq / t_faiss:9.1f} q/s"
                  f"   ratio {t_faiss / t_ours:.2f}x")
        return

    import hnswlib

    truth = exact_search(x, q, args.k)[1]
    efs = [int(e) for e in args.ef.split(",")]
    t = time.perf_counter()
    ours = build_index(x, f"hnsw,M={args.M},efc={args.efc}" + (",fp16" if args.fp16 else ""))
    print(f"fastdpr hnsw build {time.perf_counter() - t:.1f} s (M={args.M}, efc={args.efc})")
    t = time.perf_counter()
    hl = hnswlib.Index(space="ip", dim=args.dim)
    hl.init_index(max_elements=args.n, ef_construction=args.efc, M=args.M)
    hl.set_num_threads(max(1, os.cpu_count() or 1))
    hl.add_items(x)
    hl.set_num_threads(args.threads)
    print(f"hnswlib build {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    fh = faiss.IndexHNSWFlat(args.dim, args.M, faiss.METRIC_INNER_PRODUCT)
    fh.hnsw.efConstruction = args.efc
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    fh.add(x)
    faiss.omp_set_num_threads(args.threads)
    print(f"faiss hnsw build {time.perf_counter() - t:.1f} s")
    for ef in efs:
        res = {}
        res["fastdpr"] = (lambda: ours.search(q, args.k, ef=ef, threads=args.threads))
        hl.set_ef(ef)
        res["hnswlib"] = (lambda: hl.knn_query(q, args.k)[0].astype(np.int64), None)
        fh.hnsw.efSearch = ef
        res["faiss"] = (lambda: fh.search(q, args.k)[1], None)
        for name, fn in res.items():
            fn = fn[0] if isinstance(fn, tuple) else fn
            out = fn()
            ids = out[1] if isinstance(out, tuple) else out
            secs = median_time(fn, args.repeats)
            print(f"ef={ef:4d} {name:8s} recall@10 {recall_at(ids, truth, 10):.3f} recall@100 "
                  f"{recall_at(ids, truth, 100):.3f}  {args.nq / secs:8.1f} q/s")


if __name__ == "__main__":
    main()
