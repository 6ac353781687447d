"""IVF-PQ that compresses: 4-bit codes and positions in RAM, the fp16 re-rank vectors read through a memory map.

DPR's 21M x 768 passages as fp32 are 64.5 GB and as fp16 32.3 GB, more than a 24 GB machine holds. An IVF-PQ index
with ``m`` four-bit codes per vector keeps ``m / 2`` bytes of codes and a 4-byte position per vector in RAM
(m = 96 at d = 768, the default here: 52 bytes, 1.02 GiB for 21M; plus the lists' centroids, about 6 bytes per
vector at 1M); its fp16 vectors stay in the index file, memory-mapped by ``load_index(path, mmap=True)``, and a
search reads only the pages of its re-rank candidates. With ``sq=4`` (the default here) the file also holds every
vector as a 4-bit row (d / 2 bytes, csrc/sq4.h): the re-rank candidates are ranked by those first and only the best
``exact`` of them are read in fp16.

This benchmark builds ``ivfpq,nbits=4,m=<m>,store=fp16`` over ``--n`` vectors, saves it, and in a fresh process
opens it memory-mapped and measures:

- resident memory: the process's own memory growth (RssAnon: what the index costs in RAM) and the mapped file's
  pages resident at that moment (RssFile: the pages of the mapping the process has touched; the open reads the
  whole file once to verify its checksums, but drops each checked block from the resident set again);
- recall@100 and q/s over a sweep of nprobe x rerank x spread (the probe order, csrc/ivfpq.h) x exact (0: every
  candidate re-scored from fp16), 1 thread, all queries in one call, the best of ``--repeats`` timed runs;
- exact search (fastdpr flat, fp32 rows in RAM, 1 thread, the same queries in one call, the best of ``--repeats``)
  for the speed ratio.

    python benchmarks/ann_compressed.py                          # 1M x 768, calibrated to MiniLM mean pooling
    python benchmarks/ann_compressed.py --quick                  # 20k x 64, seconds
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import DEFAULT_OUT, markdown_table, write_results  # noqa: E402
from datasets import cache_dir, ground_truth  # noqa: E402

K = 100
TARGET = 0.95


def rss_kib() -> dict[str, int]:
    """RssAnon and RssFile of this process (Linux /proc/self/status), KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


def at_least(low: int):
    """An argparse type: an integer >= low."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value
    return parse


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(ids[i, :K], gt[i, :K])) / K for i in range(len(gt))]))


def dataset(args):
    import datasets

    if args.data == "mixture":
        return datasets.synthetic(args.n, args.dim, args.queries)
    profile = args.data.split(":", 1)[1] if ":" in args.data else args.data
    return datasets.calibrated_synthetic(args.n, args.dim, profile, args.queries)


def child(args) -> int:
    """Open the index memory-mapped, measure memory, run the sweep; print one JSON line."""
    from fastdpr.index import load_index

    queries = np.load(args.queries_file)
    gt = np.load(args.gt_file)
    gc.collect()
    before = rss_kib()
    t0 = time.perf_counter()
    index = load_index(args.index, mmap=True)
    open_s = time.perf_counter() - t0
    after_open = rss_kib()
    rows = []
    grid = [(r, p, s, e) for r in ints(args.rerank) for p in ints(args.nprobe) for s in floats(args.spread)
            for e in (ints(args.exact) if index.sq else [0])]
    for rerank, nprobe, spread, exact in grid:
        kw = dict(nprobe=nprobe, rerank=rerank, spread=spread, threads=1, **({"exact": exact} if index.sq else {}))
        index.search(queries[:10], K, **kw)
        dt = float("inf")
        for _ in range(args.repeats):  # the best of the timed runs: transient load on a small machine only slows
            t0 = time.perf_counter()
            _, ids = index.search(queries, K, **kw)
            dt = min(dt, time.perf_counter() - t0)
        rows.append({"nprobe": nprobe, "rerank": rerank, "spread": spread, "exact": exact,
                     "recall@100": recall(ids, gt), "qps": len(queries) / dt})
    after_search = rss_kib()
    # what the allocator keeps free for reuse (search scratch of earlier calls) given back first, where glibc's
    # malloc_trim exists: the memory the index and live data hold
    after_trim = None
    try:
        ctypes.CDLL(None).malloc_trim(0)
        after_trim = rss_kib()
    except (OSError, AttributeError):
        pass
    # the cheapest setting at the target, one query per call (latency-bound use: no batch to share the re-rank)
    single = None
    ok = [r for r in rows if r["recall@100"] >= TARGET]
    if ok and args.single_queries:
        r = max(ok, key=lambda r: r["qps"])
        kw = dict(nprobe=r["nprobe"], rerank=r["rerank"], spread=r["spread"], threads=1,
                  **({"exact": r["exact"]} if index.sq else {}))
        nq1 = min(args.single_queries, len(queries))
        dt = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for i in range(nq1):
                index.search(queries[i:i + 1], K, **kw)
            dt = min(dt, time.perf_counter() - t0)
        single = {**{k: r[k] for k in ("nprobe", "rerank", "spread", "exact")}, "queries": nq1, "qps": nq1 / dt}
    print(json.dumps({"open_s": open_s, "before": before, "after_open": after_open, "after_search": after_search,
                      "after_trim": after_trim, "single": single, "rows": rows}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--data", default="calibrated:minilm-mean",
                    help="calibrated:<profile> (fastdpr.index.synthetic profiles) or mixture (the old mixture)")
    ap.add_argument("--m", type=int, default=0, help="sub-quantizers (default: d/8 for 4-bit codes, 96 at d = 768: "
                                                   "48 bytes, which with 4-byte positions and the centroids stays "
                                                   "under 64 bytes per vector; d/16 for 8-bit codes)")
    ap.add_argument("--nbits", type=int, default=4, choices=(4, 8), help="bits per code")
    ap.add_argument("--extra", default="aniso=0.2,sq=4",
                    help="more spec parameters (default aniso=0.2: score-aware codes, which at 100k x 768 reached "
                         "recall@100 0.965 with rerank 1,000 where plain codes needed 2,000; sq=4: 4-bit rows for "
                         "a first re-rank)")
    ap.add_argument("--nlist", type=int, default=0, help="lists (default: the index's own)")
    ap.add_argument("--nprobe", default="64,128,256,512")
    ap.add_argument("--rerank", default="1000,2000,4000")
    ap.add_argument("--spread", default="0,0.5", help="probe orders: <q, c> + spread |q| s_l")
    ap.add_argument("--exact", default="0,200,300,500",
                    help="with sq=4: candidates re-scored from fp16 after the 4-bit rows (0: all)")
    ap.add_argument("--exact-queries", type=int, default=200, help="queries timed for exact search")
    ap.add_argument("--repeats", type=at_least(1), default=2, help="timed runs per setting (and of exact search); the best")
    ap.add_argument("--single-queries", type=at_least(0), default=200,
                    help="queries timed one per call at the cheapest setting reaching the target (0: none)")
    ap.add_argument("--exact-single-queries", type=at_least(0), default=20, help="queries timed one per call for exact search")
    ap.add_argument("--quick", action="store_true", help="20k x 64, 200 queries")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--queries-file", help=argparse.SUPPRESS)
    ap.add_argument("--gt-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.n, args.dim, args.queries, args.exact_queries = 20_000, 64, 200, 200
        args.nprobe, args.rerank, args.extra, args.exact = "4,8,16,32,256", "200,400,2000", "sq=4", "0,100"
    out = args.out or (cache_dir() / "quick-results" if args.quick else DEFAULT_OUT)
    m = args.m or max(1, args.dim // (8 if args.nbits == 4 else 16))
    while args.dim % m:  # sub-spaces of equal width
        m -= 1

    from threadpoolctl import threadpool_limits

    from fastdpr.index import build_index

    spec = f"ivfpq,nbits={args.nbits},m={m},store=fp16" + (f",nlist={args.nlist}" if args.nlist else "") + \
        (f",{args.extra}" if args.extra else "")
    with threadpool_limits(1):
        ds = dataset(args)
        gt = ground_truth(ds, K)
        base = np.asarray(ds.base, dtype=np.float32)
        exact = build_index(base, "flat")
        nq = min(args.exact_queries, len(ds.queries))
        exact.search(ds.queries[:2], K, threads=1)
        exact_s = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            exact.search(ds.queries[:nq], K, threads=1)
            exact_s = min(exact_s, time.perf_counter() - t0)
        exact_qps = nq / exact_s
        nq1 = min(args.exact_single_queries, len(ds.queries))
        exact_single_s = float("inf")
        for _ in range(args.repeats if nq1 else 0):
            t0 = time.perf_counter()
            for i in range(nq1):
                exact.search(ds.queries[i:i + 1], K, threads=1)
            exact_single_s = min(exact_single_s, time.perf_counter() - t0)
        exact_single_qps = nq1 / exact_single_s if nq1 else None
        del exact
        gc.collect()
        t0 = time.perf_counter()
        index = build_index(base, spec)
        build_s = time.perf_counter() - t0
    del base
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        tmp = Path(tmp)
        path = tmp / "index.fdpr"
        index.save(path)
        nlist = index.nlist
        del index
        gc.collect()
        np.save(tmp / "q.npy", np.ascontiguousarray(ds.queries, dtype=np.float32))
        np.save(tmp / "gt.npy", gt)
        cmd = [sys.executable, __file__, "--child", "--index", str(path), "--queries-file", str(tmp / "q.npy"),
               "--gt-file", str(tmp / "gt.npy"), "--nprobe", args.nprobe, "--rerank", args.rerank,
               "--spread", args.spread, "--exact", args.exact, "--repeats", str(args.repeats),
               "--single-queries", str(args.single_queries)]
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
                         .strip().splitlines()[-1])
        file_bytes = path.stat().st_size
    n = ds.n
    anon = (res["after_search"]["RssAnon"] - res["before"]["RssAnon"]) * 1024
    anon_open = (res["after_open"]["RssAnon"] - res["before"]["RssAnon"]) * 1024
    file_res = (res["after_search"]["RssFile"] - res["before"]["RssFile"]) * 1024
    trim = (res["after_trim"]["RssAnon"] - res["before"]["RssAnon"]) * 1024 if res["after_trim"] else None
    rows = sorted(res["rows"], key=lambda r: -r["qps"])
    for r in rows:
        r["x_exact"] = r["qps"] / exact_qps
    ok = [r for r in rows if r["recall@100"] >= TARGET]
    best = ok[0] if ok else None
    summary = {"n": n, "dim": ds.dim, "m": m, "nlist": nlist, "spec": spec, "build_s": build_s,
               "file_bytes": file_bytes, "vector_bytes_fp16": n * ds.dim * 2, "open_mmap_s": res["open_s"],
               "resident_anon_bytes_per_vector_after_open": anon_open / n,
               "resident_anon_bytes_per_vector_after_search": anon / n,
               "resident_anon_bytes_per_vector_after_trim": trim / n if trim is not None else None,
               "resident_file_MiB_after_search": file_res / 2**20, "exact_qps": exact_qps,
               "exact_single_qps": exact_single_qps, "single": res["single"], "best": best}
    lines = [
        f"{ds.description}; {n} x {ds.dim}, {len(ds.queries)} queries, top-{K}, 1 thread. Index `{spec}` "
        f"(nlist {nlist}), built in {build_s:.0f} s; file {file_bytes / 2**20:.0f} MiB, of which fp16 vectors "
        f"{n * ds.dim * 2 / 2**20:.0f} MiB. Opened with `load_index(path, mmap=True)` in a fresh process in "
        f"{res['open_s']:.2f} s.",
        "",
        f"- Resident memory of the process (RssAnon growth): **{anon_open / n:.1f} bytes/vector** after the open, "
        f"**{anon / n:.1f} bytes/vector** after the whole sweep ({anon / 2**20:.0f} MiB); mapped file pages "
        f"resident afterwards (RssFile growth, page cache): {file_res / 2**20:.0f} MiB."
        + (f" After the sweep and `malloc_trim(0)` (the allocator's free blocks, kept for reuse by the searches, "
           f"given back): **{trim / n:.1f} bytes/vector**." if trim is not None else ""),
        f"- Exact search (fastdpr flat, fp32 in RAM, {nq} queries in one call, best of {args.repeats}): "
        f"{exact_qps:.1f} q/s" + (f"; one query per call: {exact_single_qps:.1f} q/s." if exact_single_qps else "."),
    ]
    if best:
        lines.append(f"- Cheapest setting with recall@100 >= {TARGET}: nprobe {best['nprobe']}, rerank "
                     f"{best['rerank']}, spread {best['spread']}, exact {best['exact']}: recall "
                     f"{best['recall@100']:.3f} at {best['qps']:.0f} q/s, **{best['x_exact']:.1f}x exact search**.")
        one = res["single"]
        if one:
            lines.append(f"- One query per call (nprobe {one['nprobe']}, rerank {one['rerank']}, spread {one['spread']}, "
                         f"exact {one['exact']}; {one['queries']} queries): {one['qps']:.0f} q/s"
                         + (f", {one['qps'] / exact_single_qps:.1f}x exact search one query per call"
                            if exact_single_qps else "")
                         + ". Many queries in one call share the re-ranks: they visit their candidates' rows in "
                           "address order (csrc/ivfpq_rerank.cpp, rescore_batch).")
        plain = [r for r in ok if r["spread"] == 0 and r["exact"] == 0]
        if plain and plain[0] is not best:
            lines.append(f"- Without the spread-aware order and the 4-bit rows (spread 0, exact 0: every candidate "
                         f"read in fp16): nprobe {plain[0]['nprobe']}, rerank {plain[0]['rerank']}, recall "
                         f"{plain[0]['recall@100']:.3f} at {plain[0]['qps']:.0f} q/s, "
                         f"{plain[0]['x_exact']:.1f}x exact search.")
    else:
        lines.append(f"- No setting reached recall@100 {TARGET}.")
    per_vec = m * args.nbits / 8 + 4
    lines.append(f"- DPR's 21M x 768 at m = {m}: {per_vec:.0f} bytes/vector of codes and positions = "
                 f"{21e6 * per_vec / 2**30:.2f} GiB in RAM; fp16 vectors {21e6 * 768 * 2 / 2**30:.1f} GiB on disk, "
                 f"read through the page cache (fp32 in RAM would be {21e6 * 768 * 4 / 2**30:.1f} GiB); 4-bit rows "
                 f"{21e6 * 384 / 2**30:.1f} GiB, which the page cache of a 24 GB machine can hold.")
    load = os.getloadavg()
    lines.append(f"- Load average (1 / 5 / 15 min) at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on "
                 f"{os.cpu_count()} cores; the settings run one after another, so q/s under a changing "
                 f"load is noisy (exact search was timed first, before the build).")
    body = "\n".join(lines) + "\n\n" + markdown_table(rows, ["nprobe", "rerank", "spread", "exact", "recall@100", "qps", "x_exact"])
    name = "ann_compressed" + ("-quick" if args.quick else "")
    write_results(name, out, {**summary, "rows": rows, "memory": res}, body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
