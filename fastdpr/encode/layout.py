"""How an encoding is split among workers, and what identifies a run (the files themselves:
``fastdpr.data.vectors``)."""
from __future__ import annotations

import math
import os
import re

from fastdpr.errors import InputError

# fields that must agree between a resumed run and the directory it resumes
_IDENTITY = ("format", "version", "dim", "dtype", "model_fingerprint", "corpus_rows", "shard_size", "worker",
             "rows", "max_length", "pooling", "similarity", "precision")


def parse_shard_spec(spec: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if not match:
        raise InputError(f"--shard must look like i/n (e.g. 0/4), got {spec!r}")
    i, n = int(match.group(1)), int(match.group(2))
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard {spec}: need 0 <= i < n")
    return i, n


def worker_from_env() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) under torchrun, else (0, 1)."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise InputError("RANK / WORLD_SIZE must be integers") from None


def worker_shards(corpus_rows: int, shard_size: int, worker: int, workers: int) -> range:
    """The global shard indices worker ``worker`` of ``workers`` owns (a contiguous block)."""
    total = math.ceil(corpus_rows / shard_size)
    return range(worker * total // workers, (worker + 1) * total // workers)
