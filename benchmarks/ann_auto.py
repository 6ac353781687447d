"""``auto`` + ``tune`` against the best setting of a full sweep and against ScaNN, on held-out queries, 1 thread.

For each data set: the index ``build_index(base, "auto")`` chooses is built, ``index.tune`` picks its settings on
the first half of the queries (target recall@100 0.95; exact ids as truth), and the second half, held out, measures
what that gives: recall@100 and q/s with no parameter set by hand. The same index is then swept over a grid of
nprobe x rerank on the held-out queries (the best setting is chosen knowing their recall: an oracle, the bound tune
aims at), and ScaNN (k-means tree, anisotropic 4-bit AH, float re-rank; as in ann_bench.py) is swept likewise when
it is installed. The fastest setting of each reaching 0.95 is then timed side by side with auto + tune, in
alternating rounds, so their ratio is not skewed by a changing load. ``--crossover`` also times exact search
against tuned 4-bit IVF-PQ at small n, where ``auto`` switches from one to the other.

    python benchmarks/ann_auto.py                                   # calibrated 100k x 384 (mean profile)
    python benchmarks/ann_auto.py --sets synthetic-minilm-mean:100000x384,real-mean,real-cls --crossover 5000,10000,20000

Real sets (``real-mean``, ``real-cls``: the MiniLM pool of ann_data.py) are measured only when the published QA
files are at hand (``fastdpr data fetch``); otherwise they are skipped with the reason in the report.
Results: benchmarks/results/ann_auto.{json,md}.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, write_results  # noqa: E402
from datasets import calibrated_synthetic, ground_truth, synthetic  # noqa: E402

TARGET = 0.95
K = 100
THREADS = 1
NPROBE = [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
RERANK = [200, 300, 400, 600, 1000, 1500]
LEAVES = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
REORDER = [200, 400, 1000]


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    from fastdpr.index.tune import recall_at

    return recall_at(np.asarray(ids, np.int64), gt[:, :K])


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def load_set(name: str, n_queries: int):
    """(Dataset, reason): a calibrated set ``synthetic-<profile>:<n>x<d>``, the DPR-like Gaussian mixture
    ``mixture:<n>x<d>`` (ann_bench's ``--data synthetic``) or a real pool ``real-mean|real-cls``."""
    if name.startswith("real-"):
        import ann_data

        from fastdpr.errors import DataUnavailable

        try:
            return ann_data.real_pool(name.split("-", 1)[1], n_queries), ""
        except DataUnavailable as err:
            return None, f"skipped: the real pool needs the published QA files: {err}"
    profile, size = name.split(":")
    n, d = (int(v) for v in size.split("x"))
    if profile == "mixture":
        return synthetic(n, d, n_queries=n_queries), ""
    return calibrated_synthetic(n, d, profile.removeprefix("synthetic-"), n_queries=n_queries), ""


def sweep_fastdpr(index, q, gt) -> list[dict]:
    if not hasattr(index, "nlist"):
        return []  # `auto` chose exact search: nothing to sweep
    rows = []
    for rerank in RERANK:
        for nprobe in NPROBE:
            if nprobe > index.nlist:
                continue
            params = {"nprobe": nprobe, "rerank": rerank}
            if getattr(index, "sq", 0):
                params["exact"] = "auto"
            start = time.perf_counter()
            ids = index.search(q, K, threads=THREADS, **params)[1]
            t = time.perf_counter() - start
            rows.append({**params, "recall": recall(ids, gt), "qps": len(q) / t})
            if rows[-1]["recall"] > 0.995:
                break  # deeper probes of this re-rank only cost more
    return rows


def scann_searcher(base: np.ndarray):
    try:
        import scann
    except ImportError:
        return None
    n = len(base)
    builder = (scann.scann_ops_pybind.builder(np.ascontiguousarray(base, dtype=np.float32), K, "dot_product")
               .tree(num_leaves=max(1, round(2 * math.sqrt(n))), num_leaves_to_search=LEAVES[0],
                     training_sample_size=min(n, 250_000))
               .score_ah(2, anisotropic_quantization_threshold=0.2)
               .reorder(max(REORDER)))
    return builder.build()


def scann_search(searcher, q, leaves, reorder):
    return np.asarray(searcher.search_batched(q, K, max(reorder, K), leaves)[0], dtype=np.int64)


def sweep_scann(searcher, q, gt) -> list[dict]:
    rows = []
    for reorder in REORDER:
        for leaves in LEAVES:
            start = time.perf_counter()
            ids = scann_search(searcher, q, leaves, reorder)
            t = time.perf_counter() - start
            rows.append({"leaves": leaves, "reorder": reorder, "recall": recall(ids, gt), "qps": len(q) / t})
            if rows[-1]["recall"] > 0.995:
                break
    return rows


def fastest(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["recall"] >= TARGET]
    return max(ok, key=lambda r: r["qps"]) if ok else None


def side_by_side(contenders: dict, rounds: int) -> dict[str, float]:
    """q/s of each contender (name -> callable searching the held-out queries), best of ``rounds`` alternating
    rounds."""
    best = {name: math.inf for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            best[name] = min(best[name], seconds(fn))
    return best


def run_set(ds, args) -> dict:
    from fastdpr.index import build_index
    from fastdpr.index.auto import choose_index

    base = ds.base
    gt = ground_truth(ds, K)
    half = len(ds.queries) // 2
    q_tune, q_held = (np.ascontiguousarray(ds.queries[:half], np.float32),
                      np.ascontiguousarray(ds.queries[half:], np.float32))
    gt_tune, gt_held = gt[:half], gt[half:]
    choice = choose_index(ds.n, ds.dim)
    print(f"{ds.name}: auto -> {choice.spec}", flush=True)
    t0 = time.perf_counter()
    index = build_index(np.asarray(base, dtype=np.float32), "auto")
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tuned = index.tune(q_tune, target_recall=TARGET, k=K, truth=gt_tune, threads=THREADS)
    tune_s = time.perf_counter() - t0
    print(f"  tuned in {tune_s:.1f} s: {tuned.params} (chosen {tuned.chosen}) recall {tuned.recall:.4f}", flush=True)
    held_ids = index.search(q_held, K, threads=THREADS)[1]
    out = {"set": ds.name, "n": ds.n, "dim": ds.dim, "description": ds.description, "auto_spec": choice.spec,
           "build_s": build_s, "tune_s": tune_s, "tuned": tuned.params, "tune_evaluations": tuned.evaluations,
           "tune_recall": tuned.recall, "tune_chosen": tuned.chosen, "held_recall": recall(held_ids, gt_held),
           "tune_candidates": tuned.candidates}
    contenders = {"auto+tune": lambda: index.search(q_held, K, threads=THREADS)}
    sweep = sweep_fastdpr(index, q_held, gt_held)
    best = fastest(sweep)
    out["sweep"], out["sweep_best"] = sweep, best
    if best:
        params = {key: best[key] for key in best if key not in ("recall", "qps")}
        contenders["best sweep"] = lambda: index.search(q_held, K, threads=THREADS, **params)
    if "flat" not in index.kind:
        from fastdpr.index import FlatIndex

        flat = FlatIndex(ds.dim)
        flat.add(np.asarray(base, dtype=np.float32))
        contenders["exact"] = lambda: flat.search(q_held, K, threads=THREADS)
    searcher = None if args.no_scann else scann_searcher(base)
    out["scann"] = "installed" if searcher is not None else ("not measured (--no-scann)" if args.no_scann else
                                                              "not installed (import scann failed)")
    if searcher is not None:
        scann_rows = sweep_scann(searcher, q_held, gt_held)
        out["scann_sweep"], out["scann_best"] = scann_rows, fastest(scann_rows)
        if out["scann_best"]:
            s = out["scann_best"]
            contenders["scann"] = lambda: scann_search(searcher, q_held, s["leaves"], s["reorder"])
    times = side_by_side(contenders, args.rounds)
    out["qps"] = {name: len(q_held) / t for name, t in times.items()}
    out["load"] = os.getloadavg()
    return out


def crossover(sizes: list[int], dim: int, args) -> list[dict]:
    """Exact search against tuned 4-bit IVF-PQ (the shape auto builds above its exact-search limit) at small n."""
    from fastdpr.index import FlatIndex, build_index
    from fastdpr.index.auto import COMPRESSED_MIN_N
    from fastdpr.index.ivfpq import default_nlist

    rows = []
    for n in sizes:
        ds = calibrated_synthetic(n, dim, "minilm-mean", n_queries=2 * args.queries)
        gt = ground_truth(ds, K)
        half = len(ds.queries) // 2
        q_tune, q_held = ds.queries[:half], ds.queries[half:]
        base = np.asarray(ds.base, dtype=np.float32)
        assert n < COMPRESSED_MIN_N
        index = build_index(base, f"ivfpq,nbits=4,nlist={default_nlist(n, 4)},store=fp16")
        tuned = index.tune(q_tune, target_recall=TARGET, k=K, truth=gt[:half], threads=THREADS)
        flat = FlatIndex(dim)
        flat.add(base)
        times = side_by_side({"ivfpq4+tune": lambda: index.search(q_held, K, threads=THREADS),
                              "exact": lambda: flat.search(q_held, K, threads=THREADS)}, args.rounds)
        rows.append({"n": n, "dim": dim, "n_x_d": n * dim, "tuned": str(tuned.params),
                     "held_recall": recall(index.search(q_held, K, threads=THREADS)[1], gt[half:]),
                     "ivfpq4_qps": len(q_held) / times["ivfpq4+tune"], "exact_qps": len(q_held) / times["exact"]})
        rows[-1]["ivfpq4_vs_exact"] = rows[-1]["ivfpq4_qps"] / rows[-1]["exact_qps"]
        print(f"crossover n={n}: {rows[-1]}", flush=True)
    return rows


def report(sets: list[dict], skipped: dict, cross: list[dict]) -> str:
    lines = [f"`auto` + `tune` (target recall@100 {TARGET}, tuned on half of the queries, measured on the other "
             f"half), {THREADS} thread; q/s timed side by side in alternating rounds (best of each).", ""]
    summary = []
    for s in sets:
        qps = s["qps"]
        row = {"set": s["set"], "auto": s["auto_spec"], "tuned": ", ".join(f"{k}={v}" for k, v in s["tuned"].items()),
               "tune recall": s["tune_recall"], "held-out recall": s["held_recall"], "auto q/s": qps["auto+tune"]}
        if "best sweep" in qps:
            b = s["sweep_best"]
            row["best sweep"] = f"nprobe={b['nprobe']}, rerank={b['rerank']} ({b['recall']:.3f})"
            row["vs best sweep"] = qps["auto+tune"] / qps["best sweep"]
        if "scann" in qps:
            b = s["scann_best"]
            row["ScaNN"] = f"leaves={b['leaves']}, reorder={b['reorder']} ({b['recall']:.3f}), {qps['scann']:.0f} q/s"
            row["vs ScaNN"] = qps["auto+tune"] / qps["scann"]
        elif s.get("scann_sweep"):
            b = max(s["scann_sweep"], key=lambda r: r["recall"])
            row["ScaNN"] = (f"never reached {TARGET} in the sweep (best {b['recall']:.3f}: leaves={b['leaves']}, "
                            f"reorder={b['reorder']})")
        else:
            row["ScaNN"] = s["scann"]
        if "exact" in qps:
            row["vs exact"] = qps["auto+tune"] / qps["exact"]
        summary.append(row)
    lines.append(markdown_table(summary))
    for name, why in skipped.items():
        lines.append(f"- {name}: {why}")
    for s in sets:
        lines += ["", f"### {s['set']}", "", s["description"] + f"; {s['n']} x {s['dim']}.", "",
                  f"- auto: `{s['auto_spec']}`, built in {s['build_s']:.1f} s; tune: {s['tune_s']:.1f} s, "
                  f"{s['tune_evaluations']} settings measured; each re-rank depth's cheapest setting: "
                  + "; ".join(str(c) for c in s["tune_candidates"]),
                  f"- q/s side by side: " + ", ".join(f"{k} {v:.0f}" for k, v in s["qps"].items()),
                  f"- load average (1 / 5 / 15 min) after the set: " + " / ".join(f"{v:.1f}" for v in s["load"]),
                  "", "Sweep of the same index on the held-out queries (one timing each):", "",
                  markdown_table(s["sweep"], floatfmt=".4g")]
        if s.get("scann_sweep"):
            lines += ["ScaNN sweep:", "", markdown_table(s["scann_sweep"], floatfmt=".4g")]
    if cross:
        lines += ["", "### Exact search against tuned 4-bit IVF-PQ at small n (where `auto` switches)", "",
                  markdown_table(cross, floatfmt=".4g")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="synthetic-minilm-mean:100000x384",
                    help="comma-separated: synthetic-<profile>:<n>x<d> | mixture:<n>x<d> | real-mean | real-cls")
    ap.add_argument("--queries", type=int, default=1000, help="held-out queries (as many again are tuned on)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    ap.add_argument("--crossover", default="", help="comma-separated n at d = --crossover-dim (exact vs IVF-PQ)")
    ap.add_argument("--crossover-dim", type=int, default=384)
    ap.add_argument("--no-scann", action="store_true")
    ap.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    ap.add_argument("--name", default="ann_auto", help="results file name (default ann_auto)")
    args = ap.parse_args(argv)
    sets, skipped = [], {}
    for name in filter(None, args.sets.split(",")):
        ds, why = load_set(name, 2 * args.queries)
        if ds is None:
            skipped[name] = why
            print(f"{name}: {why}", flush=True)
            continue
        sets.append(run_set(ds, args))
    cross = crossover([int(v) for v in args.crossover.split(",") if v], args.crossover_dim, args)
    write_results(args.name, args.out, {"sets": sets, "skipped": skipped, "crossover": cross,
                                         "target_recall": TARGET, "k": K, "threads": THREADS},
                  report(sets, skipped, cross))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
