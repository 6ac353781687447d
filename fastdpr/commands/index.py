"""``fastdpr index VECTORS_DIR -o INDEX --spec SPEC``: build a MIPS index from the encoder's shards, streaming them
one at a time (the vectors are held once, in the index)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("vectors", help="directory written by `fastdpr encode` (manifest.json + shards)")
    parser.add_argument("-o", "--output", required=True,
                        help="index file (*.fdpr) or directory (index.fdpr is written inside)")
    parser.add_argument("--spec", default="auto",
                        help="index spec: flat | flat,fp16 | hnsw,M=32,efc=200[,fp16] | ivfpq,nlist=..,m=.. | "
                             "faiss:<factory> | auto (flat below 100k vectors, else hnsw); default: auto")
    parser.add_argument("--train-size", type=int, default=100_000,
                        help="vectors sampled for training (IVF-PQ, FAISS IVF); default 100000")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training sample")
    parser.add_argument("--verify", action="store_true", help="check every shard's checksum while reading")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    import numpy as np

    from fastdpr.encode import iter_vector_shards, read_manifest
    from fastdpr.errors import InputError
    from fastdpr.index import make_index

    if args.train_size < 1:
        raise InputError(f"--train-size must be >= 1, got {args.train_size}")
    manifest = read_manifest(args.vectors)
    total, dim = int(manifest["count"]), int(manifest["dim"])
    if total == 0:
        raise InputError("no vectors to index", path=str(args.vectors))
    index = make_index(args.spec, dim, n_hint=total)
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
    path = index.save(args.output)
    elapsed = time.perf_counter() - start
    print(f"{index.kind} index of {len(index)} vectors (dim {index.dim}) written to {path} in {elapsed:.1f} s")
    return 0


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
