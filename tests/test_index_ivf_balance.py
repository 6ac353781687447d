"""Balanced L2 lists for IVF-PQ (the default since spherical lists lost most of a query's top-100 on vectors whose
norms vary): k-means ``balance`` in both backends, recall against exact search, parameter errors, old files."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import extension

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index
from fastdpr.index.ivfpq import SPEC_PARAMS, IVFPQIndex
from fastdpr.index.kmeans import kmeans, nearest, small_cluster_floor

_C = extension("kmeans")
HAVE_C = _C is not None

needs_c = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")


def varied_norms(rng, n, d, n_clusters=24, rank=6, spread=0.5):
    """Gaussian mixture scaled by log-normal norms (sigma ``spread``): MIPS meets high-norm hubs, as with
    unnormalised mean-pooled passages (their norms span 1.1 to 8.3 on the real pool)."""
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    basis = rng.normal(size=(n_clusters, rank, d)).astype(np.float32) / np.sqrt(rank)
    lab = rng.integers(0, n_clusters, n)
    z = rng.normal(size=(n, rank)).astype(np.float32)
    x = centres[lab] + np.einsum("nr,nrd->nd", z, basis[lab]) + 0.3 * rng.normal(size=(n, d)).astype(np.float32)
    x *= np.exp(0.25 * rng.normal(size=(n, 1)) + spread * rng.normal(size=(n, 1))).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def recall(ids, gt):
    k = gt.shape[1]
    return float(np.mean([len(set(ids[i, :k]) & set(gt[i])) / k for i in range(len(gt))]))


@pytest.fixture(scope="module")
def hubs():
    x = varied_norms(np.random.default_rng(0), 8200, 32)
    q, x = x[8000:], x[:8000]
    return x, q, np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :100]


def sizes(x, c):
    return np.bincount(nearest(x, c, False), minlength=len(c))


# ---------------------------------------------------------------------------------------------------------------
# k-means balance


def test_floor_is_the_same_rule_in_both_backends():
    assert small_cluster_floor(0.5, 23582, 307) == 38
    assert small_cluster_floor(0.0, 1000, 10) == 0
    assert small_cluster_floor(0.5, 64 * 512, 512) == 32


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
def test_balance_evens_out_list_sizes(hubs, backend):
    if backend == "compiled" and not HAVE_C:
        pytest.skip("compiled extension not built")
    x = hubs[0]

    def train(balance):
        if backend == "compiled":
            return _C.kmeans(x, 128, niter=10, seed=3, kmeanspp=True, balance=balance)[0]
        return kmeans(x, 128, niter=10, seed=3, balance=balance)

    loose, even = sizes(x, train(0.0)), sizes(x, train(0.5))
    mean = len(x) / 128
    # unbalanced k-means on varied norms: a few giant lists of low-norm points, many tiny lists of hubs (measured:
    # largest 872 / 1164 points, 38 / 47 lists under a quarter of the mean; balanced: 195 / 177, 1 / 1)
    assert loose.max() > 8 * mean and (loose < 0.25 * mean).sum() > 20, (loose.max(), np.sort(loose)[:12])
    assert even.max() < 4 * mean, even.max()
    assert (even < 0.25 * mean).sum() <= 4, np.sort(even)[:8]
    assert even.std() < 0.4 * loose.std()


@needs_c
def test_balance_is_checked():
    x = np.random.default_rng(1).normal(size=(500, 4)).astype(np.float32)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="balance must be in"):
            _C.kmeans(x, 8, balance=bad)
        with pytest.raises(InputError, match="balance must be in"):
            kmeans(x, 8, balance=bad)
    with pytest.raises(InputError, match="balance must be in"):
        build_index(x, "ivfpq,nlist=8,m=4,balance=1.5")
    with pytest.raises(InputError, match="balance: must be a number|balance must be"):
        build_index(x, "ivfpq,nlist=8,m=4,balance=yes")


# ---------------------------------------------------------------------------------------------------------------
# recall against exact search: balanced L2 lists vs the former default (spherical, unbalanced)


def test_defaults_are_balanced_l2_lists():
    assert SPEC_PARAMS["spherical"] is False and SPEC_PARAMS["balance"] == 0.5
    index = IVFPQIndex(32, nlist=8, m=8)
    assert index.train_params["spherical"] is False and index.train_params["balance"] == 0.5


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
def test_balanced_l2_lists_beat_spherical_lists_on_varied_norms(hubs, backend):
    if backend == "compiled" and not HAVE_C:
        pytest.skip("compiled extension not built")
    x, q, gt = hubs
    common = f"ivfpq,nlist=128,m=8,fp32,niter=10,pq_niter=8,backend={backend}"
    old = build_index(x, common + ",spherical=true,balance=0")
    new = build_index(x, common)  # the defaults
    for nprobe in (8, 16):
        r_old = recall(old.search(q, 100, nprobe=nprobe, rerank=300)[1], gt)
        r_new = recall(new.search(q, 100, nprobe=nprobe, rerank=300)[1], gt)
        # measured: 0.751 -> 0.807 at nprobe 8, 0.868 -> 0.914 at nprobe 16 (both backends within 0.01)
        assert r_new >= r_old + 0.03, (nprobe, r_old, r_new)
    # probing every list finds everything the codes can rank: the partition, not the codes, made the difference
    assert recall(new.search(q, 100, nprobe=128, rerank=300)[1], gt) > 0.99


@needs_c
def test_backends_train_equally_good_lists(hubs):
    """The random streams differ, so the centroids differ; the recall they give may not."""
    x, q, gt = hubs
    got = {}
    for backend in ("compiled", "numpy"):
        index = build_index(x, f"ivfpq,nlist=128,m=8,fp32,niter=10,pq_niter=8,backend={backend}")
        got[backend] = recall(index.search(q, 100, nprobe=8, rerank=300)[1], gt)
    assert abs(got["compiled"] - got["numpy"]) < 0.03, got


# ---------------------------------------------------------------------------------------------------------------
# files: training settings are not stored, so spherical-list indexes written before still load and search the same


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
def test_spherical_index_files_still_load(tmp_path, hubs, backend):
    if backend == "compiled" and not HAVE_C:
        pytest.skip("compiled extension not built")
    x, q, _ = hubs
    old = build_index(x[:3000], f"ivfpq,nlist=32,m=8,fp16,niter=5,pq_niter=5,spherical=true,balance=0,"
                                f"backend={backend}")
    np.testing.assert_allclose(np.linalg.norm(old._impl.centroids(), axis=1), 1.0, rtol=1e-5)
    path = tmp_path / "old.idx"
    old.save(path)
    back = load_index(path)
    s0, i0 = old.search(q, 20, nprobe=4, rerank=60)
    s1, i1 = back.search(q, 20, nprobe=4, rerank=60)
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_allclose(s0, s1, rtol=1e-6)
