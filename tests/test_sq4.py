"""4-bit scalar-quantized rows (csrc/sq4.*) and IVF-PQ's first re-rank from them (sq=4): every SIMD level against
a float64 reference on odd widths, the quantizer's error bound, search with and without the 4-bit stage, files.
Small sizes: seconds."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import SIMD_LEVELS, extension, simd_levels, skip_unrun

from fastdpr.errors import InputError, MissingDependency
from fastdpr.index import IVFPQIndex, build_index, load_index

_C = extension("sq4_scores")
HAVE_C = _C is not None

pytestmark = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")

LEVELS = simd_levels(_C)


def decode(rows, d, lo, step):
    """The reference reconstruction: dimension 2j in the low nibble of byte j, 2j + 1 in the high one."""
    codes = np.empty((rows.shape[0], 2 * rows.shape[1]), np.float64)
    codes[:, 0::2] = rows & 15
    codes[:, 1::2] = rows >> 4
    return lo.astype(np.float64) + step.astype(np.float64) * codes[:, :d]


def clustered(rng, n, d, n_clusters=16):
    centres = rng.normal(size=(n_clusters, d))
    x = centres[rng.integers(0, n_clusters, n)] + 0.4 * rng.normal(size=(n, d))
    return np.ascontiguousarray(x * np.exp(0.25 * rng.normal(size=(n, 1))), dtype=np.float32)


@pytest.mark.parametrize("d", [1, 2, 31, 32, 33, 63, 64, 65, 96, 768, 771])
def test_every_level_matches_the_float64_reference(d):
    rng = np.random.default_rng(7919 * d)
    x = (rng.normal(size=(57, d)) * rng.uniform(0.1, 3, d)).astype(np.float32)
    lo, step = _C.sq4_train(x)
    rows = _C.sq4_encode(x, lo, step)
    assert rows.shape == (57, (d + 1) // 2) and rows.dtype == np.uint8
    q = rng.normal(size=d).astype(np.float32)
    want = decode(rows, d, lo, step) @ q.astype(np.float64)
    scale = np.abs(q).sum() * np.abs(decode(rows, d, lo, step)).max() + 1e-6
    scalar = _C.sq4_scores(q, rows, lo, step, "scalar")
    for level in LEVELS:
        got = _C.sq4_scores(q, rows, lo, step, level)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale, err_msg=level)
        np.testing.assert_allclose(got, scalar, rtol=0, atol=1e-5 * scale, err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


def test_quantizer_ranges_rounding_and_clipping():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 40)).astype(np.float32)
    x[:, 7] = 2.5  # a constant dimension: step 0, code 0, decoded exactly
    lo, step = _C.sq4_train(x)
    np.testing.assert_array_equal(lo, x.min(0))
    np.testing.assert_allclose(step, (x.max(0) - x.min(0)) / 15, rtol=1e-6)
    assert step[7] == 0
    err = np.abs(decode(_C.sq4_encode(x, lo, step), 40, lo, step) - x)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-6).all()  # nearest level inside the range
    # outside the range: clipped to its ends
    far = np.stack([lo - 10, lo + step * 15 + 10]).astype(np.float32)
    back = decode(_C.sq4_encode(far, lo, step), 40, lo, step)
    np.testing.assert_allclose(back[0], lo, atol=1e-6)
    np.testing.assert_allclose(back[1], lo + 15 * step.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_kernel_arguments_are_checked():
    x = np.ones((4, 10), np.float32)
    lo, step = _C.sq4_train(x)
    rows = _C.sq4_encode(x, lo, step)
    with pytest.raises(ValueError, match="rows"):
        _C.sq4_scores(np.ones(11, np.float32), rows, lo, step)
    with pytest.raises(ValueError):
        _C.sq4_scores(np.ones(10, np.float32), rows, lo, step, "sse9")


# ---------------------------------------------------------------------------------------------------------------
# IVF-PQ with 4-bit rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(int.from_bytes(b"sq4", "little"))
    x = clustered(rng, 4000 + 60, 96)
    q, x = x[4000:], x[:4000]
    return x, q, np.argsort(-(q @ x.T), axis=1)[:, :20]


def recall(ids, gt):
    return float(np.mean([len(set(a) & set(b)) / gt.shape[1] for a, b in zip(ids, gt)]))


@pytest.mark.parametrize("nbits", [4, 8])
def test_exact_zero_is_the_plain_search_and_exact_cuts_from_the_4bit_scores(data, nbits):
    x, q, gt = data
    plain = IVFPQIndex(96, nlist=16, m=24, nbits=nbits, store="fp16", niter=6, pq_niter=6)
    plain.train(x)
    plain.add(x)
    sq = IVFPQIndex(96, nlist=16, m=24, nbits=nbits, store="fp16", sq=4)
    sq.set_trained(plain._impl.centroids(), plain._impl.codebooks())
    sq.add(x)
    assert sq._impl.sq_rows().shape == (len(x), 48)
    kw = dict(nprobe=6, rerank=400)
    s0, i0 = plain.search(q, 20, **kw)
    s1, i1 = sq.search(q, 20, exact=0, **kw)  # every candidate exact: the 4-bit rows unused
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_array_equal(s0, s1)
    s2, i2 = sq.search(q, 20, exact=400, **kw)  # the cut keeps everything: the same answers
    np.testing.assert_array_equal(i0, i2)
    # a real cut: exact scores of the survivors, the best 60 by 4-bit score
    s3, i3 = sq.search(q, 20, exact=60, **kw)
    stored = x.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(s3, np.einsum("nd,nkd->nk", q, stored[i3]), rtol=1e-4, atol=1e-3)
    assert recall(i3, gt) >= recall(i0, gt) - 0.03
    # which 60: the best by 4-bit rows among the 400 candidates the codes found
    lo, step = sq._impl.sq_ranges()
    _, cand = plain.search(q, 400, nprobe=6, rerank=0)
    for qi in range(5):
        c = cand[qi][cand[qi] >= 0]
        s4 = _C.sq4_scores(q[qi], sq._impl.sq_rows()[c], lo, step)
        keep = c[np.argsort(-s4, kind="stable")[:60]]
        best = keep[np.argsort(-(stored[keep] @ q[qi]), kind="stable")[:20]]
        assert len(set(best) & set(i3[qi])) >= 19


def test_4bit_rows_alone_rank_without_stored_vectors(data):
    x, q, gt = data
    index = build_index(x, "ivfpq,nbits=4,nlist=16,m=24,sq=4,niter=6,pq_niter=6")
    assert index.store == "none" and index.sq == 4
    scores, ids = index.search(q, 20, nprobe=16, rerank=400)
    lo, step = index._impl.sq_ranges()
    rows = index._impl.sq_rows()
    for qi in range(len(q)):
        want = _C.sq4_scores(q[qi], rows[ids[qi]], lo, step)
        np.testing.assert_allclose(scores[qi], want, rtol=1e-5, atol=1e-5)
    assert recall(ids, gt) >= 0.8


@pytest.mark.parametrize("store,sq,nbits", [("fp16", 4, 4), ("none", 4, 4), ("fp16", 0, 4), ("fp32", 0, 4),
                                            ("fp16", 4, 8)])
def test_batched_rerank_equals_one_query_at_a_time(data, store, sq, nbits):
    # Many queries in one call are re-ranked together in row order (batches of 128 split across the threads), by
    # 4-bit rows and by full vectors; every answer must be the one the query gets alone.
    x, q, _ = data
    index = build_index(x, f"ivfpq,nbits={nbits},nlist=16,m=24,store={store},sq={sq},niter=6,pq_niter=6")
    rng = np.random.default_rng()
    many = (q[rng.integers(0, len(q), 601)] + 0.05 * rng.standard_normal((601, q.shape[1]))).astype(np.float32)
    kw = dict(nprobe=5, rerank=300, **({"exact": 40} if sq and store != "none" else {}))
    alone = [index.search(many[i:i + 1], 20, **kw) for i in range(0, len(many), 7)]
    for threads in (1, 2):
        s, ids = index.search(many, 20, threads=threads, **kw)
        for j, i in enumerate(range(0, len(many), 7)):
            np.testing.assert_array_equal(ids[i], alone[j][1][0])
            np.testing.assert_array_equal(s[i], alone[j][0][0])


def test_an_empty_index_with_4bit_rows_answers_nothing(data):
    x, q, _ = data
    index = IVFPQIndex(96, nlist=16, m=24, nbits=4, store="fp16", sq=4, niter=6, pq_niter=6)
    index.train(x)
    with pytest.raises(InputError, match="empty"):  # the Python layer says so
        index.search(q[:3], 5, nprobe=4, rerank=50, exact=10)
    scores, ids = index._impl.search(q[:3], 5, 4, 50, 1, 0.0, 10)  # the compiled one pads
    assert (np.asarray(ids) == -1).all() and np.isneginf(np.asarray(scores)).all()


@pytest.mark.parametrize("mmap", [False, True])
def test_4bit_rows_survive_a_file_and_adds_after_a_mapped_open(tmp_path, data, mmap):
    x, q, _ = data
    index = build_index(x[:3000], "ivfpq,nbits=4,nlist=16,m=24,fp16,sq=4,exact=50,spread=0.5,niter=6,pq_niter=6")
    loaded = load_index(index.save(tmp_path / "sq.fdpr"), mmap=mmap)
    assert loaded.sq == 4 and loaded.exact == 50 and loaded._impl.vectors_mapped == mmap
    np.testing.assert_array_equal(loaded._impl.sq_rows(), index._impl.sq_rows())
    for kw in ({}, {"exact": 0}, {"rerank": 300, "exact": 40}):
        np.testing.assert_array_equal(loaded.search(q, 20, nprobe=5, **kw)[1], index.search(q, 20, nprobe=5, **kw)[1])
    loaded.add(x[3000:])
    index.add(x[3000:])
    np.testing.assert_array_equal(loaded._impl.sq_rows(), index._impl.sq_rows())
    np.testing.assert_array_equal(loaded.search(q, 20, nprobe=5)[1], index.search(q, 20, nprobe=5)[1])


def test_ranges_come_from_the_first_rows_after_set_trained(data):
    x, _, _ = data
    src = build_index(x, "ivfpq,nbits=4,nlist=8,m=24,niter=4,pq_niter=4")
    index = IVFPQIndex(96, nlist=8, m=24, nbits=4, sq=4)
    index.set_trained(src._impl.centroids(), src._impl.codebooks())
    assert index._impl.sq_ranges() is None
    index.add(x[:1000])
    lo, step = index._impl.sq_ranges()
    np.testing.assert_array_equal(lo, x[:1000].min(0))


def test_bad_sq_settings_are_refused(data):
    x, q, _ = data
    for bad in (1, 8, True, "4"):
        with pytest.raises(InputError, match="sq"):
            IVFPQIndex(96, nlist=4, m=24, sq=bad)
    for bad in (-1, "some", 2.5):
        with pytest.raises(InputError, match="exact"):
            IVFPQIndex(96, nlist=4, m=24, sq=4, exact=bad)
    with pytest.raises(MissingDependency, match="sq=4"):
        IVFPQIndex(96, nlist=4, m=24, sq=4, backend="numpy")
    index = build_index(x[:1000], "ivfpq,nbits=4,nlist=4,m=24,sq=4,niter=2,pq_niter=2")
    with pytest.raises(InputError, match="exact"):
        index.search(q, 5, exact=-3)
    with pytest.raises(RuntimeError, match="sq"):
        index._impl.sq = 0  # the index holds rows


def test_the_numpy_reader_reads_a_file_with_4bit_rows(tmp_path, data):
    from fastdpr.index import fileformat
    from fastdpr.index.ivfpq import NumpyIVFPQ

    x, _, _ = data
    index = build_index(x[:1000], "ivfpq,nlist=4,m=24,fp16,sq=4,niter=2,pq_niter=2")  # 8-bit codes
    path = index.save(tmp_path / "sq.fdpr")
    for twin in (NumpyIVFPQ.read_sections(fileformat.PyReader(path)), NumpyIVFPQ.from_compiled(index._impl)):
        assert twin.sq == 4
        np.testing.assert_array_equal(twin.sq_rows(), index._impl.sq_rows())
        for a, b in zip(twin.sq_ranges(), index._impl.sq_ranges()):
            np.testing.assert_array_equal(a, b)
