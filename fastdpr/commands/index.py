"""``fastdpr index VECTORS_DIR -o INDEX --spec SPEC``: build a MIPS index from the encoder's shards, streaming them
one at a time (the vectors are held once, in the index)."""
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
    import sys
    import time

    import numpy as np

    from fastdpr.encode import iter_vector_shards, read_manifest
    from fastdpr.errors import InputError
    from fastdpr.index import make_index
    from fastdpr.index.auto import choose_index, parse_size

    if args.train_size < 1:
        raise InputError(f"--train-size must be >= 1, got {args.train_size}")
    budget = None if args.memory_budget is None else parse_size(args.memory_budget, "--memory-budget")
    if not 0 < args.target_recall <= 1:  # (NaN fails this too)
        raise InputError(f"--target-recall must be in (0, 1], got {args.target_recall}")
    if args.tune_k < 1:
        raise InputError(f"--tune-k must be >= 1, got {args.tune_k}")
    manifest = read_manifest(args.vectors)
    total, dim = int(manifest["count"]), int(manifest["dim"])
    if total == 0:
        raise InputError("no vectors to index", path=str(args.vectors))
    queries = None if args.tune_queries is None else _tune_queries(args.tune_queries, args.vectors, total, dim,
                                                                   args.seed, args.verify)
    if args.on_disk:
        if queries is not None:
            raise InputError("--tune-queries: tune an --on-disk index after it is built (tuning rewrites the file)")
        return _build_on_disk(args, manifest, total, dim)
    if args.spec.split(",")[0].strip().lower() == "auto":
        choice = choose_index(total, dim, budget)
        print(f"auto: {choice.spec} ({choice.reason})" + ("; open it with --mmap" if choice.mmap else ""))
    index = make_index(args.spec, dim, n_hint=total, memory_budget=budget)
    if queries is not None:
        from fastdpr.index.tune import TUNERS

        if index.kind not in TUNERS:  # said before the build, not after it
            raise InputError(f"--tune-queries: {index.kind} indexes are not tuned (ivfpq is; flat is exact)")
    index.model_fingerprint = manifest.get("model_fingerprint")  # searches with another model are refused
    start = time.perf_counter()

    if not index.is_trained:
        index.train(_training_sample(args.vectors, total, args.train_size, args.seed, args.verify))

    from fastdpr.progress import progress

    with progress(total=total, unit="vec", desc="index", enabled=not args.no_progress) as bar:
        for shard in iter_vector_shards(args.vectors, verify=args.verify):
            n = len(shard.ids)
            # ids are corpus rows; they equal the index's own row numbers when shards start at row 0
            ids = None if shard.row_start == len(index) else np.arange(shard.row_start, shard.row_start + n)
            index.add(shard.vectors, ids=ids)
            bar.update(n)
    if queries is not None:
        result = index.tune(queries, target_recall=args.target_recall, k=args.tune_k)
        settings = ", ".join(f"{key}={value}" for key, value in result.params.items()) or "exact search"
        confirmed = f" (confirmed on {result.confirmed_on} of them)" if result.confirmed_on else ""
        print(f"tuned on {result.queries} queries{confirmed}: {settings}, recall@{args.tune_k} {result.recall:.4f} "
              f"(target {args.target_recall})")
    path = index.save(args.output)
    elapsed = time.perf_counter() - start
    print(f"{index.kind} index of {len(index)} vectors (dim {index.dim}) written to {path} in {elapsed:.1f} s")
    return 0


def _build_on_disk(args, manifest: dict, total: int, dim: int) -> int:
    import time
    from pathlib import Path

    from fastdpr.encode import iter_vector_shards
    from fastdpr.errors import InputError
    from fastdpr.index.base import INDEX_FILE_NAME
    from fastdpr.index.disk_build import IVFPQDiskBuilder
    from fastdpr.progress import progress

    out = Path(args.output)
    if out.is_dir() or str(args.output).endswith("/"):
        out = out / INDEX_FILE_NAME
    start = time.perf_counter()
    builder = IVFPQDiskBuilder(out, dim, args.spec)  # refuses a spec that is not ivfpq with fp16 rows
    with progress(total=total, unit="vec", desc="rows to disk", enabled=not args.no_progress) as bar:
        bar.update(builder.rows)
        for shard in iter_vector_shards(args.vectors, verify=args.verify):
            n = len(shard.ids)
            if shard.row_start + n <= builder.rows:  # appended by an earlier, interrupted run
                continue
            if shard.row_start != builder.rows:
                raise InputError(f"--on-disk: a shard starts at row {shard.row_start}, expected {builder.rows} "
                                 "(the rows must follow one another from 0)", path=str(args.vectors))
            builder.append(shard.vectors)
            bar.update(n)
    builder.train(sample=min(args.train_size, total), seed=args.seed, show_progress=not args.no_progress)
    builder.add(show_progress=not args.no_progress)
    path = builder.finish(model_fingerprint=manifest.get("model_fingerprint"))
    print(f"ivfpq index of {total} vectors (dim {dim}, fp16 rows on disk) written to {path} in "
          f"{time.perf_counter() - start:.1f} s; open it with --mmap")
    return 0


def _tune_queries(value: str, vectors_dir, total: int, dim: int, seed: int, verify: bool):
    """--tune-queries: a .npy file, a `fastdpr encode` directory, or a count of the indexed vectors to draw."""
    from pathlib import Path

    import numpy as np

    from fastdpr.encode import iter_vector_shards
    from fastdpr.errors import InputError

    if value.strip().isdigit():
        count = int(value)
        if count < 1:
            raise InputError(f"--tune-queries must be at least 1 vector, got {value}")
        return _training_sample(vectors_dir, total, count, seed + 1, verify)
    path = Path(value)
    if path.is_dir():
        queries = np.concatenate([np.asarray(s.vectors, dtype=np.float32)
                                  for s in iter_vector_shards(path, verify=verify)])
    elif path.is_file():
        try:
            queries = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputError(f"--tune-queries: not a .npy array of query vectors: {exc}", path=str(path)) from None
    else:
        raise InputError("--tune-queries: no such file or directory (or give a number of indexed vectors)",
                         path=str(path))
    if queries.ndim != 2 or queries.shape[1] != dim or queries.shape[0] == 0:
        raise InputError(f"--tune-queries must hold (n >= 1, {dim}) vectors, got shape {queries.shape}",
                         path=str(path))
    return queries


def _training_sample(vectors_dir, total: int, size: int, seed: int, verify: bool):
    """Up to ``size`` rows drawn uniformly without replacement across all shards, as float32."""
    import numpy as np

    from fastdpr.encode import iter_vector_shards

    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(total, size=min(size, total), replace=False))
    parts, offset = [], 0
    for shard in iter_vector_shards(vectors_dir, verify=verify):
        n = shard.vectors.shape[0]
        lo, hi = np.searchsorted(chosen, [offset, offset + n])
        if hi > lo:
            parts.append(np.asarray(shard.vectors[chosen[lo:hi] - offset], dtype=np.float32))
        offset += n
    return np.concatenate(parts)
