"""`fastdpr bench`: run the side-by-side benchmarks in ``benchmarks/`` and gather their results in one report.

Each benchmark is a script ``benchmarks/<name>_bench.py`` taking ``--quick`` and ``--out DIR`` and writing
``DIR/<name>.json`` + ``DIR/<name>.md``; ``benchmarks/report.py`` joins them into ``DIR/README.md``. The scripts
stay runnable on their own, so every number in the report comes with the command that made it."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

# a benchmark's exit status when it needs the real data and cannot get it (benchmarks/_common.py)
DATA_UNAVAILABLE = 3

# name -> script, in the order they run (cheap and most informative first)
BENCHMARKS = {
    "loss": "loss_bench.py",
    "ann": "ann_bench.py",
    "bm25": "bm25_bench.py",
    "encode": "encode_bench.py",
    "train": "train_bench.py",
    "e2e": "e2e_bench.py",
    "reader": "reader_bench.py",
    "quality": "quality_bench.py",
}


def default_benchmarks_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run of every benchmark, ≤ 5 min)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default: benchmarks/results, or benchmarks/results/quick with --quick, so "
                        "a smoke run never overwrites measured results)")
    p.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--benchmarks-dir", type=Path, default=None, help="folder holding the benchmark scripts")
    p.add_argument("--keep-going", action="store_true", help="run the remaining benchmarks after one fails")


def run(args: argparse.Namespace) -> int:
    from fastdpr.errors import InputError

    bdir = args.benchmarks_dir or default_benchmarks_dir()
    if not (bdir / "report.py").is_file():
        raise InputError("benchmark scripts not found; run from a fastdpr source checkout or pass --benchmarks-dir",
                         path=str(bdir))
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise InputError(f"--only: unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    out = (args.out or bdir / "results" / ("quick" if args.quick else "")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed, skipped = [], []
    for name in names:
        cmd = [sys.executable, str(bdir / BENCHMARKS[name]), "--out", str(out)] + (["--quick"] if args.quick else [])
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(cmd, env=os.environ.copy())
        print(f"== {name}: exit {code} after {time.perf_counter() - start:.1f} s", flush=True)
        if code == DATA_UNAVAILABLE:  # the benchmark said why on stderr; nothing to measure here, nothing broken
            skipped.append(name)
        elif code != 0:
            failed.append(name)
            if not args.keep_going:
                break
    subprocess.call([sys.executable, str(bdir / "report.py"), "--out", str(out)])
    if skipped:
        print(f"skipped, their real data is not available here: {', '.join(skipped)}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
