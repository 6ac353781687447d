"""``index.tune`` on an index built by ``ann_scale.py``: no hand-set search parameter (results/<name>.{md,json}).

The index is opened with mmap; ``tune`` sees the even-numbered queries of the run and their exact top-100 (it
splits them again: one half chooses, the other confirms), and the chosen settings are then measured on the
odd-numbered queries, which it never saw: a warm-up call, then the median of three timed calls.

    python benchmarks/ann_scale_tune.py --work /var/tmp/ann_scale --name ann_scale_tune
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402
from ann_scale import K, timed_calls  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="the folder of an ann_scale.py run (index.fdpr, queries, truth)")
    ap.add_argument("--target", type=float, default=0.95, help="recall@100 that tune must reach")
    ap.add_argument("--name", default="ann_scale_tune")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from fastdpr.index import load_index
    from fastdpr.index.synthetic import recall_at

    work = Path(a.work)
    for need in ("index.fdpr", "queries.npy", "truth.npy"):
        if not (work / need).exists():
            raise SystemExit(f"{work / need} is missing: run benchmarks/ann_scale.py --work {work} first")
    q, truth = np.load(work / "queries.npy"), np.load(work / "truth.npy")
    index = load_index(work / "index.fdpr", mmap=True)
    t = time.perf_counter()
    tuned = index.tune(q[0::2], target_recall=a.target, k=K, truth=truth[0::2], max_queries=q.shape[0])
    tune_s = time.perf_counter() - t
    held_q, held_truth = q[1::2], truth[1::2]
    index.search(held_q, K)  # warm-up: the page cache of a file larger than RAM
    ids, runs = timed_calls(index, held_q)  # the index's own defaults: what tune chose
    held = {"queries": int(held_q.shape[0]), "recall@100": recall_at(ids, held_truth, K),
            "q/s": float(np.median(runs)), "q/s runs": runs}
    payload = {"work": str(work), "tune_s": tune_s, "tuned": tuned.record(), "evaluations": tuned.evaluations,
               "candidates": tuned.candidates, "held_out": held, "threads": os.cpu_count()}
    body = (f"Index: `{work / 'index.fdpr'}` (built by `ann_scale.py`, {len(index):,} vectors), opened with mmap.  \n"
            f"`index.tune(target_recall={a.target}, k=100)` on the {q[0::2].shape[0]} even-numbered queries with "
            f"their exact top-100, {tune_s:.0f} s, {tuned.evaluations} settings measured: chose {tuned.params} "
            f"(its sample recall@100 {tuned.recall:.4f}, confirmed on {tuned.confirmed_on} of them).\n\n"
            f"Held out, the {held['queries']} odd-numbered queries with those settings ({os.cpu_count()} threads, "
            f"one call, median of three after a warm-up): recall@100 **{held['recall@100']:.4f}** at "
            f"**{held['q/s']:.0f} q/s** ({', '.join(f'{r:.0f}' for r in runs)}).\n")
    write_results(a.name, a.out, payload, body)
    print(body)


if __name__ == "__main__":
    main()
