"""ANN benchmark: recall@10/@100 against exact search vs queries/second (1 thread and all threads), build time and
bytes per vector, for fastdpr's Flat / HNSW / IVF-PQ against faiss (IndexFlatIP, IndexHNSWFlat IP, IVF-PQ with and
without an exact refine, IVF 4-bit fast scan with an exact refine, RaBitQ IVF fast scan at 1 and 4 bits with an exact
refine), hnswlib ('ip') and ScaNN (k-means tree, anisotropic 4-bit AH, exact float re-rank; with and without SOAR
spilling), sweeping ef / nprobe / rerank / k_factor / leaves / reorder. A peer
that is not installed is skipped with a message.

Commands (results go to benchmarks/results/ann_<dataset>.{json,md,png}):

    python benchmarks/ann_bench.py --n 100000 --dim 768               # synthetic 100k x 768
    python benchmarks/ann_bench.py --n 1000000 --dim 768 --data synthetic-minilm-mean   # calibrated to real vectors
    python benchmarks/ann_bench.py --n 1000000 --dim 384              # 1M x 384: long; resumable (rerun it)
    python benchmarks/ann_bench.py --vectors vectors/                 # real embeddings from `fastdpr encode`

    # the real passage pool (the quickstart's corpus, the packaged MiniLM, 1,000 NQ-open dev questions;
    # ann_data.py encodes it once), mean pooling and raw [CLS] into one file, benchmarks/results/ann_real.{json,md};
    # sweeps around recall@100 = 0.95 (measured with spherical IVF lists; with balanced L2 lists, the default since,
    # IVF-PQ needs 5-10% of its lists on mean pooling, so sweep nprobe from 16; benchmarks/ann_paired.py times the
    # cheapest settings of IVF-PQ, ScaNN and faiss fast scan in alternating blocks).
    # Each pooling can be measured by its own process first (--real-pool mean, --real-pool cls, same options,
    # --out elsewhere); the joint command then finds every row in the resumable state and only writes the file.
    python benchmarks/ann_bench.py --real-pool mean,cls --threads 1 --build-threads 1 --m 48 --repeats 1 \
        --methods fastdpr-flat,fastdpr-hnsw,fastdpr-ivfpq,faiss-flat,faiss-ivfpq-fastscan,hnswlib,scann \
        --ef 32,64,128,256 --nprobe 64,128,256 --rerank 400,1000 --k-factor 4,10 --leaves 32,64,128 --reorder 400,1000
    python benchmarks/ann_bench.py --quick                            # tiny smoke run (< 1 minute)

Every finished configuration is recorded in a state file under the cache directory and skipped when the same
command is run again (``--fresh`` starts over). The summary gives each method's q/s at its fastest measured
setting with recall@100 >= 0.95 (no interpolation) and compares fastdpr's fastest approximate index with every
peer and with exact search; the frontier of every method follows it.

How the synthetic mixture compares with real embeddings (``benchmarks/ann_calibrate.py``, results in
``ann_calibration.md`` in git at c97483c), measured on the real pool of that time (23,582 passages of the
earlier data sets) at equal N and d = 384 with 1,000 queries. The
mixture is far easier for partitioning than real vectors, so a result on it alone can mislead:

- lists holding a query's exact top-100 (k-means, 512 lists): median 8 for the mixture, 46 for MiniLM mean pooling,
  34 for raw [CLS]; an ideal IVF (exact scores in every probed list) must probe 7 of 512 lists (median) to see 95%
  of the top-100 on the mixture, but 114 (mean pooling) and 152 ([CLS]) on the real vectors -- 16-22x more; in
  passages scanned: 0.9% on the mixture, 3.3% (mean pooling) and 29% ([CLS]); with balanced L2 lists (fastdpr's
  IVF-PQ default) 6, 22 and 128 lists;
- norms: the mixture's passages and queries share one log-normal distribution (median 1.0, max/median 5.5);
  real passages are narrower (mean pooling max/median 3.7, [CLS] 1.3) and real questions are longer than the
  passages they look for (mean pooling: median 6.0 against 2.2), which a query drawn from the passage mixture
  never is;
- direction: the mean real [CLS] vector is 0.83 of the average length (every vector shares one direction; mean
  pooling 0.19, the mixture 0.10), while 90% of the variance spans 165-184 principal components (mixture 224).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import DEFAULT_OUT, markdown_table, write_results  # noqa: E402
from datasets import Dataset, cache_dir, calibrated_synthetic, ground_truth, real, synthetic  # noqa: E402

from fastdpr.index.synthetic import PROFILES  # noqa: E402

TARGET = 0.95
K = 100
ALL = os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------------------------
# methods: build() -> handle; search(handle, queries, k, threads, **sweep) -> ids; size(handle) -> bytes


class Method:
    def __init__(self, name: str, family: str, build: Callable[[np.ndarray], Any],
                 search: Callable[..., np.ndarray], size: Callable[[Any, int], float], sweep: list[dict],
                 build_params: dict):
        self.name, self.family, self.build, self.search, self.size = name, family, build, search, size
        self.sweep, self.build_params = sweep, build_params


def _file_bytes(save: Callable[[str], Any]) -> int:
    with tempfile.TemporaryDirectory(dir=cache_dir()) as d:
        path = os.path.join(d, "index.bin")
        save(path)
        return os.path.getsize(path)


def fastdpr_methods(cfg: dict) -> list[Method]:
    from fastdpr.index import build_index

    def build(spec):
        return lambda base: build_index(base, spec)

    def search(index, q, k, threads, **params):
        return index.search(q, k, threads=threads, **params)[1]

    def size(index, n):
        return _file_bytes(index.save) / n

    hnsw_spec = f"hnsw,M={cfg['M']},efc={cfg['efc']}"
    ivf_spec = f"ivfpq,nlist={cfg['nlist']},m={cfg['m']},fp16"
    # 4-bit fast-scan codes with score-aware codebooks (csrc/pq4.h, fastdpr/index/pq4.py)
    ivf4_spec = f"ivfpq,nbits=4,nlist={cfg.get('nlist4', cfg['nlist'])},m={cfg['m4']},fp16"
    return [
        Method("fastdpr-flat", "exact", build("flat"), search, size, [{}], {"spec": "flat"}),
        Method("fastdpr-hnsw", "hnsw", build(hnsw_spec), search, size,
               [{"ef": ef} for ef in cfg["ef"]], {"spec": hnsw_spec}),
        Method("fastdpr-ivfpq", "ivfpq", build(ivf_spec), search, size,
               [{"nprobe": p, "rerank": r} for r in cfg["rerank"] for p in cfg["nprobe"]], {"spec": ivf_spec}),
        Method("fastdpr-ivfpq4", "ivfpq", build(ivf4_spec), search, size,
               [{"nprobe": p, "rerank": r} for r in cfg["rerank"] for p in cfg["nprobe"]], {"spec": ivf4_spec}),
        # the same with score-aware (anisotropic, T = 0.2) codebooks and codes
        Method("fastdpr-ivfpq4-aniso", "ivfpq", build(ivf4_spec + ",aniso=0.2"), search, size,
               [{"nprobe": p, "rerank": r} for r in cfg["rerank"] for p in cfg["nprobe"]],
               {"spec": ivf4_spec + ",aniso=0.2"}),
    ]


def faiss_methods(cfg: dict) -> list[Method]:
    try:
        import faiss
    except ImportError:
        print("faiss not installed: skipping its methods", file=sys.stderr)
        return []
    IP = faiss.METRIC_INNER_PRODUCT

    def add_all(index, base):
        faiss.omp_set_num_threads(ALL)
        for s in range(0, len(base), 65536):
            index.add(np.ascontiguousarray(base[s:s + 65536], dtype=np.float32))
        return index

    def flat(base):
        return add_all(faiss.IndexFlatIP(base.shape[1]), base)

    def hnsw(base):
        index = faiss.IndexHNSWFlat(base.shape[1], cfg["M"], IP)
        index.hnsw.efConstruction = cfg["efc"]
        return add_all(index, base)

    def ivfpq(factory):
        def make(base):
            faiss.omp_set_num_threads(ALL)
            index = faiss.index_factory(base.shape[1], factory, IP)
            index.train(_train_sample(base, cfg["train"]))
            return add_all(index, base)
        return make

    def search(index, q, k, threads, ef=None, nprobe=None, k_factor=None):
        faiss.omp_set_num_threads(threads)
        if ef is not None:
            index.hnsw.efSearch = ef
        if nprobe is not None:
            faiss.extract_index_ivf(index).nprobe = nprobe
        if k_factor is not None:
            faiss.downcast_index(index).k_factor = k_factor
        return index.search(q, k)[1]

    def size(index, n):
        return faiss.serialize_index(index).nbytes / n

    pq = f"IVF{cfg['nlist']},PQ{cfg['m']}np"  # np: no polysemous training (search does not use it)
    # 4-bit fast scan (lookup tables held in SIMD registers) with an exact float re-rank of k_factor * k
    fs = f"IVF{cfg['nlist']},PQ{cfg['m_fs']}x4fs,RFlat"
    return [
        Method("faiss-flat", "exact", flat, search, size, [{}], {"factory": "IndexFlatIP"}),
        Method("faiss-hnsw", "hnsw", hnsw, search, size, [{"ef": ef} for ef in cfg["ef"]],
               {"factory": f"HNSW{cfg['M']},Flat IP", "efConstruction": cfg["efc"]}),
        Method("faiss-ivfpq", "ivfpq", ivfpq(pq), search, size, [{"nprobe": p} for p in cfg["nprobe"]],
               {"factory": pq}),
        Method("faiss-ivfpq-rflat", "ivfpq", ivfpq(pq + ",RFlat"), search, size,
               [{"nprobe": p, "k_factor": f} for f in cfg["k_factor"] for p in cfg["nprobe"]],
               {"factory": pq + ",RFlat"}),
        Method("faiss-ivfpq-fastscan", "ivfpq", ivfpq(fs), search, size,
               [{"nprobe": p, "k_factor": f} for f in cfg["k_factor"] for p in cfg["nprobe"]], {"factory": fs}),
    ] + [Method(name, "ivfpq", ivfpq(factory), search, size,
                [{"nprobe": p, "k_factor": f} for f in cfg["k_factor"] for p in cfg["nprobe"]], {"factory": factory})
         for name, factory in rabitq_factories(cfg, faiss)]


def rabitq_factories(cfg: dict, faiss) -> list[tuple[str, str]]:
    """RaBitQ IVF (1 bit a dimension, and 4 bits: 1 + 3 extra), fast scan, each with an exact float re-rank of
    k_factor * k, where the installed faiss has it (1.12 and later)."""
    if not hasattr(faiss, "IndexIVFRaBitQFastScan"):
        print("faiss has no IndexIVFRaBitQFastScan: skipping RaBitQ", file=sys.stderr)
        return []
    return [("faiss-ivf-rabitq-fs", f"IVF{cfg['nlist']},RaBitQfs,RFlat"),
            ("faiss-ivf-rabitq4-fs", f"IVF{cfg['nlist']},RaBitQfs4,RFlat")]


def scann_methods(cfg: dict) -> list[Method]:
    try:
        import scann
    except ImportError:
        print("scann not installed: skipping it (pip install scann)", file=sys.stderr)
        return []

    def builder(**spill):
        def build(base):
            base = np.ascontiguousarray(base, dtype=np.float32)
            # ScaNN's recipe for inner product: k-means tree, anisotropic 4-bit AH on 2-dimensional blocks
            # (threshold 0.2 as in its examples), then an exact float re-rank of the short list
            b = (scann.scann_ops_pybind.builder(base, K, "dot_product")
                 .tree(num_leaves=cfg["leaves_total"], num_leaves_to_search=cfg["leaves"][0],
                       training_sample_size=min(len(base), 250_000), **spill)
                 .score_ah(2, anisotropic_quantization_threshold=0.2)
                 .reorder(max(cfg["reorder"])))
            b.set_n_training_threads(ALL)
            return b.build()
        return build

    def search(searcher, q, k, threads, leaves, reorder):
        if threads == 1:  # the unbatched-parallel path runs on the calling thread only
            ids = searcher.search_batched(q, k, max(reorder, k), leaves)[0]
        else:
            searcher.set_num_threads(threads)
            ids = searcher.search_batched_parallel(q, k, max(reorder, k), leaves)[0]
        return np.asarray(ids, dtype=np.int64)

    def size(searcher, n):
        with tempfile.TemporaryDirectory(dir=cache_dir()) as d:
            searcher.serialize(d)
            return sum(p.stat().st_size for p in Path(d).iterdir()) / n

    leaves = [v for v in cfg["leaves"] if v <= cfg["leaves_total"]]
    grid = [{"leaves": v, "reorder": r} for r in cfg["reorder"] for v in leaves]
    settings = {"tree": {"num_leaves": cfg["leaves_total"]}, "score_ah": {"dims_per_block": 2,
                "anisotropic_quantization_threshold": 0.2}, "reorder": "float32"}
    # SOAR (spilling with orthogonality-amplified residuals): each datapoint also filed in a second leaf; lambda
    # 1.5 and over-retrieval 2 as in ScaNN's documentation
    soar = {"soar_lambda": 1.5, "overretrieve_factor": 2.0}
    return [Method("scann", "ivfpq", builder(), search, size, grid, settings),
            Method("scann-soar", "ivfpq", builder(**soar), search, size, grid,
                   {**settings, "tree": {**settings["tree"], **soar}})]


def hnswlib_methods(cfg: dict) -> list[Method]:
    try:
        import hnswlib
    except ImportError:
        print("hnswlib not installed: skipping it", file=sys.stderr)
        return []

    def build(base):
        index = hnswlib.Index(space="ip", dim=base.shape[1])
        index.init_index(max_elements=len(base), ef_construction=cfg["efc"], M=cfg["M"], random_seed=100)
        for s in range(0, len(base), 65536):
            index.add_items(np.ascontiguousarray(base[s:s + 65536], dtype=np.float32), num_threads=ALL)
        return index

    def search(index, q, k, threads, ef):
        index.set_ef(max(ef, k))
        return index.knn_query(q, k=k, num_threads=threads)[0].astype(np.int64)

    def size(index, n):
        return _file_bytes(index.save_index) / n

    # hnswlib's M means what faiss's does (M links per upper layer, 2M on level 0)
    return [Method("hnswlib", "hnsw", build, search, size, [{"ef": ef} for ef in cfg["ef"]],
                   {"space": "ip", "M": cfg["M"], "ef_construction": cfg["efc"]})]


def _train_sample(base: np.ndarray, n: int) -> np.ndarray:
    if len(base) <= n:
        return np.ascontiguousarray(base, dtype=np.float32)
    rows = np.sort(np.random.default_rng(0).choice(len(base), n, replace=False))
    return np.ascontiguousarray(base[rows], dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------
# measurement


def timed_search(method: Method, handle, q: np.ndarray, threads: int, params: dict, repeats: int):
    method.search(handle, q[: min(len(q), 32)], K, threads, **params)  # warm caches and thread pools
    times, ids = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids = method.search(handle, q, K, threads, **params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), ids


def config_key(ds: Dataset, method: Method, params: dict, threads: int) -> str:
    return json.dumps([ds.name, len(ds.queries), method.name, method.build_params, params, threads], sort_keys=True)


def run_method(method: Method, ds: Dataset, gt: np.ndarray, threads_list: list[int], repeats: int,
               state: dict, state_path: Path) -> list[dict]:
    todo = [(p, t) for p in method.sweep for t in threads_list if config_key(ds, method, p, t) not in state]
    rows = [state[config_key(ds, method, p, t)] for p in method.sweep for t in threads_list
            if config_key(ds, method, p, t) in state]
    if not todo:
        print(f"  {method.name}: all {len(rows)} configurations cached")
        return rows
    from fastdpr.index.synthetic import recall_at

    print(f"  {method.name}: building {method.build_params}", flush=True)
    t0 = time.perf_counter()
    handle = method.build(ds.base)
    build_s = time.perf_counter() - t0
    bpv = method.size(handle, ds.n)
    print(f"    built in {build_s:.1f} s, {bpv:.0f} bytes/vector", flush=True)
    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    for params, threads in todo:
        sec, ids = timed_search(method, handle, q, threads, params, repeats)
        row = {"method": method.name, "family": method.family, **{f"p_{k}": v for k, v in params.items()},
               "params": params, "threads": threads, "qps": len(q) / sec,
               "recall@10": recall_at(ids, gt, 10), "recall@100": recall_at(ids, gt, 100),
               "build_s": build_s, "bytes_per_vector": bpv, "build_params": method.build_params,
               "measured_at": time.time()}
        print(f"    {params} threads={threads}: {row['qps']:.0f} q/s  recall@10 {row['recall@10']:.4f}  "
              f"recall@100 {row['recall@100']:.4f}", flush=True)
        state[config_key(ds, method, params, threads)] = row
        _save_state(state_path, state)
        rows.append(row)
    del handle
    return rows


def _save_state(path: Path, state: dict) -> None:
    from fastdpr.atomic import write_json

    write_json(path, {"rows": state}, indent=None)


# ---------------------------------------------------------------------------------------------------------------
# summary


def frontier(rows: list[dict]) -> list[dict]:
    """Pareto frontier (recall@100 up, QPS down): points no other point beats on both."""
    pts = sorted(rows, key=lambda r: (-r["qps"], -r["recall@100"]))
    out, best = [], -1.0
    for r in pts:
        if r["recall@100"] > best:
            out.append(r)
            best = r["recall@100"]
    return sorted(out, key=lambda r: r["recall@100"])


def qps_at(rows: list[dict], target: float = TARGET) -> float | None:
    """QPS at recall@100 = target, linearly interpolated between the frontier points around it (no
    extrapolation: a method whose fastest point already exceeds the target gets that point's QPS)."""
    f = frontier(rows)
    for i, r in enumerate(f):
        if r["recall@100"] >= target:
            if i == 0:
                return r["qps"]
            lo = f[i - 1]
            w = (target - lo["recall@100"]) / (r["recall@100"] - lo["recall@100"])
            return lo["qps"] + w * (r["qps"] - lo["qps"])
    return None


def first_at(rows: list[dict], target: float = TARGET) -> dict | None:
    """The fastest measured setting with recall@100 >= target (a measured point, no interpolation)."""
    ok = [r for r in rows if r["recall@100"] >= target]
    return max(ok, key=lambda r: r["qps"]) if ok else None


def _params(row: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in row["params"].items()) or "-"


def summarise(rows: list[dict], threads_list: list[int]) -> tuple[list[str], dict]:
    """Per thread count: each method's fastest measured setting at recall@100 >= TARGET, fastdpr's best
    approximate index against every peer, and each method's frontier."""
    lines, data = [], {}
    for threads in threads_list:
        sub = [r for r in rows if r["threads"] == threads]
        by = {}
        for r in sub:
            by.setdefault(r["method"], []).append(r)
        first = {m: first_at(rs) for m, rs in by.items()}
        at = {m: (r["qps"] if r else None) for m, r in first.items()}
        maxrec = {m: max(r["recall@100"] for r in rs) for m, rs in by.items()}
        data[threads] = {"qps_at_target": at, "setting_at_target": {m: r and r["params"] for m, r in first.items()},
                         "qps_interpolated_at_target": {m: qps_at(rs) for m, rs in by.items()},
                         "max_recall@100": maxrec,
                         "frontier": {m: [{"params": r["params"], "recall@100": r["recall@100"], "qps": r["qps"]}
                                          for r in frontier(rs)] for m, rs in by.items()}}
        lines.append(f"threads={threads}: q/s at the fastest measured setting with recall@100 >= {TARGET}")
        for m in sorted(by):
            r = first[m]
            lines.append(f"  {m:24s} " + (f"{r['qps']:8.0f} q/s  recall@100 {r['recall@100']:.4f}  ({_params(r)})"
                                          if r else f"   never (best recall@100 {maxrec[m]:.4f})"))
        ours = {m: v for m, v in at.items() if m.startswith("fastdpr-") and m != "fastdpr-flat" and v}
        if not ours:
            lines.append(f"  no fastdpr approximate index reached recall@100 >= {TARGET}")
            continue
        best = max(ours, key=ours.get)
        lines.append(f"  fastdpr best: {best} {ours[best]:.0f} q/s")
        for m in sorted(by):
            if m.startswith("fastdpr-") and m != "fastdpr-flat":
                continue
            if at[m] is None:
                lines.append(f"    vs {m}: peer never reaches recall@100 {TARGET} (best {maxrec[m]:.4f})")
            else:
                what = "exact search" if by[m][0]["family"] == "exact" else "at recall@100 >= target"
                lines.append(f"    vs {m} ({what}): {ours[best] / at[m]:.2f}x  ({ours[best]:.0f} vs {at[m]:.0f} q/s)")
    return lines, data


def frontier_tables(rows: list[dict], threads_list: list[int]) -> str:
    out = []
    for threads in threads_list:
        for m in sorted({r["method"] for r in rows if r["threads"] == threads}):
            f = frontier([r for r in rows if r["threads"] == threads and r["method"] == m])
            out.append(f"- {m}, {threads} thread{'s' if threads > 1 else ''}: "
                       + "; ".join(f"{r['recall@100']:.3f} at {r['qps']:.0f} q/s ({_params(r)})" for r in f))
    return "\n".join(out) + "\n"


def plot(rows: list[dict], threads_list: list[int], title: str, path: Path) -> None:
    from fastdpr.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(threads_list), figsize=(6.5 * len(threads_list), 5), squeeze=False)
    for ax, threads in zip(axes[0], threads_list):
        methods = sorted({r["method"] for r in rows if r["threads"] == threads})
        for m in methods:
            f = frontier([r for r in rows if r["threads"] == threads and r["method"] == m])
            style = "-o" if m.startswith("fastdpr") else "--s"
            ax.plot([r["recall@100"] for r in f], [r["qps"] for r in f], style, label=m, markersize=4)
        ax.axvline(TARGET, color="grey", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("recall@100 vs exact search")
        ax.set_ylabel("queries / second")
        ax.set_title(f"{title}, {threads} thread{'s' if threads > 1 else ''}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------


def configs(args, ds: Dataset) -> dict:
    n, d = ds.n, ds.dim
    from fastdpr.index.ivfpq import default_m, default_nlist

    # m = d/16 (16-dimensional sub-vectors): with an exact re-rank behind it, a coarser code is as good at
    # recall@100 = 0.95 as d/8 and scans twice as fast (measured on the 100k x 768 mixture).
    m = min(range(1, d + 1), key=lambda c: (d % c != 0, abs(c - d / 16)))
    cfg = {"M": 32, "efc": 100, "ef": [64, 128, 256, 512], "nlist": default_nlist(n), "m": m,
           "nprobe": [12, 16, 32], "rerank": [0, 150, 200, 300], "k_factor": [1.5, 2.0, 3.0],
           "train": min(n, 256 * default_nlist(n)),
           # ScaNN: about 2 sqrt(n) leaves (its documented starting point); fast scan: 2 dimensions per 4-bit code,
           # the same code size as ScaNN's AH
           "leaves_total": max(1, round(2 * math.sqrt(n))), "leaves": [4, 8, 16, 32, 64, 128],
           "reorder": [200, 400, 1000], "m_fs": max(1, d // 2), "m4": default_m(d, 2),
           "nlist4": default_nlist(n, 4)}
    if args.quick:
        cfg.update(M=16, efc=64, ef=[100, 200], nprobe=[4, 16], rerank=[0, 300], k_factor=[3.0], leaves=[4, 16],
                   reorder=[300])
    for key in ("M", "efc", "nlist", "m", "leaves_total", "m_fs", "m4"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.nlist is not None:  # one list count asked for: every IVF index gets it
        cfg["nlist4"] = args.nlist
    for key, cast in (("ef", int), ("nprobe", int), ("rerank", int), ("k_factor", float), ("leaves", int),
                      ("reorder", int)):
        if getattr(args, key) is not None:
            cfg[key] = [cast(v) for v in getattr(args, key).split(",")]
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--data", default="synthetic",
                    choices=("synthetic", *(f"synthetic-{name}" for name in PROFILES)),
                    help="generated data at --n x --dim: the plain mixture, or calibrated to MiniLM mean pooling / "
                         "[CLS] (benchmarks/ann_fit_synthetic.py)")
    ap.add_argument("--vectors", type=Path, help="a `fastdpr encode` output directory (real embeddings)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run (< 1 minute)")
    ap.add_argument("--methods", default="", help="comma-separated subset, e.g. fastdpr-ivfpq,faiss-ivfpq")
    ap.add_argument("--threads", default="1,all", help="thread counts to measure ('all' = every core)")
    ap.add_argument("--build-threads", dest="build_threads", type=int,
                    help="threads for building every index ('all' in --threads means this too; default: every core)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (median reported)")
    ap.add_argument("--M", type=int)
    ap.add_argument("--efc", type=int)
    ap.add_argument("--nlist", type=int)
    ap.add_argument("--m", type=int)
    ap.add_argument("--ef", help="comma-separated ef sweep (HNSW)")
    ap.add_argument("--nprobe", help="comma-separated nprobe sweep (IVF)")
    ap.add_argument("--rerank", help="comma-separated rerank sweep (fastdpr IVF-PQ)")
    ap.add_argument("--k-factor", dest="k_factor", help="comma-separated k_factor sweep (faiss IVF-PQ + RFlat)")
    ap.add_argument("--leaves-total", dest="leaves_total", type=int, help="ScaNN tree leaves (default 2 sqrt(n))")
    ap.add_argument("--leaves", help="comma-separated leaves_to_search sweep (ScaNN)")
    ap.add_argument("--reorder", help="comma-separated pre-reorder candidates sweep (ScaNN)")
    ap.add_argument("--m-fs", dest="m_fs", type=int, help="faiss fast-scan sub-quantizers (default dim / 2)")
    ap.add_argument("--m4", type=int, help="fastdpr 4-bit IVF-PQ (fastdpr-ivfpq4) sub-quantizers (default dim / 2)")
    ap.add_argument("--real-pool", dest="real_pool",
                    help="mean, cls or mean,cls: the packaged MiniLM over the real passage pool with NQ-open questions "
                         "(benchmarks/ann_data.py); two poolings go to one results file, ann_<--name or real>")
    ap.add_argument("--name", help="results file name after 'ann_' (default: the dataset's name)")
    ap.add_argument("--out", type=Path, help=f"results directory (default {DEFAULT_OUT}; --quick: the cache)")
    ap.add_argument("--fresh", action="store_true", help="ignore configurations cached by earlier runs")
    ap.add_argument("--redo", default="", help="comma-separated methods whose cached configurations are re-measured")
    args = ap.parse_args(argv)

    global ALL
    if args.quick:  # one thread throughout: a smoke run must not depend on how busy the machine is
        args.n, args.dim, args.queries, args.repeats, args.threads = 5000, 64, 200, 1, "1"
        args.build_threads = 1
    if args.build_threads:
        # read by each OpenMP runtime when its library loads (below): fastdpr's default thread count, BLAS
        os.environ["OMP_NUM_THREADS"] = str(args.build_threads)
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.build_threads)
        ALL = args.build_threads
    out = args.out or (cache_dir() / "quick-results" if args.quick else DEFAULT_OUT)
    threads_list = sorted({ALL if t == "all" else int(t) for t in args.threads.split(",")})

    t0 = time.perf_counter()
    if args.real_pool:
        from ann_data import real_pool

        poolings = args.real_pool.split(",")
        bad = [p for p in poolings if p not in ("mean", "cls")]
        if bad:
            ap.error(f"--real-pool takes mean, cls or mean,cls; got {args.real_pool!r}")
        loaders = [lambda p=p: real_pool(p, args.queries) for p in poolings]
    elif args.vectors:
        loaders = [lambda: real(args.vectors, args.queries)]
    else:
        loaders = [lambda: synthetic(args.n, args.dim, args.queries) if args.data == "synthetic" else
                   calibrated_synthetic(args.n, args.dim, args.data.removeprefix("synthetic-"), args.queries)]

    sections = []
    for load in loaders:
        ds = load()
        sections.append(run_dataset(ds, args, ap, threads_list, out))
    if len(sections) == 1:
        name, (section, body) = sections[0]["name"], sections[0]["result"]
        payload = {**section, "threads": threads_list}
    else:
        name = "ann_" + (args.name or "real")
        payload = {"datasets": [s["result"][0] for s in sections], "threads": threads_list}
        body = "".join(f"## {s['result'][0]['dataset']['name']}\n\n" + s["result"][1] + "\n" for s in sections)
    if args.name and len(sections) == 1:
        name = "ann_" + args.name
    payload["wall_s"] = round(time.perf_counter() - t0, 1)
    body = f"Wall time of the whole command: {payload['wall_s']:.0f} s.\n\n" + body
    path = write_results(name, out, payload, body)
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return 0


def run_dataset(ds: Dataset, args, ap, threads_list: list[int], out: Path) -> dict:
    t0 = time.perf_counter()
    gt = ground_truth(ds, K)
    print(f"{ds.name}: {ds.n} x {ds.dim}, {len(ds.queries)} queries ({ds.description}); "
          f"data + ground truth {time.perf_counter() - t0:.1f} s", flush=True)
    cfg = configs(args, ds)
    methods = fastdpr_methods(cfg) + faiss_methods(cfg) + hnswlib_methods(cfg) + scann_methods(cfg)
    if args.methods:
        wanted = set(args.methods.split(","))
        unknown = wanted - {m.name for m in methods}
        if unknown:
            ap.error(f"unknown methods {sorted(unknown)}; known: {[m.name for m in methods]}")
        methods = [m for m in methods if m.name in wanted]

    tag = f"{ds.name}{'-quick' if args.quick else ''}"
    state_path = cache_dir() / "ann_state" / f"{tag}-q{len(ds.queries)}.json"
    state = {} if args.fresh or not state_path.exists() else json.loads(state_path.read_text())["rows"]
    redo = set(filter(None, args.redo.split(",")))
    state = {key: row for key, row in state.items() if row["method"] not in redo}
    rows = []
    for method in methods:
        rows += run_method(method, ds, gt, threads_list, args.repeats, state, state_path)

    lines, summary = summarise(rows, threads_list)
    print("\n".join(lines))
    name = f"ann_{tag}"
    from fastdpr.errors import MissingDependency

    picture = out / f"ann_{args.name}-{ds.name}.png" if args.name else out / f"{name}.png"
    try:
        plot(rows, threads_list, f"{ds.name} ({ds.n} x {ds.dim})", picture)
    except MissingDependency as err:  # the measurements are worth keeping without their picture
        print(f"no plot: {err}", file=sys.stderr)
    columns = ["method", "params", "threads", "qps", "recall@10", "recall@100", "build_s", "bytes_per_vector"]
    table_rows = [{**r, "params": _params(r)}
                  for r in sorted(rows, key=lambda r: (r["threads"], r["method"], -r["qps"]))]
    body = (f"Data: {ds.description}; {ds.n} x {ds.dim}, {len(ds.queries)} queries, top-{K}; recall against exact "
            f"inner-product search (numpy BLAS ground truth). QPS = queries / median wall time of {args.repeats} "
            f"run(s) over all queries at the given thread count; build time with {ALL} threads; bytes/vector = "
            f"serialized index size / n. Configurations measured by earlier runs of the same command (the resumable "
            f"state; `--redo` re-measures a method) are reused, so rows may come from several runs.\n"
            f"Build settings: {json.dumps(cfg)}\n\n"
            f"### Summary (QPS at the fastest measured setting with recall@100 >= {TARGET})\n\n```\n"
            + "\n".join(lines) + f"\n```\n\n![recall vs QPS]({picture.name})\n\n"
            f"### Frontiers (recall@100 at q/s, setting; points no other setting of the method beats on both)\n\n"
            + frontier_tables(rows, threads_list) + "\n### All configurations\n\n"
            + markdown_table(table_rows, columns))
    stamps = [r["measured_at"] for r in rows if "measured_at" in r]
    if stamps:  # rows reused from the resumable state were measured by earlier runs: say over how long
        first = time.strftime("%Y-%m-%d %H:%M", time.gmtime(min(stamps)))
        last = time.strftime("%Y-%m-%d %H:%M", time.gmtime(max(stamps)))
        body = f"Rows measured between {first} and {last} UTC.\n\n" + body
    section = {"dataset": {"name": ds.name, "n": ds.n, "dim": ds.dim, "queries": len(ds.queries),
                           "description": ds.description}, "config": cfg,
               "summary_lines": lines, "summary": {str(t): v for t, v in summary.items()}, "rows": rows,
               "seconds": round(time.perf_counter() - t0, 1)}
    return {"name": name, "result": (section, body)}

if __name__ == "__main__":
    raise SystemExit(main())
