"""IVF-PQ with many lists: two-level coarse k-means (``groups``) and filing rows through groups of centroids
(csrc/coarse.h), against plain k-means and exact filing. Small sizes: the whole file runs in seconds."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from compiled_extension import extension

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index
from fastdpr.index.ivfpq import IVFPQIndex
from fastdpr.index.kmeans import kmeans, split_children, two_level_kmeans

_C = extension("coarse_assign")
needs_c = pytest.mark.skipif(_C is None, reason="compiled extension not built")

# the probe IVFPQ files with from 16,384 lists on (csrc/ivfpq.h kAssignProbeGroups)
PROBE = 16
GROUPED_MIN_LISTS = 16384


def clustered(rng, n, d, n_clusters=32, rank=4, noise=0.3, scale=3.0):
    """Gaussian mixture of uneven cluster sizes: centres (of spread `scale`) + low-rank spread + noise."""
    centres = scale * rng.normal(size=(n_clusters, d)).astype(np.float32)
    basis = rng.normal(size=(n_clusters, rank, d)).astype(np.float32) / np.sqrt(rank)
    lab = rng.choice(n_clusters, n, p=rng.dirichlet(np.ones(n_clusters)))
    z = rng.normal(size=(n, rank)).astype(np.float32)
    x = centres[lab] + np.einsum("nr,nrd->nd", z, basis[lab]) + noise * rng.normal(size=(n, d)).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def blobs(rng, sizes, d):
    """Far-apart blobs of the given sizes, shuffled, and their centres."""
    centres = 50 * rng.normal(size=(len(sizes), d)).astype(np.float32)
    x = np.concatenate([c + rng.normal(size=(s, d)).astype(np.float32) for c, s in zip(centres, sizes)])
    return x[rng.permutation(len(x))], centres


def _two_level(backend, x, k, groups, **kw):
    if backend == "compiled":
        return _C.two_level_kmeans(x, k, groups, **kw)
    return two_level_kmeans(x, k, groups, **kw)


def _backends():
    return ["compiled", "numpy"] if _C is not None else ["numpy"]


# ---------------------------------------------------------------------------------------------------------------
# two-level k-means


@pytest.mark.parametrize("backend", _backends())
def test_two_level_kmeans_splits_children_in_proportion(backend):
    rng = np.random.default_rng(3)
    sizes = [2400, 1200, 600, 300]
    x, centres = blobs(rng, sizes, 12)
    k = 45  # quotas 24, 12, 6, 3
    c = _two_level(backend, x, k, 4, niter=8, seed=5, max_points_per_centroid=64)
    assert c.shape == (k, 12) and c.dtype == np.float32 and np.isfinite(c).all()
    assert len(np.unique(c, axis=0)) == k
    owner = np.argmin(((c[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    assert np.bincount(owner, minlength=4).tolist() == [24, 12, 6, 3]


@pytest.mark.parametrize("backend", _backends())
def test_two_level_kmeans_on_uneven_clusters(backend):
    rng = np.random.default_rng(4)
    x = clustered(rng, 6000, 16)
    for k, groups in [(100, 10), (37, 37), (64, 7)]:
        c = _two_level(backend, x, k, groups, niter=5, seed=1, max_points_per_centroid=32)
        assert c.shape == (k, 16) and np.isfinite(c).all() and len(np.unique(c, axis=0)) == k
    # spherical: unit centroids; as many centroids as points: every group takes its points
    c = _two_level(backend, x[:500], 150, 3, niter=3, spherical=True)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
    c = _two_level(backend, x[:200], 200, 3, niter=3, spherical=True)
    unit = x[:200] / np.linalg.norm(x[:200], axis=1, keepdims=True)
    np.testing.assert_allclose(c[np.lexsort(c.T)], unit[np.lexsort(unit.T)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", _backends())
def test_an_oversized_group_is_split_again(backend):
    """One top cluster with most of the points: its 80 of 87 centroids (the mean share is 11) are trained in two
    levels again, and still come out in proportion."""
    rng = np.random.default_rng(9)
    x, centres = blobs(rng, [8000] + [100] * 7, 10)
    c = _two_level(backend, x, 87, 8, niter=6, seed=3, max_points_per_centroid=64)
    assert c.shape == (87, 10) and np.isfinite(c).all() and len(np.unique(c, axis=0)) == 87
    owner = np.argmin(((c[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    assert np.bincount(owner, minlength=8).tolist() == [80] + [1] * 7
    # the big blob's centroids spread over it like those of a flat k-means
    big = x[np.argmin(((x[:, None] - centres[None]) ** 2).sum(-1), axis=1) == 0]
    flat = kmeans(big, 80, niter=6, seed=3)

    def objective(cc):
        d2 = (big ** 2).sum(1)[:, None] - 2 * big @ cc.T + (cc ** 2).sum(1)[None]
        return float(np.maximum(d2.min(1), 0).mean())

    assert objective(c[owner == 0]) <= 1.15 * objective(flat)


@needs_c
def test_two_level_kmeans_is_close_to_flat_kmeans():
    rng = np.random.default_rng(5)
    x = clustered(rng, 8000, 24)

    def objective(c):
        return float(np.maximum(((x ** 2).sum(1)[:, None] - 2 * x @ c.T + (c ** 2).sum(1)[None]).min(1), 0).mean())

    flat, _ = _C.kmeans(x, 128, niter=10, seed=2)
    two = _C.two_level_kmeans(x, 128, 12, niter=10, seed=2)
    assert objective(two) <= 1.1 * objective(flat), (objective(two), objective(flat))


def test_groups_one_is_plain_kmeans():
    rng = np.random.default_rng(6)
    x = clustered(rng, 3000, 8)
    np.testing.assert_array_equal(two_level_kmeans(x, 20, 1, niter=5, seed=9), kmeans(x, 20, niter=5, seed=9))
    if _C is not None:
        np.testing.assert_array_equal(_C.two_level_kmeans(x, 20, 1, niter=5, seed=9, balance=0.5),
                                      _C.kmeans(x, 20, niter=5, seed=9, balance=0.5)[0])


def test_split_children_largest_remainder():
    assert split_children([10, 0, 5, 1], 6).tolist() == [3, 0, 2, 1]
    assert split_children([1, 1, 1, 1], 4).tolist() == [1, 1, 1, 1]
    assert split_children([5, 5, 5], 4).tolist() == [2, 1, 1]  # equal remainders: the lower group first
    assert split_children([1000, 1, 1], 3).tolist() == [1, 1, 1]  # every non-empty group keeps one
    assert split_children([2, 9], 11).tolist() == [2, 9]
    rng = np.random.default_rng(7)
    for _ in range(200):
        counts = rng.integers(0, 50, rng.integers(1, 30)) * rng.integers(0, 2, 1)[0] + rng.integers(0, 3)
        total, nonempty = int(counts.sum()), int((counts > 0).sum())
        if total == 0:
            continue
        k = int(rng.integers(nonempty, total + 1))
        out = split_children(counts, k)
        assert out.sum() == k and (out <= counts).all() and ((out >= 1) == (counts > 0)).all()
        if _C is not None:
            assert _C.coarse_split(counts.astype(np.int64), k) == out.tolist()
    for counts, k, message in [([3, 0, 2], 1, "non-empty groups"), ([3, 2], 6, "training points")]:
        with pytest.raises(InputError, match=message):
            split_children(counts, k)
        if _C is not None:
            with pytest.raises(ValueError, match=message):
                _C.coarse_split(np.array(counts, np.int64), k)


def test_bad_groups_have_clear_messages():
    x = clustered(np.random.default_rng(8), 500, 8)
    with pytest.raises(InputError, match=r"groups must be in \[1, k=10\]"):
        two_level_kmeans(x, 10, 0)
    with pytest.raises(InputError, match=r"groups must be in \[1, k=10\]"):
        two_level_kmeans(x, 10, 11)
    for bad in (-1, True, 2.5, "4"):
        with pytest.raises(InputError, match="groups"):
            IVFPQIndex(8, nlist=16, m=2, groups=bad)
    with pytest.raises(InputError, match="groups=17 exceeds nlist=16"):
        IVFPQIndex(8, nlist=16, m=2, groups=17)
    with pytest.raises(InputError, match="groups must be an integer"):
        build_index(x, "ivfpq,nlist=16,m=2,groups=abc")
    # nlist chosen at training: checked there
    index = IVFPQIndex(8, m=2, groups=500)
    with pytest.raises(InputError, match="groups=500 exceeds nlist="):
        index.train(x)
    if _C is None:
        return
    for groups in (0, 11):
        with pytest.raises(ValueError, match=r"groups must be in \[1, k=10\], got " + str(groups)):
            _C.two_level_kmeans(x, 10, groups)
    impl = _C.IVFPQ(8, 16, 2)
    with pytest.raises(ValueError, match=r"groups must be in \[0, nlist=16\].*got 17"):
        impl.train(x, groups=17)
    with pytest.raises(ValueError, match="groups must be >= 0"):
        impl.train(x, groups=-1)
    with pytest.raises(TypeError, match="groups must be an integer"):
        impl.train(x, groups=True)
    assert not impl.is_trained


# ---------------------------------------------------------------------------------------------------------------
# filing through groups of centroids


def _centroids_and_rows(rng, nlist, d, n_rows):
    """Centroids as k-means would place them on clustered data (two levels, to stay fast) and rows drawn from the
    same data."""
    x = clustered(rng, 12 * nlist + n_rows, d, n_clusters=48, scale=1.0)  # overlapping clusters
    cent = _C.two_level_kmeans(x[n_rows:], nlist, 16, niter=6, seed=1, max_points_per_centroid=12)
    return cent, x[:n_rows]


@needs_c
@pytest.mark.parametrize("d,nlist", [(7, 300), (33, 1000), (96, 1500)])
@pytest.mark.parametrize("max_inner_product", [False, True])
def test_grouped_assignment_agrees_with_exact(d, nlist, max_inner_product):
    rng = np.random.default_rng(d * nlist)
    cent, x = _centroids_and_rows(rng, nlist, d, 4000)
    if max_inner_product:  # filing by inner product is for unit centroids (spherical k-means)
        cent = np.ascontiguousarray(cent / np.linalg.norm(cent, axis=1, keepdims=True), dtype=np.float32)
    exact = _C.assign_nearest(cent, x, max_inner_product)
    labels, groups = _C.coarse_assign(cent, x, PROBE, max_inner_product)
    assert 1 <= groups <= nlist and labels.shape == (len(x),)
    assert labels.min() >= 0 and labels.max() < nlist
    assert (labels == exact).mean() >= 0.99
    # every group probed: exactly the exact assignment, ties included
    for probe in (groups, groups + 5):
        np.testing.assert_array_equal(_C.coarse_assign(cent, x, probe, max_inner_product)[0], exact)


@needs_c
def test_grouped_assignment_edge_cases():
    rng = np.random.default_rng(11)
    cent = rng.normal(size=(40, 5)).astype(np.float32)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    # one centroid, one group; duplicated centroids (ties: the lowest index); extreme magnitudes (scaled)
    np.testing.assert_array_equal(_C.coarse_assign(cent[:1], x, 1)[0], np.zeros(300, np.int64))
    dup = np.concatenate([cent, cent])
    np.testing.assert_array_equal(_C.coarse_assign(dup, x, 100)[0], _C.assign_nearest(dup, x))
    assert _C.coarse_assign(dup, x, 100)[0].max() < 40
    for scale in (1e-25, 1e25):
        big, xs = (cent * scale).astype(np.float32), (x * scale).astype(np.float32)
        np.testing.assert_array_equal(_C.coarse_assign(big, xs, 100)[0], _C.assign_nearest(big, xs))
    assert _C.coarse_assign(cent, x[:0], 2)[0].shape == (0,)
    with pytest.raises(ValueError, match="probe must be >= 1"):
        _C.coarse_assign(cent, x, 0)


@needs_c
def test_many_lists_are_filed_through_groups():
    """From 16,384 lists on, encode/add file through CoarseGroups (rebuilt when the centroids change, shared by
    concurrent encodes); below, exactly."""
    rng = np.random.default_rng(12)
    d = 8
    x = clustered(rng, 20 * GROUPED_MIN_LISTS // 4, d, n_clusters=64)
    cent = x[rng.choice(len(x), GROUPED_MIN_LISTS, replace=False)] + 0.01
    rows = x[:3000]
    codebooks = rng.normal(size=(1, 256, d)).astype(np.float32)
    index = _C.IVFPQ(d, GROUPED_MIN_LISTS, 1)
    index.set_trained(cent, codebooks)
    grouped = _C.coarse_assign(cent, rows, PROBE)[0]
    lists = index.encode(rows)[0]
    np.testing.assert_array_equal(lists, grouped)
    assert (lists == _C.assign_nearest(cent, rows)).mean() >= 0.99
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, index.encode(rows)[0])) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        np.testing.assert_array_equal(out[i], grouped)
    # new centroids: new groups
    cent2 = np.ascontiguousarray(cent[::-1])
    index.set_trained(cent2, codebooks)
    np.testing.assert_array_equal(index.encode(rows)[0], _C.coarse_assign(cent2, rows, PROBE)[0])
    index.add(rows)
    filed = np.empty(len(rows), np.int64)
    for ln in np.flatnonzero([index.list_positions(ln).size for ln in range(index.nlist)]):
        filed[index.list_positions(ln)] = ln
    np.testing.assert_array_equal(filed, _C.coarse_assign(cent2, rows, PROBE)[0])
    # one list fewer: every centroid compared, as before
    small = _C.IVFPQ(d, GROUPED_MIN_LISTS - 1, 1)
    small.set_trained(cent[:-1], codebooks)
    np.testing.assert_array_equal(small.encode(rows)[0], _C.assign_nearest(cent[:-1], rows))


# ---------------------------------------------------------------------------------------------------------------
# the index


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(20240612)
    x = clustered(rng, 10000 + 100, 32)
    q, x = x[10000:], x[:10000]
    gt = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :10]
    return x, q, gt


def _recall(ids, gt):
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, gt)]))


@pytest.mark.parametrize("backend", _backends())
def test_index_with_groups_recall_and_roundtrip(tmp_path, data, backend):
    x, q, gt = data
    spec = f"ivfpq,nlist=64,m=8,fp32,niter=6,pq_niter=6,rerank=100,backend={backend}"
    flat = build_index(x, spec)
    two = build_index(x, spec + ",groups=8")
    assert two.train_params["groups"] == 8 and flat.train_params["groups"] == 0
    assert two.compiled == (backend == "compiled")
    assert not np.array_equal(two._impl.centroids(), flat._impl.centroids())
    r_flat = _recall(flat.search(q, 10, nprobe=64)[1], gt)
    r_two = _recall(two.search(q, 10, nprobe=64)[1], gt)
    assert r_two >= 0.9 and r_two >= r_flat - 0.05, (r_two, r_flat)
    assert _recall(two.search(q, 10, nprobe=8)[1], gt) >= 0.8
    if backend == "compiled":  # the train parameters reach the two-level k-means as they are
        ref = _C.two_level_kmeans(x, 64, 8, niter=6, seed=1234, max_points_per_centroid=64, balance=0.5)
        np.testing.assert_array_equal(two._impl.centroids(), ref)
    path = two.save(tmp_path / "two.fdpr")
    loaded = load_index(path)
    s0, i0 = two.search(q, 10, nprobe=16)
    s1, i1 = loaded.search(q, 10, nprobe=16)
    if loaded.compiled == two.compiled:
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(s0, s1)
    else:  # a numpy-built file read by the compiled core: the same answers up to float rounding
        assert (i0 == i1).mean() >= 0.99
        np.testing.assert_allclose(s0, s1, rtol=1e-5, atol=1e-4)
