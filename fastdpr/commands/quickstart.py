"""``fastdpr quickstart``: the whole chain on real data shipped in packages — BM25, hard negatives, a dual encoder
fine-tuned from the packaged MiniLM, encoding, indexing, BM25 / starting-model / fine-tuned / hybrid search, a
reader, evaluation on held-out questions and speed — with a table, ``results.json`` and a bar chart.

    fastdpr quickstart                 # about 5 minutes on 2 idle CPU cores with the data cached
    fastdpr quickstart --fast --out qs # a smoke run on a small subset, under a minute
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # the defaults shown are the run's own (QuickstartConfig), so help and run cannot disagree
    from fastdpr.quickstart.config import QuickstartConfig

    full, fast = QuickstartConfig.preset(), QuickstartConfig.preset(fast=True)
    parser.add_argument("--fast", action="store_true", help="small subset, few steps: a smoke run of a few minutes")
    parser.add_argument("-o", "--out", default="quickstart", help="output directory (default: ./quickstart)")
    parser.add_argument("--cache", default=None, help="data cache (default: $FASTDPR_CACHE or ~/.cache/fastdpr)")
    parser.add_argument("--from", dest="source_dir", default=None,
                        help="take the data archives from this local directory instead of the package index")
    parser.add_argument("--force", action="store_true", help="redo every stage even if its output exists")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for encoding and training")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="cap the passage pool; gold passages are always kept (0: every passage)")
    parser.add_argument("--train-examples", type=int, default=None,
                        help=f"training questions the dual encoder sees (default: {full.train_examples:,}; "
                             f"--fast: {fast.train_examples:,})")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"questions per optimizer step (default: {full.batch_size}; --fast: {fast.batch_size}; "
                             f"above {full.chunk_size}, GradCache keeps the memory of {full.chunk_size})")
    parser.add_argument("--lr", type=float, default=None, help=f"dual-encoder learning rate (default: {full.lr:g})")
    parser.add_argument("--reader-steps", type=int, default=None,
                        help=f"steps of {full.reader_batch_size} questions x {full.reader_passages} passages to train "
                             f"the reader when the reader benchmark's is not cached (default: {full.reader_steps}; "
                             f"--fast: {fast.reader_steps})")
    parser.add_argument("--train-reader", action="store_true",
                        help="train the reader here even when the reader benchmark's reader is in the cache")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from fastdpr.quickstart import QuickstartConfig, format_table, run_quickstart

    config = QuickstartConfig.preset(
        fast=args.fast, out=args.out, cache=args.cache, source_dir=args.source_dir, force=args.force,
        threads=args.threads, max_passages=args.max_passages, train_examples=args.train_examples,
        batch_size=args.batch_size, lr=args.lr,
        reader_steps=args.reader_steps, reader_from_cache=False if args.train_reader else None,
        show_progress=not args.quiet,
    )
    results = run_quickstart(config)
    print(format_table(results))
    print(f"results: {args.out}/results.json, {args.out}/results.txt, {args.out}/results.png")
    return 0
