"""``fastdpr data fetch``: download the real datasets shipped in packages (bigbench sdist, pyserini wheel) into a
cache, check their sha256, extract the needed members and write them in the project's formats.

    fastdpr data fetch                       # into $FASTDPR_CACHE or ~/.cache/fastdpr
    fastdpr data fetch --cache /data/fastdpr --from /mirror/wheels
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = sub.add_parser("fetch", help="download, verify, extract and prepare the datasets (once)")
    fetch.add_argument("--cache", help="cache directory (default: $FASTDPR_CACHE or ~/.cache/fastdpr)")
    fetch.add_argument(
        "--from",
        dest="source_dir",
        help="take the archives from this local directory instead of the package index",
    )
    fetch.add_argument("--index-url", help="package index (default: $PIP_INDEX_URL or https://pypi.org/simple/)")
    fetch.add_argument("--no-topics", action="store_true", help="skip the DPR question files (pyserini wheel)")
    fetch.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from fastdpr.data import sources

    cache = sources.fetch(
        args.cache,
        source_dir=args.source_dir,
        index_url=args.index_url,
        show_progress=not args.quiet,
        with_topics=not args.no_topics,
    )
    prepared = sources.prepare(cache)
    print(f"cache: {cache}")
    for name, info in prepared.items():
        counts = ", ".join(f"{k} {v}" for k, v in info["counts"].items())
        print(f"  {name:<10} {counts}  ({cache / 'prepared' / name})")
    if not args.no_topics:
        for split in sources.DPR_TOPICS:
            print(f"  dpr:{split:<13} {sources.member_path(cache, 'dpr:' + split)}")
    return 0
