"""``fastdpr index VECTORS_DIR -o INDEX --spec SPEC``: build a MIPS index from the encoder's shards, streaming them
one at a time (the vectors are held once, in the index): ``fastdpr.index.index_from_vectors``. Needs no torch."""
from __future__ import annotations

import argparse

# what `fastdpr` adds when this command is interrupted (Ctrl-C, SIGTERM)
ON_INTERRUPT = "an --on-disk build resumes when rerun with the same output; any other build starts over"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("vectors", help="directory written by `fastdpr encode` (manifest.json + shards)")
    parser.add_argument("-o", "--output", required=True,
                        help="index file (*.fdpr) or directory (index.fdpr is written inside)")
    parser.add_argument("--spec", default="auto",
                        help="index spec: flat | flat,fp16 | hnsw,M=32,efc=200[,fp16] | ivfpq,nlist=..,m=.. | "
                             "faiss:<factory> | auto (the type and shape from the number of vectors, their "
                             "dimension and --memory-budget: exact search for small sets, else 4-bit IVF-PQ); "
                             "default: auto")
    parser.add_argument("--memory-budget", default=None,
                        help="RAM the 'auto' index may use, e.g. 2GB or 512MiB: rows that do not fit are left in "
                             "the file, to be opened with --mmap (default: no limit)")
    parser.add_argument("--tune-queries", default=None,
                        help="tune the index's search settings on these queries: a .npy file (n, dim), a "
                             "`fastdpr encode` output directory, or a number N (N of the indexed vectors); the "
                             "settings are saved in the index and used by every search that gives none")
    parser.add_argument("--target-recall", type=float, default=0.95,
                        help="recall@k against exact search that --tune-queries must reach, with a margin of two "
                             "standard errors of its mean; default 0.95")
    parser.add_argument("--tune-k", type=int, default=100, help="the k of that recall; default 100")
    parser.add_argument("--train-size", type=int, default=100_000,
                        help="vectors sampled for training (IVF-PQ, FAISS IVF); default 100000")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training sample")
    parser.add_argument("--verify", action="store_true", help="check every shard's checksum while reading")
    parser.add_argument("--on-disk", action="store_true",
                        help="ivfpq only: stream the rows into the index file as fp16 and keep only the codes (and "
                             "4-bit rows) in memory while building, for more vectors than RAM holds; resumes an "
                             "interrupted build of the same output (its state is in OUTPUT.build/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from fastdpr.data.vectors import read_manifest
    from fastdpr.errors import InputError
    from fastdpr.index import index_from_vectors
    from fastdpr.index.auto import choose_index, parse_size

    # the library checks these too, naming its parameters; here the flags are named
    if args.train_size < 1:
        raise InputError(f"--train-size must be >= 1, got {args.train_size}")
    if not 0 < args.target_recall <= 1:  # (NaN fails this too)
        raise InputError(f"--target-recall must be in (0, 1], got {args.target_recall}")
    if args.tune_k < 1:
        raise InputError(f"--tune-k must be >= 1, got {args.tune_k}")
    if args.on_disk and args.tune_queries is not None:
        raise InputError("--tune-queries: tune an --on-disk index after it is built (tuning rewrites the file)")
    budget = None if args.memory_budget is None else parse_size(args.memory_budget, "--memory-budget")
    tune_queries = args.tune_queries
    if tune_queries is not None and tune_queries.strip().isdigit():  # a count of the indexed vectors
        tune_queries = int(tune_queries)
    if args.spec.split(",")[0].strip().lower() == "auto" and not args.on_disk:  # said before the build
        manifest = read_manifest(args.vectors)
        if manifest["count"]:
            choice = choose_index(manifest["count"], manifest["dim"], budget)
            print(f"auto: {choice.spec} ({choice.reason})" + ("; open it with --mmap" if choice.mmap else ""))
    built = index_from_vectors(args.vectors, args.spec, args.output, memory_budget=budget,
                               train_size=args.train_size, seed=args.seed, verify=args.verify,
                               tune_queries=tune_queries, target_recall=args.target_recall, tune_k=args.tune_k,
                               on_disk=args.on_disk, show_progress=not args.no_progress)
    if built.tuned is not None:
        result = built.tuned
        settings = ", ".join(f"{key}={value}" for key, value in result.params.items()) or "exact search"
        confirmed = f" (confirmed on {result.confirmed_on} of them)" if result.confirmed_on else ""
        print(f"tuned on {result.queries} queries{confirmed}: {settings}, recall@{args.tune_k} {result.recall:.4f} "
              f"(target {args.target_recall})")
    if args.on_disk:
        print(f"ivfpq index of {built.count} vectors (dim {built.dim}, fp16 rows on disk) written to {built.path} "
              f"in {built.seconds:.1f} s; open it with --mmap")
    else:
        print(f"{built.kind} index of {built.count} vectors (dim {built.dim}) written to {built.path} in "
              f"{built.seconds:.1f} s")
    return 0
