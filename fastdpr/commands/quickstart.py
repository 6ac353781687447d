"""``fastdpr quickstart``: the whole chain on published QA data (NQ via QED, SQuAD via XQuAD, SQuADShifts) — BM25,
hard negatives, a dual encoder fine-tuned from the packaged MiniLM, encoding, indexing, BM25 / starting-model /
fine-tuned / hybrid search, a reader trained here, evaluation on held-out questions and unseen domains with paired
bootstrap intervals, and speed — with a table, ``results.json`` and a bar chart.

    fastdpr data fetch --from /path/to/qa   # once, where the machine reaches no network (else plain `data fetch`)
    fastdpr quickstart                      # benchmarks/results/quickstart.md says how long it took
    fastdpr quickstart --fast --out qs      # a smoke run on a small subset, a few minutes
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
                        help="take the published QA files from this folder instead of the network "
                             "(default: $FASTDPR_DATA_DIR; not needed once `fastdpr data fetch` filled the cache)")
    parser.add_argument("--force", action="store_true", help="redo every stage even if its output exists")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for encoding and training")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="cap the corpus; the test questions' paragraphs are always kept (0: every paragraph)")
    parser.add_argument("--train-examples", type=int, default=None,
                        help=f"training questions the dual encoder asks for, fewer where a source runs out "
                             f"(default: {full.train_examples:,}; --fast: {fast.train_examples:,})")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"questions per optimizer step (default: {full.batch_size}; --fast: {fast.batch_size}; "
                             f"above {full.chunk_size}, GradCache keeps the memory of {full.chunk_size})")
    parser.add_argument("--lr", type=float, default=None, help=f"dual-encoder learning rate (default: {full.lr:g})")
    parser.add_argument("--reader-steps", type=int, default=None,
                        help=f"steps of {full.reader_batch_size} questions x {full.reader_passages} passages to train "
                             f"the reader (default: {full.reader_steps}; --fast: {fast.reader_steps})")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from fastdpr.quickstart import QuickstartConfig, format_table, run_quickstart

    config = QuickstartConfig.preset(
        fast=args.fast, out=args.out, cache=args.cache, source_dir=args.source_dir, force=args.force,
        threads=args.threads, max_passages=args.max_passages, train_examples=args.train_examples,
        batch_size=args.batch_size, lr=args.lr,
        reader_steps=args.reader_steps,
        show_progress=not args.quiet,
    )
    results = run_quickstart(config)
    print(format_table(results))
    print(f"results: {args.out}/results.json, {args.out}/results.txt, {args.out}/results.png")
    return 0
