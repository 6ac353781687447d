"""Save, or compare, the results of many compiled IVF-PQ searches over every option the search branches on.

    python scripts/ivfpq_search_snapshot.py save [--small] [--level L] OUT.npz  # (ids, scores) of every search
    python scripts/ivfpq_search_snapshot.py save [--small] [--level L] OUT.json # ... only a digest of each
    python scripts/ivfpq_search_snapshot.py compare A B  # how many searches are bit-identical (.npz or .json)

A change to the search that should not change its results (a refactoring, a faster kernel) is checked by saving a
snapshot before it and comparing after: ids and the raw bytes of the scores must be equal, search by search. The
grid covers 4- and 8-bit codes, stored rows none/fp16/fp32, 4-bit rows (sq=4) with and without `exact`, the spread
probe order, re-rank depths below and beyond the index size, one query to batches past the re-rank batch, odd
dimensions, one-list indexes, indexes with empty lists, tied scores (duplicated rows), extreme query magnitudes and
1 or 2 threads.

Every search runs at one SIMD level (--level, default avx2, recorded in the file): the re-rank's dot products sum in
a different order at each level, so only snapshots of the same level can be bit-identical. ``--small`` keeps one
shape and fewer searches per index: the snapshot the test suite holds the search to
(tests/test_ivfpq_search_snapshot.py), kept as digests (tests/data/ivfpq/search_snapshot.json).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np

import fastdpr
from fastdpr import _C


@contextlib.contextmanager
def at_level(level: str):
    """The index core's kernels at CPU level `level` inside the block (ValueError naming it where this CPU lacks
    it); set_cpu_cap is a cap that returns the one it replaced."""
    if level != "scalar" and not fastdpr.cpu_features().get(level):  # (every CPU runs scalar kernels)
        raise ValueError(f"level={level!r}: this CPU cannot run it")
    before = _C.set_cpu_cap(level)
    try:
        yield
    finally:
        _C.set_cpu_cap(before)


def data(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    centers = rng.standard_normal((8, d)).astype(np.float32) * 2
    x = centers[rng.integers(0, 8, n)] + rng.standard_normal((n, d)).astype(np.float32)
    x[n // 2: n // 2 + n // 10] = x[: n // 10]  # duplicated rows: tied scores
    return x


def indexes(small: bool = False):
    """(name, index, its rows) over the grid of build options (one odd shape when small)."""
    shapes = [(15, 5)] if small else [(32, 8), (15, 5), (36, 9)]
    layouts = [(1, 600), (16, 1500), (32, 20)]  # (nlist, rows added): one list; many lists; most lists empty
    for (d, m), nbits, store, sq, (nlist, nadd) in itertools.product(shapes, (8, 4), ("none", "fp16", "fp32"),
                                                                      (0, 4), layouts):
        seed = len(f"{d}{m}{nbits}{store}{sq}{nlist}{nadd}") * 1009 + d * 7 + m + nbits + sq + nlist + nadd
        rng = np.random.default_rng(seed)
        train = data(rng, 512, d)
        index = _C.IVFPQ(d, nlist, m, nbits, store, False)
        index.sq = sq
        index.train(train, niter=4, pq_niter=4, seed=seed)
        x = data(rng, nadd, d)
        index.add(x)
        yield f"d{d}-m{m}-b{nbits}-{store}-sq{sq}-l{nlist}-n{nadd}", index, x, rng


def settings(rng: np.random.Generator, has_rows: bool, sq: int, small: bool = False):
    """The searches of one index: a fixed corner set and a random sample of the grid (of 6 when small)."""
    grid = list(itertools.product((1, 37, 300), (1, 10, 64), (1, 4, 100), (0, 20, 5000) if has_rows else (0,),
                                  (0, 12) if sq else (0,), (0.0, 0.5), (1, 2)))
    picks = rng.choice(len(grid), size=min(len(grid), 6 if small else 30), replace=False)
    corners = [grid[0], grid[-1]]
    return corners + [grid[i] for i in picks]


def queries(rng: np.random.Generator, x: np.ndarray, nq: int) -> np.ndarray:
    q = rng.standard_normal((nq, x.shape[1])).astype(np.float32)
    q[::3] = x[rng.integers(0, len(x), len(q[::3]))]  # queries equal to stored rows
    if nq > 5:
        q[5] *= np.float32(1e37)  # searched at a scaled magnitude, scores scaled back
    return q


def snapshot(small: bool = False, level: str = "avx2") -> dict[str, np.ndarray]:
    """Every search's ids and scores, run at SIMD level `level` (the level in use is restored after)."""
    with at_level(level):
        out = _searches(small)
    out["level"] = np.array(level)
    return out


def _searches(small: bool) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, index, x, rng in indexes(small):
        sq = index.sq
        for nq, k, nprobe, rerank, exact, spread, threads in settings(rng, index.store != "none" or sq > 0, sq,
                                                                        small):
            q = queries(rng, x, nq)
            scores, ids = index.search(q, k, nprobe, rerank, threads, spread, exact)
            key = f"{name}/q{nq}-k{k}-p{nprobe}-r{rerank}-e{exact}-s{spread}-t{threads}"
            out[key + "/ids"] = np.asarray(ids)
            out[key + "/scores"] = np.asarray(scores)
    return out


def digests(snap) -> dict[str, str]:
    """Per search the sha256 of its ids (int64) and the raw bytes of its scores (float32), and "level"."""
    out = {"level": str(snap["level"])}
    for k in sorted({k.rsplit("/", 1)[0] for k in snap if k != "level"}):
        ids = np.ascontiguousarray(snap[k + "/ids"], dtype=np.int64)
        scores = np.ascontiguousarray(snap[k + "/scores"], dtype=np.float32)
        out[k] = hashlib.sha256(ids.tobytes() + scores.tobytes()).hexdigest()
    return out


def load(path: str) -> dict[str, str]:
    """The digests of a saved snapshot: a .json of digests, or an .npz of arrays."""
    if path.endswith(".json"):
        return json.loads(Path(path).read_text())
    with np.load(path) as f:
        return digests({k: f[k] for k in f.files})


def differences(a: dict[str, str], b: dict[str, str]) -> tuple[int, list[str]]:
    """(searches compared, the names of those whose ids or score bytes differ) of two snapshots' digests; a search
    held by only one of them differs."""
    if a["level"] != b["level"]:
        raise ValueError(f"the snapshots ran at different SIMD levels: {a['level']} vs {b['level']}")
    keys = sorted((set(a) | set(b)) - {"level"})
    differ = [k for k in keys if a.get(k) is None or a.get(k) != b.get(k)]
    return len(keys), differ


def compare(a_path: str, b_path: str) -> int:
    try:
        total, differ = differences(load(a_path), load(b_path))
    except ValueError as exc:  # snapshots of two levels: nothing to compare
        print(exc)
        return 1
    print(f"{total - len(differ)} of {total} searches bit-identical")
    for k in differ[:20]:
        print("differs:", k)
    return 1 if differ else 0


def save(path: str, small: bool, level: str) -> int:
    snap = snapshot(small, level)
    if path.endswith(".json"):
        Path(path).write_text(json.dumps(digests(snap), indent=0, sort_keys=True) + "\n")
    else:
        np.savez_compressed(path, **snap)
    print(f"{(len(snap) - 1) // 2} searches at {level} saved to {path}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["save"] and len(argv) in (2, 3, 4, 5):
        small = "--small" in argv
        rest = [a for a in argv[1:] if a != "--small"]
        level = "avx2"
        if len(rest) == 3 and rest[0] == "--level":
            level, rest = rest[1], rest[2:]
        if len(rest) == 1:
            return save(rest[0], small, level)
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
