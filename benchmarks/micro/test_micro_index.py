"""Search of each index type (flat, HNSW, IVF-PQ + exact re-rank) on one small synthetic set, one thread.

The data is the non-normalised Gaussian mixture of ``fastdpr.index.synthetic`` (the case inner-product graphs
find hard), 20,000 x 128 with 200 queries; each index is built once per session. Each benchmark also checks
recall@100 against exact search, so a faster search that finds less fails.
"""
import numpy as np
import pytest

from fastdpr.index import build_index
from fastdpr.index.synthetic import gaussian_mixture, recall_at

N, DIM, QUERIES, K = 20_000, 128, 200, 100
# spec, search parameters, the recall@100 it must reach (measured: 1.0, 0.972, 0.998 on this data)
INDEXES = {
    "flat": ("flat", {}, 1.0),
    "hnsw": ("hnsw,M=16,efc=100", {"ef": 128}, 0.95),
    "ivfpq": ("ivfpq,nlist=128,m=16,store=fp16", {"nprobe": 16, "rerank": 200}, 0.97),
}


@pytest.fixture(scope="session")
def vectors():
    base, queries = gaussian_mixture(N, DIM, n_queries=QUERIES, seed=0)
    truth = build_index(base, "flat").search(queries, K, threads=1)[1]
    return base, queries, truth


@pytest.fixture(scope="session")
def built(vectors):
    base = vectors[0]
    return {name: build_index(base, spec) for name, (spec, _, _) in INDEXES.items()}


@pytest.mark.parametrize("name", list(INDEXES))
def test_index_search(benchmark, vectors, built, name):
    _, queries, truth = vectors
    _, params, floor = INDEXES[name]
    benchmark.group = f"index search {N}x{DIM}, {QUERIES} queries, k={K}, 1 thread"
    benchmark.extra_info.update(spec=INDEXES[name][0], params=params)
    scores, ids = benchmark(built[name].search, queries, K, threads=1, **params)
    assert ids.shape == (QUERIES, K) and np.all(np.diff(scores, axis=1) <= 0)
    assert recall_at(ids, truth, K) >= floor
