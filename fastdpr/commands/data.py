"""``fastdpr data fetch``: put the published QA files (QED, XQuAD, SQuADShifts, NQ-open, EfficientQA, DPR's question
sets) into the cache, each checked against its pinned sha256, and write the splits the quickstart reads.

    fastdpr data fetch                       # from each file's repository at its pinned commit
    fastdpr data fetch --from /data/qa       # from a folder holding the same files (or set $FASTDPR_DATA_DIR)
    fastdpr data fetch --cache /data/fastdpr
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = sub.add_parser("fetch", help="fetch, verify and prepare the datasets (once)")
    fetch.add_argument("--cache", help="cache directory (default: $FASTDPR_CACHE or ~/.cache/fastdpr)")
    fetch.add_argument("--from", dest="source_dir",
                       help="take the files from this folder instead of the network (default: $FASTDPR_DATA_DIR)")
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from fastdpr.data import sources

    cache = sources.fetch(args.cache, source_dir=args.source_dir, show_progress=not args.quiet)
    prepared = sources.prepare(cache)
    print(f"cache: {cache}")
    for name, info in prepared.items():
        counts = ", ".join(f"{k} {v}" for k, v in info["counts"].items() if k != "split")
        print(f"  {name:<17} {counts}  ({cache / 'prepared' / name})")
    for name, (filename, kind, _) in sources.DATASETS.items():
        if kind == "nq_open":
            print(f"  {name:<17} questions only  ({sources.cached_path(filename, cache)})")
    for split in sources.DPR_TOPICS:
        print(f"  dpr:{split:<13} questions only  ({sources.dataset_path(cache, 'dpr:' + split)})")
    return 0
