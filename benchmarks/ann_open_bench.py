"""Opening a saved index: read into RAM vs memory-mapped, at 1M vectors.

Builds exact (flat) indexes of ``--n`` random vectors (fp32 and fp16 storage), saves them, then times
``load_index(path)`` (copies every section into RAM) against ``load_index(path, mmap=True)`` (vectors stay in the
file mapping) and the first search after each, and checks both give the same results. Every open verifies the
file's checksums (header, section table and every section), so a mapped open still reads the whole file once;
the file is in the page cache when it is opened (it was just written), so these are warm-cache times.

    python benchmarks/ann_open_bench.py                 # 1M x 384 -> benchmarks/results/ann_open.{json,md}
    python benchmarks/ann_open_bench.py --quick         # 20k x 64, seconds
"""
from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import DEFAULT_OUT, markdown_table, write_results  # noqa: E402
from datasets import cache_dir  # noqa: E402


def rss_mib() -> float:
    """Resident set size now (Linux /proc), MiB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return float("nan")


def measure(spec: str, x: np.ndarray, q: np.ndarray, repeats: int, tmp: Path) -> dict:
    from fastdpr.index import build_index, load_index

    index = build_index(x, spec)
    path = tmp / f"{spec.replace(',', '-')}.fdpr"
    t0 = time.perf_counter()
    index.save(path)
    save_s = time.perf_counter() - t0
    want = index.search(q, 10, threads=1)[1]
    del index
    gc.collect()
    row = {"index": spec, "file_MiB": path.stat().st_size / 2**20, "save_s": save_s}
    for mode in ("ram", "mmap"):
        opens, firsts = [], []
        for _ in range(repeats):
            gc.collect()
            before = rss_mib()
            t0 = time.perf_counter()
            loaded = load_index(path, mmap=mode == "mmap")
            opens.append(time.perf_counter() - t0)
            grown = rss_mib() - before
            t0 = time.perf_counter()
            got = loaded.search(q[:1], 10, threads=1)[1]
            firsts.append(time.perf_counter() - t0)
            same = np.array_equal(loaded.search(q, 10, threads=1)[1], want)
            assert same and np.array_equal(got, want[:1]), f"{spec} {mode}: results differ from the built index"
            del loaded
        row[f"open_{mode}_s"] = statistics.median(opens)
        row[f"first_query_{mode}_ms"] = 1000 * statistics.median(firsts)
        row[f"rss_growth_{mode}_MiB"] = grown
    row["same_results"] = True
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.dim, args.repeats = 20_000, 64, 1
    out = args.out or (cache_dir() / "quick-results" if args.quick else DEFAULT_OUT)

    rng = np.random.default_rng(0)
    x = np.empty((args.n, args.dim), np.float32)
    for s in range(0, args.n, 65536):
        x[s:s + 65536] = rng.standard_normal((min(65536, args.n - s), args.dim), dtype=np.float32)
    q = rng.standard_normal((32, args.dim), dtype=np.float32)
    rows = []
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as d:
        for spec in ("flat", "flat,fp16"):
            rows.append(measure(spec, x, q, args.repeats, Path(d)))
            print(rows[-1], flush=True)
    columns = ["index", "file_MiB", "save_s", "open_ram_s", "open_mmap_s", "first_query_ram_ms",
               "first_query_mmap_ms", "rss_growth_ram_MiB", "rss_growth_mmap_MiB", "same_results"]
    body = (f"{args.n} x {args.dim} random vectors; median of {args.repeats} opens; warm page cache (the file was "
            f"just written). open = `load_index(path)` / `load_index(path, mmap=True)`, both verifying every "
            f"checksum; first query = one query, k = 10, 1 thread, right after the open; RSS growth = resident "
            f"memory after the open minus before (a mapped file's pages read by the checksum pass count as "
            f"resident while cached).\n\n" + markdown_table(rows, columns))
    write_results("ann_open" + ("-quick" if args.quick else ""), out, {"n": args.n, "dim": args.dim, "rows": rows},
                  body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
