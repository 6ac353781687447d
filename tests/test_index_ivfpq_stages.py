"""The stages of the compiled IVF-PQ search (csrc/ivfpq_search.h), each held to its contract through the public API:
the probe picks the lists, the scanners score every row of them and the collectors keep the best, the re-rank chain
re-scores by the 4-bit rows before the stored vectors, and batching, threads, empty lists and short results change
nothing. Random data on several seeds and odd shapes; small sizes, so the file runs in seconds."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import extension

from fastdpr.index import numpy_pq4

_C = extension("IVFPQ")
pytestmark = pytest.mark.skipif(_C is None, reason="compiled extension not built")

SEEDS = (0, 1, 2)
SHAPES = ((32, 8), (15, 5), (36, 9))  # (d, m): odd dimensions, odd sub-spaces


def rows(rng, n, d):
    centres = 2 * rng.standard_normal((8, d)).astype(np.float32)
    return centres[rng.integers(0, 8, n)] + rng.standard_normal((n, d)).astype(np.float32)


def build(d, m, nbits, store="none", sq=0, nlist=16, n=1200, seed=0, trained=None):
    """An index over n random rows: trained on its own sample, or set to `trained` (centroids, codebooks)."""
    rng = np.random.default_rng(seed)
    index = _C.IVFPQ(d, nlist, m, nbits, store, False)
    index.sq = sq
    sample = rows(rng, 512, d)
    if trained is None:
        index.train(sample, niter=5, pq_niter=5, seed=seed)
    else:
        index.set_trained(*trained)
    x = rows(rng, n, d)
    index.add(x)
    return index, x, rows(rng, 40, d)


def found(ids):
    return [set(int(i) for i in row if i >= 0) for row in ids]


def probed(index, q, nprobe, spread):
    """The lists the probe stage should visit: the nprobe largest <q, c> + spread |q| s_l."""
    order = q.astype(np.float64) @ index.centroids().astype(np.float64).T
    s = np.array([index.list_spread(l) for l in range(index.nlist)])
    order += spread * np.linalg.norm(q.astype(np.float64), axis=1, keepdims=True) * s
    return np.argsort(-order, axis=1, kind="stable")[:, :nprobe]


def assert_top_by(scores, ids, q, score, candidates, tol=1e-4):
    """Each query's results are its candidates' best by score(query, positions) (up to near ties), with those
    scores."""
    for i in range(len(q)):
        got = ids[i][ids[i] >= 0]
        assert set(got.tolist()) <= candidates[i]
        want = score(q[i], got)
        np.testing.assert_allclose(scores[i][: len(got)], want, rtol=tol, atol=tol)
        rest = np.array(sorted(candidates[i] - set(got.tolist())), dtype=np.int64)
        assert len(got) == min(ids.shape[1], len(candidates[i]))
        if len(rest) and len(got):
            assert score(q[i], rest).max() <= want.min() + tol * (1 + abs(want.min()))


def assert_top_by_exact(scores, ids, q, x, candidates):
    assert_top_by(scores, ids, q, lambda qv, p: x[p] @ qv, candidates)


# --- probe and scan ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits", (8, 4))
@pytest.mark.parametrize("spread", (0.0, 3.0))
def test_probe_visits_the_lists_of_largest_score_and_scan_keeps_all_their_rows(seed, nbits, spread):
    d, m = SHAPES[seed]
    index, x, q = build(d, m, nbits, seed=seed)
    nprobe = 3
    scores, ids = index.search(q, len(x), nprobe, 0, 1, spread, 0)
    lists = probed(index, q, nprobe, spread)
    for i, got in enumerate(found(ids)):
        want = set(np.concatenate([index.list_positions(int(l)) for l in lists[i]]).tolist())
        assert got == want
        assert np.all(ids[i][len(want):] == -1) and np.all(np.isneginf(scores[i][len(want):]))
        assert np.all(np.diff(scores[i][: len(want)]) <= 0)  # best first


def test_spread_changes_the_probe_order():
    index, x, q = build(32, 8, 8, seed=3)
    plain, spread = probed(index, q, 3, 0.0), probed(index, q, 3, 3.0)
    assert not np.array_equal(np.sort(plain, axis=1), np.sort(spread, axis=1))  # the test above can tell them apart


@pytest.mark.parametrize("seed", SEEDS)
def test_8bit_scanner_scores_are_the_table_sums(seed):
    d, m = SHAPES[seed]
    index, x, q = build(d, m, 8, seed=seed)
    scores, ids = index.search(q, 20, 4, 0, 1, 0.0, 0)
    cent, books = index.centroids().astype(np.float64), index.codebooks().astype(np.float64)
    list_of, code_of = {}, {}
    for l in range(index.nlist):
        for p, c in zip(index.list_positions(l), index.list_codes(l)):
            list_of[int(p)], code_of[int(p)] = l, c
    dsub = d // m
    for i in range(len(q)):
        qs = q[i].astype(np.float64).reshape(m, dsub)
        for s, p in zip(scores[i], ids[i]):
            if p < 0:
                break
            want = cent[list_of[int(p)]] @ q[i] + sum(books[j, code_of[int(p)][j]] @ qs[j] for j in range(m))
            assert s == pytest.approx(want, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("nbits", (8, 4))
@pytest.mark.parametrize("store,sq", [("none", 0), ("fp32", 0), ("fp16", 4), ("none", 4)])
def test_k_beyond_the_candidates_pads_and_empty_lists_are_skipped(nbits, store, sq):
    index, x, q = build(15, 5, nbits, store, sq, nlist=32, n=20, seed=4)  # most of the 32 lists empty
    assert sum(len(index.list_positions(l)) == 0 for l in range(index.nlist)) > 10
    rerank = 0 if store == "none" and not sq else 500
    scores, ids = index.search(q, 50, 32, rerank, 1, 0.0, 8 if sq else 0)
    for i, got in enumerate(found(ids)):
        assert got == set(range(20))
        assert np.all(ids[i][20:] == -1) and np.all(np.isneginf(scores[i][20:]))


@pytest.mark.parametrize("nbits", (8, 4))
def test_an_empty_index_finds_nothing(nbits):
    index, x, q = build(32, 8, nbits, "fp32", 4, n=0)
    scores, ids = index.search(q, 5, 16, 10, 1, 0.5, 3)
    assert np.all(ids == -1) and np.all(np.isneginf(scores))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits", (8, 4))
@pytest.mark.parametrize("store", ("fp16", "fp32"))
def test_one_list_index_reranked_over_everything_is_exact_search(seed, nbits, store):
    d, m = SHAPES[seed]
    index, x, q = build(d, m, nbits, store, nlist=1, n=300, seed=seed)
    scores, ids = index.search(q, 10, 5, 300, 1, 0.5, 0)  # nprobe beyond nlist: the one list
    xs = x.astype(np.float16).astype(np.float32) if store == "fp16" else x
    assert_top_by_exact(scores, ids, q, xs, [set(range(300))] * len(q))


# --- the re-rank chain ---------------------------------------------------------------------------------------------

def scan_candidates(index, q, nprobe, kc):
    """The scan stage's candidates: a search without re-rank that keeps kc."""
    return found(index.search(q, kc, nprobe, 0, 1, 0.0, 0)[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits", (8, 4))
@pytest.mark.parametrize("store", ("fp16", "fp32"))
def test_vectors_rerank_the_scan_candidates(seed, nbits, store):
    d, m = SHAPES[seed]
    index, x, q = build(d, m, nbits, store, seed=seed)
    kc = 60
    scores, ids = index.search(q, 10, 4, kc, 1, 0.0, 0)
    xs = x.astype(np.float16).astype(np.float32) if store == "fp16" else x
    assert_top_by_exact(scores, ids, q, xs, scan_candidates(index, q, 4, kc))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits", (8, 4))
def test_4bit_rows_cut_before_the_vectors(seed, nbits):
    """The chain's order: the 4-bit rows keep the best `exact` of the scan's candidates, the vectors rank those."""
    d, m = SHAPES[seed]
    first, _, _ = build(d, m, nbits, seed=seed)
    trained = (first.centroids(), first.codebooks())
    full, x, q = build(d, m, nbits, "fp32", 4, seed=seed + 10, trained=trained)
    rows_only, _, _ = build(d, m, nbits, "none", 4, seed=seed + 10, trained=trained)  # the same rows
    k, kc, exact = 5, 80, 7
    cut = found(rows_only.search(q, exact, 4, kc, 1, 0.0, 0)[1])  # without vectors: the 4-bit stage's answer
    assert all(c <= s for c, s in zip(cut, scan_candidates(full, q, 4, kc)))
    scores, ids = full.search(q, k, 4, kc, 1, 0.0, exact)
    assert_top_by_exact(scores, ids, q, x, cut)
    # exact at or past the candidates: the 4-bit rows cut nothing, the same as without them
    whole = full.search(q, k, 4, kc, 1, 0.0, kc)
    np.testing.assert_array_equal(whole[1], full.search(q, k, 4, kc, 1, 0.0, 0)[1])
    assert_top_by_exact(whole[0], whole[1], q, x, scan_candidates(full, q, 4, kc))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits", (8, 4))
def test_4bit_rows_without_vectors_give_the_answer(seed, nbits):
    d, m = SHAPES[seed]
    index, x, q = build(d, m, nbits, "none", 4, seed=seed)
    kc = 70
    scores, ids = index.search(q, 10, 4, kc, 1, 0.0, 3)  # `exact` has no stage to feed: k results
    rows, (lo, step) = index.sq_rows(), index.sq_ranges()
    assert_top_by(scores, ids, q, lambda qv, p: numpy_pq4.row_scores(qv, rows[p], lo, step),
                  scan_candidates(index, q, 4, kc))


# --- batching and threads ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nbits,store,sq,exact", [(8, "fp32", 0, 0), (4, "fp16", 4, 12), (4, "none", 4, 0),
                                                  (8, "none", 0, 0)])
def test_batches_and_threads_change_nothing(seed, nbits, store, sq, exact):
    """The re-rank visits a batch's candidates in row order, threads take parts: each query's list is its own."""
    d, m = SHAPES[seed]
    index, x, _ = build(d, m, nbits, store, sq, seed=seed)
    q = rows(np.random.default_rng(seed + 100), 300, d)  # past one re-rank batch
    rerank = 0 if store == "none" and not sq else 40
    batch = index.search(q, 7, 5, rerank, 1, 0.5, exact)
    for threads in (1, 2):
        alone = [index.search(q[i:i + 1], 7, 5, rerank, threads, 0.5, exact) for i in range(0, 300, 23)]
        np.testing.assert_array_equal(np.concatenate([a[1] for a in alone]), batch[1][::23])
        np.testing.assert_array_equal(np.concatenate([a[0] for a in alone]), batch[0][::23])
    two = index.search(q, 7, 5, rerank, 2, 0.5, exact)
    np.testing.assert_array_equal(two[1], batch[1])
    np.testing.assert_array_equal(two[0], batch[0])
