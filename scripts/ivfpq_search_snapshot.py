"""Save, or compare, the results of many compiled IVF-PQ searches over every option the search branches on.

    python scripts/ivfpq_search_snapshot.py save OUT.npz       # (ids, scores) of every search
    python scripts/ivfpq_search_snapshot.py compare A.npz B.npz  # how many searches are bit-identical

A change to the search that should not change its results (a refactoring, a faster kernel) is checked by saving a
snapshot before it and comparing after: ids and the raw bytes of the scores must be equal, search by search. The
grid covers 4- and 8-bit codes, stored rows none/fp16/fp32, 4-bit rows (sq=4) with and without `exact`, the spread
probe order, re-rank depths below and beyond the index size, one query to batches past the re-rank batch, odd
dimensions, one-list indexes, indexes with empty lists, tied scores (duplicated rows), extreme query magnitudes and
1 or 2 threads.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from fastdpr import _C


def data(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    centers = rng.standard_normal((8, d)).astype(np.float32) * 2
    x = centers[rng.integers(0, 8, n)] + rng.standard_normal((n, d)).astype(np.float32)
    x[n // 2: n // 2 + n // 10] = x[: n // 10]  # duplicated rows: tied scores
    return x


def indexes():
    """(name, index, its rows) over the grid of build options."""
    shapes = [(32, 8), (15, 5), (36, 9)]
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


def settings(rng: np.random.Generator, has_rows: bool, sq: int):
    """The searches of one index: a fixed corner set and a random sample of the grid."""
    grid = list(itertools.product((1, 37, 300), (1, 10, 64), (1, 4, 100), (0, 20, 5000) if has_rows else (0,),
                                  (0, 12) if sq else (0,), (0.0, 0.5), (1, 2)))
    picks = rng.choice(len(grid), size=min(len(grid), 30), replace=False)
    corners = [grid[0], grid[-1]]
    return corners + [grid[i] for i in picks]


def queries(rng: np.random.Generator, x: np.ndarray, nq: int) -> np.ndarray:
    q = rng.standard_normal((nq, x.shape[1])).astype(np.float32)
    q[::3] = x[rng.integers(0, len(x), len(q[::3]))]  # queries equal to stored rows
    if nq > 5:
        q[5] *= np.float32(1e37)  # searched at a scaled magnitude, scores scaled back
    return q


def snapshot() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, index, x, rng in indexes():
        sq = index.sq
        for nq, k, nprobe, rerank, exact, spread, threads in settings(rng, index.store != "none" or sq > 0, sq):
            q = queries(rng, x, nq)
            scores, ids = index.search(q, k, nprobe, rerank, threads, spread, exact)
            key = f"{name}/q{nq}-k{k}-p{nprobe}-r{rerank}-e{exact}-s{spread}-t{threads}"
            out[key + "/ids"] = np.asarray(ids)
            out[key + "/scores"] = np.asarray(scores)
    return out


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    keys = sorted({k.rsplit("/", 1)[0] for k in a.files})
    if set(a.files) != set(b.files):
        print(f"the snapshots hold different searches: {len(a.files)} vs {len(b.files)} arrays")
        return 1
    differ = [k for k in keys if not (np.array_equal(a[k + "/ids"], b[k + "/ids"]) and
                                      a[k + "/scores"].tobytes() == b[k + "/scores"].tobytes())]
    print(f"{len(keys) - len(differ)} of {len(keys)} searches bit-identical")
    for k in differ[:20]:
        print("differs:", k)
    return 1 if differ else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "save":
        snap = snapshot()
        np.savez_compressed(argv[1], **snap)
        print(f"{len(snap) // 2} searches saved to {argv[1]}")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
