"""IVF-PQ list order: the spread-aware probe order (<q, c> + spread |q| s_l) against its definition, compiled ==
numpy, files with and without the per-list residual sums, bad settings. Small sizes: seconds on one core."""
from __future__ import annotations

import math

import numpy as np
import pytest
from compiled_extension import extension

from fastdpr.errors import InputError
from fastdpr.index import fileformat
from fastdpr.index import build_index, load_index
from fastdpr.index.ivfpq import IVFPQIndex

_C = extension("IVFPQ")
HAVE_C = _C is not None

needs_c = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")
BACKENDS = ["numpy"] + (["compiled"] if HAVE_C else [])


def uneven_clusters(rng, n, d, n_clusters=24):
    """Clusters whose members spread very differently (0.1x to 3x): the lists <q, c> alone misjudges."""
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    width = np.exp(rng.uniform(np.log(0.1), np.log(3.0), n_clusters)).astype(np.float32)
    lab = rng.integers(0, n_clusters, n)
    x = centres[lab] + width[lab, None] * rng.normal(size=(n, d)).astype(np.float32) / np.sqrt(d) * 4
    return np.ascontiguousarray(x, dtype=np.float32)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(int.from_bytes(b"spread", "little"))
    x = uneven_clusters(rng, 6000 + 200, 32)
    return x[:6000], x[6000:]


def list_members(index):
    return [index._impl.list_positions(ln) for ln in range(index.nlist)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_spread_follows_its_definition(data, backend):
    x, _ = data
    index = build_index(x, f"ivfpq,nlist=16,m=8,fp32,niter=6,pq_niter=4,backend={backend}")
    cent = index._impl.centroids()
    for ln, pos in enumerate(list_members(index)):
        r = x[pos].astype(np.float64) - cent[ln]
        sq = float((r * r).sum())
        assert index._impl.list_residual_sq(ln) == pytest.approx(sq, rel=1e-9, abs=1e-9)
        n = len(pos)
        want = 0.0 if n < 2 else math.sqrt(sq / n / x.shape[1] * 2 * math.log(n))
        assert index._impl.list_spread(ln) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spread_orders_lists_by_the_spread_aware_score(data, backend):
    """With every candidate re-ranked exactly, what a search finds is decided by the lists it probes: they must be
    the nprobe best by <q, c> + spread |q| s_l."""
    x, q = data
    index = build_index(x, f"ivfpq,nlist=16,m=8,fp32,niter=6,pq_niter=4,backend={backend}")
    cent = index._impl.centroids()
    s = np.array([index._impl.list_spread(ln) for ln in range(index.nlist)])
    where = np.empty(len(x), np.int64)
    for ln, pos in enumerate(list_members(index)):
        where[pos] = ln
    for spread in (0.0, 0.5, 2.0):
        _, ids = index.search(q, 5, nprobe=3, rerank=len(x), spread=spread)
        order = q @ cent.T + spread * np.linalg.norm(q, axis=1, keepdims=True) * s
        probed = np.argsort(-order, axis=1)[:, :3]
        inside = np.array([np.isin(where[row], p).all() for row, p in zip(ids, probed)])
        assert inside.all(), spread
    # the index's own setting is used when the search does not give one
    index.spread = 2.0
    np.testing.assert_array_equal(index.search(q, 5, nprobe=3)[1], index.search(q, 5, nprobe=3, spread=2.0)[1])


def test_spread_finds_more_of_the_top_k_in_uneven_lists(data):
    x, q = data
    index = build_index(x, "ivfpq,nlist=32,m=8,fp32,niter=8,pq_niter=4,backend=numpy")
    gt = np.argsort(-(q @ x.T), axis=1)[:, :20]

    def recall(spread):
        _, ids = index.search(q, 20, nprobe=2, rerank=len(x), spread=spread)
        return np.mean([len(set(a) & set(b)) / 20 for a, b in zip(ids, gt)])

    plain, spread = recall(0.0), recall(0.5)
    assert spread > plain + 0.03, (plain, spread)


@needs_c
def test_spread_compiled_matches_numpy(data):
    x, q = data
    ref = IVFPQIndex(32, nlist=16, m=8, store="fp32", niter=6, pq_niter=4, backend="numpy")
    ref.train(x)
    ref.add(x)
    comp = IVFPQIndex(32, nlist=16, m=8, store="fp32", backend="compiled")
    comp.set_trained(ref._impl.centroids(), ref._impl.codebooks())
    comp.add(x)
    for spread in (0.25, 1.0):
        for nprobe, rerank in [(2, 0), (5, 100)]:
            sc, ic = comp.search(q, 10, nprobe=nprobe, rerank=rerank, spread=spread)
            sn, in_ = ref.search(q, 10, nprobe=nprobe, rerank=rerank, spread=spread)
            assert (ic == in_).mean() >= 0.99, (spread, nprobe, rerank)


@pytest.mark.parametrize("backend", BACKENDS)
def test_spread_and_residual_sums_survive_a_file(tmp_path, data, backend):
    x, q = data
    index = build_index(x, f"ivfpq,nlist=16,m=8,fp16,niter=6,pq_niter=4,spread=0.75,backend={backend}")
    loaded = load_index(index.save(tmp_path / "s.fdpr"), mmap=True)
    assert loaded.spread == 0.75
    for ln in range(index.nlist):
        assert loaded._impl.list_residual_sq(ln) == index._impl.list_residual_sq(ln)
    np.testing.assert_array_equal(index.search(q, 10, nprobe=3)[1], loaded.search(q, 10, nprobe=3)[1])


def test_a_file_without_residual_sums_probes_by_q_dot_c(tmp_path, data, monkeypatch):
    """Files written before the sums were kept load; their spreads are zero, so any spread gives <q, c> order."""
    x, q = data
    index = build_index(x, "ivfpq,nlist=16,m=8,fp16,niter=6,pq_niter=4,backend=numpy")
    add = fileformat.PyWriter.add
    monkeypatch.setattr(fileformat.PyWriter, "add",
                        lambda self, name, array: None if name == "list_resid_sq" else add(self, name, array))
    path = index.save(tmp_path / "old.fdpr")
    monkeypatch.undo()
    for loaded in [load_index(path)] + ([] if not HAVE_C else []):
        assert all(loaded._impl.list_spread(ln) == 0 for ln in range(loaded.nlist))
        np.testing.assert_array_equal(loaded.search(q, 10, nprobe=3, spread=1.0)[1],
                                      index.search(q, 10, nprobe=3, spread=0.0)[1])


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "x", True])
def test_bad_spread_is_refused(data, bad):
    x, q = data
    with pytest.raises(InputError, match="spread"):
        IVFPQIndex(32, nlist=4, m=8, spread=bad)
    index = build_index(x[:2000], "ivfpq,nlist=4,m=8,niter=2,pq_niter=2")
    with pytest.raises(InputError, match="spread"):
        index.search(q, 5, spread=bad)
