"""DPR-sized compressed IVF-PQ on one machine: build, open with mmap, search (results/ann_scale.{md,json}).

Data: a calibrated MiniLM generator profile (``fastdpr.index.synthetic``, ``--profile``: ``minilm-mean`` by
default; ``minilm-mean-pool`` is fitted to how the real pool of ``real_pool.py`` grows) at DPR's size,
21,015,324 x 768 by default, streamed to disk (``fastdpr.index.disk_build``: the rows go straight into the index file
as fp16, never all in memory). The vectors are those fp16 rows: the ground truth and the index both see them.

Stages, each in a fresh process (its peak resident memory is its own ``ru_maxrss``), each resumable, each
recorded in ``<work>/stage_<name>.json`` when it ends (a finished stage is not rerun):

- ``data``: generate and append the rows (resumes at the last appended chunk);
- ``truth``: exact top-100 of 1,000 queries, block by block over the rows on disk (resumes at the last block);
  its time is the exact search of the batch, from disk;
- ``train``: k-means and codebooks on a sample of the rows;
- ``add``: codes and 4-bit rows, checkpointed every few million rows;
- ``finish``: the index file;
- ``search``: open with mmap (time, resident memory), one call with the widest setting to warm the page cache,
  a sweep of nprobe x rerank on the batch of 1,000 queries,
  the cheapest setting with recall@100 >= 0.95 again warm and one query per call, and exact search from the
  mapped fp16 rows (a smaller batch: one pass over all rows either way).

    python benchmarks/ann_scale.py --work /var/tmp/ann_scale            # all stages, 21M x 768
    python benchmarks/ann_scale.py --n 1000000 --work /tmp/s1m           # a rehearsal
    python benchmarks/ann_scale.py --report                              # write the result files from the stages

The data-defining settings (n, dim, seed, profile, queries) are kept in ``<work>/settings.json``; a run with other
ones in the same folder is refused, never mixed into rows or truth already written.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_results  # noqa: E402

DPR_N = 21_015_324
SPEC = ("ivfpq,nlist=4096,nbits=4,m=96,sq=4,aniso=0.2,spread=0.5,niter=10,max_points_per_centroid=32")
STAGES = ("data", "truth", "train", "add", "finish", "search")
K = 100
CHUNK = 65536
TRUTH_BLOCK = 131072
NPROBE = (32, 64, 128, 192, 256, 384, 512, 768)
RERANK = (1000, 2000, 4000)
TARGET = 0.95
CHOOSE, HELD_OUT = "recall@100 even queries (choose)", "recall@100 odd queries (held out)"


def rss_mib() -> dict:
    out = {}
    for line in open("/proc/self/status", encoding="ascii"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def index_path(a) -> Path:
    return Path(a.work) / "index.fdpr"


def builder(a):
    from fastdpr.index.disk_build import IVFPQDiskBuilder

    return IVFPQDiskBuilder(index_path(a), a.dim, a.spec)


def generator(a):
    from fastdpr.index.synthetic import CalibratedGenerator

    return CalibratedGenerator(a.n, a.dim, a.profile, seed=a.seed)


def stage_data(a) -> dict:
    from fastdpr.progress import progress

    b = builder(a)
    g = generator(a)
    start = b.rows
    with progress(total=a.n, desc="generate rows", unit="row") as bar:
        bar.update(start)
        while b.rows < a.n:
            stop = min(b.rows + CHUNK, a.n)
            bar.update(stop - b.rows)
            b.append(g.passages(b.rows, stop))
    q = g.queries(a.queries)
    np.save(Path(a.work) / "queries.npy", q)
    return {"rows": b.rows, "resumed_at": start, "bytes": b.rows * b.row_bytes}


def merge_block(scores: np.ndarray, ids: np.ndarray, q: np.ndarray, block: np.ndarray, start: int):
    """The exact top-K so far merged with the scores of ``block`` (rows ``start`` ...), unsorted."""
    s = np.concatenate([scores, q @ block.astype(np.float32).T], axis=1)
    i = np.concatenate([ids, np.arange(start, start + block.shape[0], dtype=np.int64)[None].repeat(q.shape[0], 0)],
                       axis=1)
    top = np.argpartition(-s, K - 1, axis=1)[:, :K]
    return np.take_along_axis(s, top, 1), np.take_along_axis(i, top, 1)


def stage_truth(a) -> dict:
    from fastdpr.progress import progress

    b = builder(a)
    q = np.load(Path(a.work) / "queries.npy")
    state = Path(a.work) / "truth_partial.npz"
    if state.exists():
        z = np.load(state)
        scores, ids, start = z["scores"], z["ids"], int(z["next"])
    else:
        scores = np.full((q.shape[0], K), -np.inf, np.float32)
        ids = np.full((q.shape[0], K), -1, np.int64)
        start = 0
    first = start
    with progress(total=b.rows, desc="exact top-100", unit="row") as bar:
        bar.update(start)
        while start < b.rows:
            stop = min(start + TRUTH_BLOCK, b.rows)
            scores, ids = merge_block(scores, ids, q, b.read_rows(start, stop), start)
            bar.update(stop - start)
            start = stop
            tmp = state.with_suffix(".tmp.npz")
            np.savez(tmp, scores=scores, ids=ids, next=start)
            os.replace(tmp, state)
    order = np.argsort(-scores, axis=1, kind="stable")
    np.save(Path(a.work) / "truth.npy", np.take_along_axis(ids, order, 1))
    return {"queries": int(q.shape[0]), "resumed_at": first, "block_rows": TRUTH_BLOCK}


def stage_train(a) -> dict:
    b = builder(a)
    b.train()
    return {}


def stage_add(a) -> dict:
    b = builder(a)
    first = b.added
    b.add(checkpoint_every=a.checkpoint_every)
    return {"resumed_at": first}


def stage_finish(a) -> dict:
    path = index_path(a)
    if not path.exists():
        builder(a).finish()
    return {"file_bytes": path.stat().st_size}


def timed_calls(index, q: np.ndarray, calls: int = 3, **params) -> tuple[np.ndarray, list[float]]:
    """The last call's ids and the q/s of ``calls`` calls of the whole batch: the page cache of a file larger
    than RAM settles over several calls, so one timing is not enough (report their median)."""
    runs, ids = [], None
    for _ in range(calls):
        t = time.perf_counter()
        _, ids = index.search(q, K, **params)
        runs.append(q.shape[0] / (time.perf_counter() - t))
    return ids, runs


def stage_search(a) -> dict:
    from fastdpr.index import load_index
    from fastdpr.index.synthetic import recall_at

    q = np.load(Path(a.work) / "queries.npy")
    truth = np.load(Path(a.work) / "truth.npy")
    before = rss_mib()
    t = time.perf_counter()
    index = load_index(index_path(a), mmap=True)
    open_s = time.perf_counter() - t
    after_open = rss_mib()
    n = len(index)
    # one untimed call with the sweep's widest setting first: it reads (nearly) every row the narrower settings
    # read, so that the first of them is not timed on a cold page cache while the later ones find it warm
    widest = {"nprobe": max(a.nprobe), "rerank": max(a.rerank),
              "exact": max((e for e in a.exact if e != "auto"), default="auto")}
    t = time.perf_counter()
    index.search(q, K, **widest)
    warmup = dict(widest, **{"q/s": q.shape[0] / (time.perf_counter() - t)})
    sweep = []
    for exact in a.exact:
        for nprobe in a.nprobe:
            for rerank in a.rerank:
                if exact != "auto" and exact > rerank:
                    continue
                t = time.perf_counter()
                _, ids = index.search(q, K, nprobe=nprobe, rerank=rerank, exact=exact)
                wall = time.perf_counter() - t
                row = {"nprobe": nprobe, "rerank": rerank, "exact": exact, "recall@100": recall_at(ids, truth, K),
                       CHOOSE: recall_at(ids[0::2], truth[0::2], K), HELD_OUT: recall_at(ids[1::2], truth[1::2], K),
                       "q/s": q.shape[0] / wall}
                sweep.append(row)
                print(json.dumps(row), flush=True)
    # chosen on the even-numbered queries, so that the odd-numbered ones report a recall the choice has not seen
    ok = [r for r in sweep if r[CHOOSE] >= TARGET]
    best = max(ok, key=lambda r: r["q/s"]) if ok else None
    params = (lambda r: {"nprobe": r["nprobe"], "rerank": r["rerank"], "exact": r["exact"]})  # noqa: E731
    result = {"n": n, "open_s": open_s, "rss_before_open_mib": before, "rss_after_open_mib": after_open,
              "warmup": warmup, "sweep": sweep}
    if best:
        ids, runs = timed_calls(index, q, **params(best))
        warm = {"recall@100": recall_at(ids, truth, K), HELD_OUT: recall_at(ids[1::2], truth[1::2], K),
                "q/s": float(np.median(runs)), "q/s runs": runs}
        one = min(a.single, q.shape[0])
        found = np.empty((one, K), np.int64)
        t = time.perf_counter()
        for i in range(one):
            found[i] = index.search(q[i:i + 1], K, **params(best))[1][0]
        single = {"queries": one, "recall@100": recall_at(found, truth[:one], K),
                  "q/s": one / (time.perf_counter() - t)}
        result.update(best=best, best_warm=warm, best_one_per_call=single)
    result["rss_after_search_mib"] = rss_mib()
    result["exact"] = exact_from_mapping(index_path(a), n, q[:a.exact_queries], truth[:a.exact_queries])
    result["rss_after_exact_mib"] = rss_mib()
    return result


def exact_from_mapping(path: Path, n: int, q: np.ndarray, truth: np.ndarray) -> dict:
    """Exact top-100 of a batch from the index file's fp16 rows, mapped (np.memmap), block by block."""
    from fastdpr.index import fileformat

    offset, length = fileformat.PyReader(path, verify=False).span("vectors")
    rows = np.memmap(path, dtype=np.float16, mode="r", offset=offset, shape=(n, length // (2 * n)))
    scores = np.full((q.shape[0], K), -np.inf, np.float32)
    ids = np.full((q.shape[0], K), -1, np.int64)
    t = time.perf_counter()
    for start in range(0, rows.shape[0], TRUTH_BLOCK):
        scores, ids = merge_block(scores, ids, q, rows[start:start + TRUTH_BLOCK], start)
    wall = time.perf_counter() - t
    from fastdpr.index.synthetic import recall_at

    return {"queries": int(q.shape[0]), "recall@100": recall_at(ids, truth, K), "q/s": q.shape[0] / wall}


RUNNERS = {"data": stage_data, "truth": stage_truth, "train": stage_train, "add": stage_add,
           "finish": stage_finish, "search": stage_search}


def run_stage(a, name: str) -> None:
    """In the child: run one stage and record it."""
    t, c = time.perf_counter(), time.process_time()
    out = RUNNERS[name](a)
    out.update(stage=name, wall_s=time.perf_counter() - t, cpu_s=time.process_time() - c,
               peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    from fastdpr.atomic import write_json

    write_json(Path(a.work) / f"stage_{name}.json", out)


def report(a) -> None:
    work = Path(a.work)
    stages = {s: json.loads((work / f"stage_{s}.json").read_text()) for s in STAGES
              if (work / f"stage_{s}.json").exists()}
    rows = [{"stage": s, "wall_s": round(v["wall_s"], 1), "cpu_s": round(v["cpu_s"], 1),
             "peak_rss_gib": round(v["peak_rss_mib"] / 1024, 2), "finished": v["finished"]}
            for s, v in stages.items()]
    body = (f"Data: calibrated MiniLM vectors (`fastdpr.index.synthetic`, profile `{a.profile}`), {a.n:,} x {a.dim}, "
            f"seed {a.seed}, "
            f"stored as fp16; {a.queries} queries; recall@100 against exact search over the same fp16 rows.  \n"
            f"Index: `{a.spec}`, built with `fastdpr.index.disk_build` (rows streamed into the file; codes and 4-bit "
            "rows in memory while adding).  \nEach stage ran in its own process; peak RSS is its `ru_maxrss`. "
            "Stages that were resumed report the time of their last run only (`resumed_at`).\n\n"
            "### Stages\n\n" + markdown_table(rows) + "\n")
    built = [stages[s] for s in ("train", "add", "finish") if s in stages]
    if len(built) == 3:
        body += (f"Build (train + add + finish, the rows already on disk): {sum(v['wall_s'] for v in built) / 60:.1f} "
                 f"min, peak RSS {max(v['peak_rss_mib'] for v in built) / 1024:.1f} GiB; writing the rows "
                 f"(generation included): {stages['data']['wall_s'] / 60:.1f} min.\n\n")
    path = index_path(a)
    if path.exists():
        n = a.n
        body += f"Index file: {path.stat().st_size / 2**30:.2f} GiB ({path.stat().st_size / n:.0f} bytes/vector).\n\n"
    if "search" in stages:
        s = stages["search"]
        n = s["n"]
        res = lambda d: d["VmRSS"]  # noqa: E731
        body += (f"### Open and search (one fresh process, {os.cpu_count()} threads)\n\n"
                 f"- open with mmap: {s['open_s']:.1f} s; resident after open {res(s['rss_after_open_mib']):.0f} MiB "
                 f"({res(s['rss_after_open_mib']) * 2**20 / n:.1f} bytes/vector; before open "
                 f"{res(s['rss_before_open_mib']):.0f} MiB), after the search "
                 f"{res(s['rss_after_search_mib']):.0f} MiB ({res(s['rss_after_search_mib']) * 2**20 / n:.1f} "
                 f"bytes/vector, file pages included: {s['rss_after_search_mib']}); the process's own memory "
                 f"(RssAnon, what the index costs in RAM; the rest are file pages, reclaimable page cache): "
                 f"{s['rss_after_open_mib']['RssAnon'] * 2**20 / n:.1f} bytes/vector after the open, "
                 f"{s['rss_after_search_mib']['RssAnon'] * 2**20 / n:.1f} after the search\n")
        if "best" in s:
            b, w, o = s["best"], s["best_warm"], s["best_one_per_call"]
            chosen = (f" on the even-numbered queries; the odd-numbered ones, held out: recall@100 {w[HELD_OUT]:.4f}"
                      if HELD_OUT in w else " on the same queries")
            body += (f"- cheapest swept setting with recall@100 >= {TARGET}{chosen}: nprobe={b['nprobe']}, "
                     f"rerank={b['rerank']}, exact={b.get('exact', 'auto')}: recall@100 {w['recall@100']:.4f} on all, "
                     f"{w['q/s']:.0f} q/s in one call of {a.queries}"
                     + (f" (median of {len(w['q/s runs'])} calls: "
                        + ", ".join(f"{r:.0f}" for r in w["q/s runs"]) + ")" if "q/s runs" in w else "")
                     + f" (first run {b['q/s']:.0f} q/s); one query per call ({o['queries']} queries): "
                     f"{o['q/s']:.0f} q/s, recall@100 {o['recall@100']:.4f}\n")
        else:
            body += f"- no swept setting reached recall@100 {TARGET}\n"
        if "warmup" in s:
            wu = s["warmup"]
            body += (f"- warm-up before the sweep (not part of it): nprobe={wu['nprobe']}, rerank={wu['rerank']}, "
                     f"exact={wu['exact']}, on the page cache the open left: {wu['q/s']:.0f} q/s\n")
        e = s["exact"]
        body += (f"- exact search from the mapped fp16 rows, one call of {e['queries']} queries: {e['q/s']:.2f} q/s, "
                 f"recall@100 {e['recall@100']:.4f}\n\n### Sweep (one call of {a.queries} queries, first run)\n\n"
                 + markdown_table(s["sweep"]))
    for extra in sorted(work.glob("sweep_*.jsonl")):  # sweeps of earlier search runs, kept by hand
        rows = [json.loads(line) for line in extra.read_text().splitlines() if line.strip()]
        auto = "" if "exact" in rows[0] else ", exact = auto: 3 k = 300"
        body += (f"\n### Earlier sweep `{extra.stem}` (same index and queries{auto})\n\n"
                 + markdown_table(rows))
    write_results(a.name, a.out, {"n": a.n, "dim": a.dim, "profile": a.profile, "spec": a.spec, "stages": stages},
                  body)


DATA_SETTINGS = ("n", "dim", "seed", "profile", "queries")


def check_settings(a) -> None:
    """Keep the data-defining settings in ``<work>/settings.json`` at the first run; refuse a later run whose
    settings differ (its rows, queries and truth would not be those on disk)."""
    from fastdpr.atomic import write_json

    path = Path(a.work) / "settings.json"
    mine = {k: getattr(a, k) for k in DATA_SETTINGS}
    if not path.exists():
        write_json(path, mine)
        return
    kept = json.loads(path.read_text())
    differ = {k: (kept.get(k), v) for k, v in mine.items() if kept.get(k) != v}
    if differ:
        said = ", ".join(f"--{k} {v!r} (the folder holds {old!r})" for k, (old, v) in differ.items())
        raise SystemExit(f"{a.work} was built with other data settings: {said}; use another --work")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=DPR_N)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--profile", default="minilm-mean", help="the generator's profile (fastdpr.index.synthetic)")
    ap.add_argument("--name", default="ann_scale", help="result file name")
    ap.add_argument("--spec", default=SPEC)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "fastdpr" / "ann_scale"))
    ap.add_argument("--checkpoint-every", type=int, default=4_000_000)
    ap.add_argument("--single", type=int, default=200, help="queries searched one per call")
    ap.add_argument("--exact-queries", type=int, default=100)
    ap.add_argument("--nprobe", type=lambda v: [int(x) for x in v.split(",")], default=list(NPROBE),
                    help="search sweep: lists probed")
    ap.add_argument("--rerank", type=lambda v: [int(x) for x in v.split(",")], default=list(RERANK),
                    help="search sweep: candidates ranked by their 4-bit rows")
    ap.add_argument("--exact", type=lambda v: [x if x == "auto" else int(x) for x in v.split(",")],
                    default=["auto"],
                    help="search sweep: of those, re-scored from the fp16 rows (auto: 3 k)")
    ap.add_argument("--redo", default="", help="comma-separated stages to run again (e.g. search)")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--stage", help=argparse.SUPPRESS)  # the child process's stage
    ap.add_argument("--report", action="store_true", help="only write the result files from the recorded stages")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from fastdpr.index.synthetic import PROFILES

    if a.profile not in PROFILES:
        ap.error(f"--profile {a.profile!r}: known profiles are {', '.join(sorted(PROFILES))}")
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if a.stage:
        run_stage(a, a.stage)
        return
    if not a.report:
        check_settings(a)
        for name in a.stages.split(","):
            if name not in STAGES:
                ap.error(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
            if name in a.redo.split(",") and (Path(a.work) / f"stage_{name}.json").exists():
                (Path(a.work) / f"stage_{name}.json").unlink()
            if (Path(a.work) / f"stage_{name}.json").exists():
                print(f"{name}: done earlier", flush=True)
                continue
            print(f"{name}: running", flush=True)
            subprocess.run([sys.executable, *sys.argv, "--stage", name], check=True)
    report(a)


if __name__ == "__main__":
    main()
