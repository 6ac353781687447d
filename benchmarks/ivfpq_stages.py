"""Compiled IVF-PQ search of two builds of fastdpr (a base and a new one) on the same index files, timed in
alternating rounds: the same recall, and the new build's q/s over the base's.

Each build is a Python environment with its own fastdpr installed (``--base-python``, ``--new-python``; by default
this interpreter for both). The indexes are built once (synthetic clustered rows, by the new build) and saved;
every timing is a fresh process of one build that loads an index and times one setting's searches on one thread
(the fastest of a few passes over the queries).
A round runs every setting on both builds, the build going first alternating from round to round, so that a
change of the machine's load falls on both; with ``--side-by-side`` the two run at the same time, each pinned to a
core of its own (swapped every round), so that a change of a shared host's load falls on both at once (they
share the last-level cache and memory bandwidth, alike). Reported per setting: whether both builds return the same
ids, their recall@k against exact search, and the median over rounds of the per-round q/s ratio (new / base) with its range.

    python benchmarks/ivfpq_stages.py --base-python ../main/.venv/bin/python --new-python .venv/bin/python
        # benchmarks/results/ivfpq_stages.{json,md}

``--preset compressed`` times ``ann_compressed.py``'s index instead, on a reduced sweep: vectors calibrated to
MiniLM mean pooling (``--n`` x 768), ``ivfpq,nbits=4,m=96,store=fp16,aniso=0.2,sq=4`` with the index's own number of
lists, opened memory-mapped, recall@100 (results in ``ivfpq_stages_compressed.{json,md}``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, write_results  # noqa: E402

K = 10
# name: index parameters
INDEXES = {
    "pq8": dict(nbits=8, store="none"),
    "pq8-fp32": dict(nbits=8, store="fp32"),
    "pq4": dict(nbits=4, store="none"),
    "pq4-fp16": dict(nbits=4, store="fp16"),
    "pq4-sq4-fp16": dict(nbits=4, store="fp16", sq=4),
}
SETTINGS = [  # (index, rerank, exact, spread); nprobe: --nprobe
    ("pq8", 0, 0, 0.0),
    ("pq8-fp32", 100, 0, 0.0),
    ("pq4", 0, 0, 0.5),
    ("pq4-fp16", 200, 0, 0.5),
    ("pq4-sq4-fp16", 400, 40, 0.5),
]
# ann_compressed.py's index and the corner of its sweep around recall@100 = 0.95: (index, rerank, exact, spread,
# nprobe)
COMPRESSED_INDEXES = {"pq4-sq4-fp16-aniso": "ivfpq,nbits=4,m=96,store=fp16,aniso=0.2,sq=4"}  # build_index spec
COMPRESSED_SETTINGS = [
    ("pq4-sq4-fp16-aniso", 1000, 0, 0.5, 64),
    ("pq4-sq4-fp16-aniso", 1000, 200, 0.5, 64),
    ("pq4-sq4-fp16-aniso", 2000, 300, 0.5, 128),
    ("pq4-sq4-fp16-aniso", 2000, 300, 0.0, 128),
]

WORKER = r"""
import json, sys, time
import numpy as np
import fastdpr
from fastdpr.index import load_index
path, queries, out, rerank, exact, spread, nprobe, batch, k, reps, mmap = sys.argv[1:12]
index = load_index(path, mmap=bool(int(mmap)))
q = np.load(queries)
params = dict(nprobe=int(nprobe), rerank=int(rerank), threads=1, spread=float(spread))
if int(exact):
    params["exact"] = int(exact)
batch = int(batch)
index.search(q[:batch], int(k), **params)  # warm: pages of the index, the kernels' first calls
best = float("inf")
for _ in range(int(reps)):  # the fastest pass: the one the machine's other load disturbed least
    t0 = time.perf_counter()
    ids = [index.search(q[i:i + batch], int(k), **params)[1] for i in range(0, len(q), batch)]
    best = min(best, time.perf_counter() - t0)
np.save(out, np.concatenate(ids))
impl = getattr(index, "_impl", None)
print(json.dumps({"qps": len(q) / best, "fastdpr": fastdpr.__file__, "impl": type(impl).__module__ + "." + type(impl).__name__}))
"""


def clustered(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    centres = 2 * rng.standard_normal((64, d)).astype(np.float32)
    x = centres[rng.integers(0, 64, n)] + rng.standard_normal((n, d)).astype(np.float32)
    x *= np.exp(0.25 * rng.standard_normal((n, 1))).astype(np.float32)
    return x


def build(work: Path, x: np.ndarray, q: np.ndarray, indexes: dict, nlist: int) -> None:
    """Every index of ``indexes`` (IVFPQIndex parameters with ``nlist``, or a ``build_index`` spec), saved."""
    from fastdpr.index import build_index
    from fastdpr.index.ivfpq import IVFPQIndex

    np.save(work / "queries.npy", q)
    for name, params in indexes.items():
        if isinstance(params, str):
            index = build_index(x, params)
        else:
            index = IVFPQIndex(x.shape[1], nlist=nlist, **params)
            index.train(x[: min(len(x), 64 * nlist)])
            index.add(x)
        index.save(work / f"{name}.fdpr")
        print(f"built {name}", flush=True)


def top_k(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    scores = q @ x.T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def start_one(python: str, work: Path, setting: tuple, batch: int, reps: int, tag: str, k: int, mmap: bool,
              cpu: int | None = None) -> tuple:
    """One timing process of one build (pinned to ``cpu`` when given), started; :func:`finish_one` waits for it."""
    name, rerank, exact, spread, nprobe = setting
    out = work / f"ids-{tag}-{name}-{rerank}-{exact}-{spread}-{nprobe}-{batch}.npy"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    queries = work / ("queries.npy" if batch > 1 else "queries1.npy")
    # run from the work folder: ``python -c`` puts the current folder first on sys.path, and from a checkout the
    # base build would import the checkout's sources (without their compiled module: the numpy fallback) instead
    # of its own
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.Popen([python, "-c", WORKER, str(work / f"{name}.fdpr"), str(queries), str(out), str(rerank),
                             str(exact), str(spread), str(nprobe), str(batch), str(k), str(reps), str(int(mmap))],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
                            preexec_fn=pin)
    return proc, python, out


def finish_one(started: tuple) -> tuple:
    proc, python, out = started
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{python}: the timing process failed ({proc.returncode}):\n{stderr}")
    report = json.loads(stdout.strip().splitlines()[-1])
    if not report["impl"].startswith("fastdpr._C."):
        raise SystemExit(f"{python} searched with {report['impl']} (fastdpr from {report['fastdpr']}), not the "
                         "compiled index: check that build's install")
    return report["qps"], np.load(out)


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    k = gt.shape[1]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ids, gt[: len(ids)])]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-python", default=sys.executable)
    ap.add_argument("--new-python", default=sys.executable)
    ap.add_argument("--preset", choices=("synthetic", "compressed"), default="synthetic",
                    help="synthetic: clustered rows, every code type; compressed: ann_compressed.py's index (above)")
    ap.add_argument("--n", type=int, default=None, help="vectors (default 50,000; compressed: 100,000)")
    ap.add_argument("--dim", type=int, default=128, help="synthetic preset only (compressed: 768)")
    ap.add_argument("--nlist", type=int, default=256, help="synthetic preset only (compressed: the index's own)")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--queries", type=int, default=1000, help="searched in one batch")
    ap.add_argument("--single", type=int, default=1000, help="of them searched one at a time (batch 1)")
    ap.add_argument("--reps", type=int, default=5, help="passes over the queries per process; the fastest counts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--side-by-side", action="store_true",
                    help="run the two builds' processes at the same time, each on a core of its own (swapped every "
                         "round), so that a change of the host's load falls on both alike")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if args.side_by_side and len(cpus) < 2:
        raise SystemExit(f"--side-by-side needs two cores; this process may use {len(cpus)}")
    # absolute (the workers run in the work folder), but not through the symlink: a venv's python finds its
    # environment by the path it was started from
    pythons = {side: os.path.abspath(p) if os.sep in p else p
               for side, p in (("base", args.base_python), ("new", args.new_python))}
    compressed = args.preset == "compressed"
    if compressed:
        from datasets import calibrated_synthetic

        args.n, args.dim, args.nlist = args.n or 100_000, 768, 0
        data = calibrated_synthetic(args.n, args.dim, "minilm-mean", args.queries)
        x, q, k = np.asarray(data.base, dtype=np.float32), np.asarray(data.queries, dtype=np.float32), 100
        indexes, settings = COMPRESSED_INDEXES, COMPRESSED_SETTINGS
    else:
        args.n = args.n or 50_000
        rng = np.random.default_rng(2024)
        x, q, k = clustered(rng, args.n, args.dim), clustered(rng, args.queries, args.dim), K
        indexes, settings = INDEXES, [(*s, args.nprobe) for s in SETTINGS]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build(work, x, q, indexes, args.nlist)
        gt = top_k(x, q, k)
        del x
        np.save(work / "queries1.npy", q[: args.single])
        runs = [(s, b) for s in settings for b in (1, args.queries)]
        qps = {(s, b, side): [] for s, b in runs for side in pythons}
        ids = {}
        for r in range(args.rounds):
            order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
            for s, b in runs:
                if args.side_by_side:  # both at once, the cores swapped from round to round
                    started = {side: start_one(pythons[side], work, s, b, args.reps, side, k, compressed, cpu=c)
                               for c, side in zip(cpus, order)}
                    done = {side: finish_one(started[side]) for side in order}
                else:
                    done = {side: finish_one(start_one(pythons[side], work, s, b, args.reps, side, k, compressed))
                            for side in order}
                for side, (v, found) in done.items():
                    qps[(s, b, side)].append(v)
                    ids[(s, b, side)] = found
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    rows = []
    for s, b in runs:
        ratio = np.array(qps[(s, b, "new")]) / np.array(qps[(s, b, "base")])
        rows.append({"index": s[0], "nprobe": s[4], "rerank": s[1], "exact": s[2], "spread": s[3], "batch": b,
                     "same ids": bool(np.array_equal(ids[(s, b, "base")], ids[(s, b, "new")])),
                     f"recall@{k} base": recall(ids[(s, b, "base")], gt),
                     f"recall@{k} new": recall(ids[(s, b, "new")], gt),
                     "q/s base (median)": float(np.median(qps[(s, b, "base")])),
                     "q/s new (median)": float(np.median(qps[(s, b, "new")])),
                     "ratio median": float(np.median(ratio)), "ratio min": float(ratio.min()),
                     "ratio max": float(ratio.max())})
    payload = {"settings": vars(args) | {"k": k, "threads": 1}, "rows": rows,
               "qps": {f"{s[0]}/nprobe{s[4]}/rerank{s[1]}/exact{s[2]}/spread{s[3]}/batch{b}/{side}": v
                       for (s, b, side), v in qps.items()}}
    what = (f"{args.n:,} x 768 vectors calibrated to MiniLM mean pooling, `ivfpq,nbits=4,m=96,store=fp16,aniso=0.2,"
            f"sq=4` with the index's own lists, opened memory-mapped" if compressed else
            f"{args.n:,} x {args.dim} synthetic clustered rows, {args.nlist} lists, nprobe {args.nprobe}")
    body = (f"{what}, k {k}, "
            f"1 thread, {args.rounds} rounds, each build in a fresh process per setting and round, "
            + (f"the two at the same time on cores {cpus[0]} and {cpus[1]} (swapped every round), "
               if args.side_by_side else "alternating which build goes first, ")
            + f"q/s of its fastest of {args.reps} passes over the queries; batch 1: the first "
            f"{args.single} queries one per call, batch {args.queries}: all in one call. Ratio: new q/s over base q/s "
            f"in the same round (median, min, max over rounds).\n\n" + markdown_table(rows))
    print(body)
    write_results("ivfpq_stages_compressed" if compressed else "ivfpq_stages", args.out, payload, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
