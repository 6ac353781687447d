"""IVF-PQ and k-means: recall against exact search, compiled == numpy fallback on the same trained state, files,
errors. Small sizes (n <= 20k, d <= 64) so the whole file runs in well under a minute on one core."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from compiled_extension import SIMD_LEVELS, capped, extension, simd_levels, skip_unrun

from fastdpr.errors import InputError
from fastdpr.index import fileformat
from fastdpr.index import build_index, load_index
from fastdpr.index.ivfpq import IVFPQIndex, NumpyIVFPQ, default_m, default_nlist, kmeans

_C = extension("IVFPQ")
HAVE_C = _C is not None

needs_c = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")


def clustered(rng, n, d, n_clusters=32, rank=8, noise=0.3):
    """Non-normalised Gaussian mixture: cluster centres + low-rank spread + noise, log-normal norms."""
    centres = rng.normal(size=(n_clusters, d)).astype(np.float32)
    basis = rng.normal(size=(n_clusters, rank, d)).astype(np.float32) / np.sqrt(rank)
    lab = rng.integers(0, n_clusters, n)
    z = rng.normal(size=(n, rank)).astype(np.float32)
    x = centres[lab] + np.einsum("nr,nrd->nd", z, basis[lab]) + noise * rng.normal(size=(n, d)).astype(np.float32)
    x *= np.exp(0.25 * rng.normal(size=(n, 1))).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def exact_topk(x, q, k):
    s = q @ x.T
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def recall(ids, gt, k):
    return float(np.mean([len(set(ids[i, :k]) & set(gt[i, :k])) / k for i in range(len(gt))]))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(20240611)
    n, nq, d = 20000, 200, 64
    x = clustered(rng, n + nq, d)
    q, x = x[n:], x[:n]
    return x, q, exact_topk(x, q, 100)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(7)
    x = clustered(rng, 3000 + 50, 32, n_clusters=12, rank=4)
    return x[:3000], x[3000:]


# ---------------------------------------------------------------------------------------------------------------
# k-means and the panel kernel


@needs_c
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 300, 13), (5, 257, 768), (64, 8, 4)])
def test_inner_products_kernel_matches_numpy(shape):
    nx, ny, d = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=(nx, d)).astype(np.float32)
    y = rng.normal(size=(ny, d)).astype(np.float32)
    ref = x.astype(np.float64) @ y.T.astype(np.float64)
    np.testing.assert_allclose(_C.inner_products(x, y), ref, rtol=1e-4, atol=1e-4 * np.sqrt(d))


def _objective(x, c):
    d2 = (x ** 2).sum(1)[:, None] - 2 * x @ c.T + (c ** 2).sum(1)[None]
    return float(np.maximum(d2.min(1), 0).mean())


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
def test_kmeans_finds_separated_blobs(backend):
    if backend == "compiled" and not HAVE_C:
        pytest.skip("compiled extension not built")
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(10, 16)).astype(np.float32) * 10
    x = (centres[rng.integers(0, 10, 4000)] + rng.normal(size=(4000, 16))).astype(np.float32)
    if backend == "compiled":
        c, info = _C.kmeans(x, 10, niter=15, seed=5)
        assert info["n_train"] == 2560  # subsampled to k * max_points_per_centroid
        assert info["objective"][-1] <= info["objective"][0]
    else:
        c = kmeans(x, 10, niter=15, seed=5)
    # every true centre has a learned centroid next to it, and the within-cluster error is the noise variance
    nearest = np.sqrt(((centres[:, None] - c[None]) ** 2).sum(-1)).min(1)
    assert nearest.max() < 1.0
    assert _objective(x, c) == pytest.approx(16.0, rel=0.15)


@needs_c
def test_kmeans_subsamples_and_splits_empty_clusters():
    rng = np.random.default_rng(11)
    # 5 distinct points (many copies) and 8 clusters: random seeding must leave empty clusters to be split
    base = rng.normal(size=(5, 6)).astype(np.float32)
    x = np.repeat(base, 200, axis=0)
    c, info = _C.kmeans(x, 8, niter=5, seed=1, kmeanspp=False)
    assert np.isfinite(c).all()
    assert info["empty_splits"] > 0
    c2, info2 = _C.kmeans(rng.normal(size=(5000, 4)).astype(np.float32), 4, niter=2, max_points_per_centroid=100)
    assert info2["n_train"] == 400
    # numpy twin splits too (no NaN centroids from empty clusters)
    assert np.isfinite(kmeans(x, 8, niter=5, seed=1, kmeanspp=False)).all()


@needs_c
def test_kmeans_spherical_unit_centroids_and_errors():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1000, 8)).astype(np.float32)
    c, _ = _C.kmeans(x, 16, niter=5, spherical=True)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(kmeans(x, 16, niter=5, spherical=True), axis=1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="at least k=50"):
        _C.kmeans(x[:10], 50)
    with pytest.raises(InputError, match="at least k=50"):
        kmeans(x[:10], 50)


@needs_c
def test_kmeans_is_reproducible_from_the_seed():
    x = np.random.default_rng(9).normal(size=(3000, 12)).astype(np.float32)
    a, _ = _C.kmeans(x, 20, niter=8, seed=42)
    b, _ = _C.kmeans(x, 20, niter=8, seed=42)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------------------------
# recall against exact search


@needs_c
def test_recall_clustered_with_and_without_rerank(data):
    x, q, gt = data
    index = build_index(x, "ivfpq,nlist=64,m=16,fp16,niter=10,pq_niter=10")
    assert index.compiled and len(index) == len(x)
    _, plain = index.search(q, 100, nprobe=8, rerank=0)
    scores, reranked = index.search(q, 100, nprobe=8, rerank=300)
    r10, r100 = recall(plain, gt, 10), recall(plain, gt, 100)
    rr10, rr100 = recall(reranked, gt, 10), recall(reranked, gt, 100)
    assert r10 >= 0.75 and r100 >= 0.85, (r10, r100)
    assert rr10 >= 0.97 and rr100 >= 0.97, (rr10, rr100)
    assert rr10 - r10 >= 0.1  # the exact re-rank fixes most of the PQ's ordering error
    # re-ranked scores are exact inner products (fp16-stored vectors) and sorted
    exact = np.einsum("nd,nkd->nk", q, x[reranked].astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(scores, exact, rtol=1e-4, atol=1e-3)
    assert (np.diff(scores, axis=1) <= 0).all()
    # more probes never lose much, one probe loses recall: nprobe is honoured
    _, one = index.search(q, 100, nprobe=1, rerank=300)
    assert recall(one, gt, 100) < rr100


@needs_c
def test_ip_assignment_option_works(data):
    x, q, gt = data
    index = build_index(x, "ivfpq,nlist=64,m=16,store=fp32,assign=ip,spherical=false,niter=10,pq_niter=10,rerank=300")
    assert index.assign == "ip" and index.train_params["spherical"] is False
    _, ids = index.search(q, 100, nprobe=8)
    assert recall(ids, gt, 10) >= 0.97


def test_numpy_backend_recall(small):
    x, q = small
    gt = exact_topk(x, q, 10)
    index = build_index(x, "ivfpq,nlist=16,m=8,fp32,niter=8,pq_niter=8,backend=numpy")
    assert not index.compiled
    _, plain = index.search(q, 10, nprobe=4, rerank=0)
    _, reranked = index.search(q, 10, nprobe=4, rerank=100)
    assert recall(plain, gt, 10) >= 0.5
    assert recall(reranked, gt, 10) >= 0.95


# ---------------------------------------------------------------------------------------------------------------
# compiled == numpy fallback on the same trained state


@needs_c
@pytest.mark.parametrize("store", ["fp16", "fp32"])
def test_numpy_fallback_matches_compiled(small, store):
    x, q = small
    ref = IVFPQIndex(32, nlist=16, m=8, store=store, niter=8, pq_niter=8, backend="numpy")
    ref.train(x)
    ref.add(x)
    comp = IVFPQIndex(32, nlist=16, m=8, store=store, backend="compiled")
    comp.set_trained(ref._impl.centroids(), ref._impl.codebooks())
    comp.add(x)
    assert comp.compiled and not ref.compiled
    lists_c, codes_c = comp.codes()
    lists_n, codes_n = ref.codes()
    # float rounding may flip a genuine near-tie, nothing more
    assert (lists_c == lists_n).mean() >= 0.999
    assert (codes_c == codes_n).mean() >= 0.999
    for nprobe, rerank, k in [(1, 0, 10), (4, 0, 37), (16, 0, 5), (4, 60, 10), (16, 200, 100)]:
        sc, ic = comp.search(q, k, nprobe=nprobe, rerank=rerank)
        sn, in_ = ref.search(q, k, nprobe=nprobe, rerank=rerank)
        assert (ic == in_).mean() >= 0.99, (nprobe, rerank, k)
        same = ic == in_
        np.testing.assert_allclose(sc[same], sn[same], rtol=1e-5, atol=1e-4)


@needs_c
def test_encode_matches_between_backends(small):
    x, _ = small
    c = _C.IVFPQ(32, 16, 8, 8, "none")
    c.train(x, niter=5, pq_niter=5)
    n = NumpyIVFPQ(32, 16, 8)
    n.set_trained(c.centroids(), c.codebooks())
    lc, cc = c.encode(x)
    ln, cn = n.encode(x)
    assert (lc == ln).mean() >= 0.999 and (cc == cn).mean() >= 0.999


# ---------------------------------------------------------------------------------------------------------------
# shapes, ids, threads


@needs_c
def test_ids_padding_and_threads(small):
    x, q = small
    index = IVFPQIndex(32, nlist=8, m=4, store="fp16", niter=5, pq_niter=5)
    index.train(x)
    ids = np.arange(len(x), dtype=np.int64) * 10 + 7
    index.add(x[:300], ids=ids[:300])
    # k larger than what the probed lists hold: -1 / -inf padding after the real results
    s, i = index.search(q, 400, nprobe=8, rerank=0)
    assert (i[:, :300] >= 0).all() and (i[:, 300:] == -1).all() and np.isneginf(s[:, 300:]).all()
    assert set(i[0, :300].tolist()) == set(ids[:300].tolist())
    index.add(x[300:], ids=ids[300:])
    s1, i1 = index.search(q, 20, nprobe=4, rerank=50, threads=1)
    s2, i2 = index.search(q, 20, nprobe=4, rerank=50, threads=2)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(s1, s2)
    # many Python threads at once (the GIL is released) give the serial answer
    out = [None] * 8

    def worker(t):
        out[t] = index.search(q, 20, nprobe=4, rerank=50)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s, i in out:
        np.testing.assert_array_equal(i, i1)
    # one query as a 1-D vector
    s, i = index.search(q[0], 5, nprobe=4)
    assert s.shape == (1, 5) and i.shape == (1, 5)


def test_defaults():
    assert default_m(768) == 96 and default_m(384) == 48 and default_m(30) == 3
    assert default_nlist(100_000) == 1024 and default_nlist(1_000_000) == 4096
    assert default_nlist(100) == 2 and default_nlist(10) == 1
    # 4-bit codes scan faster: about 2 sqrt(n) lists
    assert default_nlist(23_582, 4) == 256 and default_nlist(23_582) == 512 and default_nlist(1_000_000, 4) == 2048
    assert default_nlist(10, 4) == 1


# ---------------------------------------------------------------------------------------------------------------
# files


def _roundtrip_backends():
    out = [("numpy", "py")]
    if HAVE_C:
        out += [("compiled", "compiled"), ("numpy", "compiled"), ("compiled", "py")]
    return out


@pytest.mark.parametrize("backend,reader", _roundtrip_backends())
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_roundtrip(tmp_path, small, backend, reader, mmap):
    x, q = small
    index = IVFPQIndex(32, nlist=8, m=8, store="fp16", nprobe=3, rerank=40, niter=5, pq_niter=5, backend=backend)
    index.train(x)
    index.add(x, ids=np.arange(len(x)) + 1000)
    (tmp_path / "idx").mkdir()
    path = index.save(tmp_path / "idx")  # a directory gets index.fdpr inside
    assert os.path.basename(path) == "index.fdpr"
    if reader == "py":
        raw = fileformat.PyReader(path)
        loaded = IVFPQIndex._read(raw, mmap=mmap)
        loaded._restore_labels(raw)
    else:
        loaded = load_index(tmp_path / "idx", mmap=mmap)
    assert isinstance(loaded, IVFPQIndex) and len(loaded) == len(x) and loaded.dim == 32
    assert loaded.nprobe == 3 and loaded.rerank == 40
    s0, i0 = index.search(q, 10)
    s1, i1 = loaded.search(q, 10)
    if loaded.compiled == index.compiled:
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(s0, s1)
    else:  # the other backend on the same state: same answers up to float rounding
        assert (i0 == i1).mean() >= 0.99
        np.testing.assert_allclose(s0, s1, rtol=1e-5, atol=1e-4)
    assert i1.min() >= 1000
    # a loaded (possibly memory-mapped) index still accepts adds
    loaded.add(x[:10], ids=np.arange(10))
    assert len(loaded) == len(x) + 10


@needs_c
def test_untrained_index_roundtrip(tmp_path):
    index = IVFPQIndex(16, nlist=4, m=4)
    path = index.save(tmp_path / "u.fdpr")
    loaded = load_index(path)
    assert not loaded.is_trained and len(loaded) == 0


@pytest.mark.parametrize("use_compiled", [True, False])
def test_corrupted_and_truncated_files(tmp_path, small, use_compiled):
    if use_compiled and not HAVE_C:
        pytest.skip("compiled extension not built")
    x, _ = small
    index = IVFPQIndex(32, nlist=8, m=8, store="fp32", niter=3, pq_niter=3,
                       backend="compiled" if use_compiled else "numpy")
    index.train(x)
    index.add(x)
    path = index.save(tmp_path / "good.fdpr")
    blob = path.read_bytes()

    def load(p):
        if use_compiled:
            return load_index(p)
        raw = fileformat.PyReader(p)
        return IVFPQIndex._read(raw)

    bad_cases = {
        "flip": blob[: len(blob) // 2] + bytes([blob[len(blob) // 2] ^ 0xFF]) + blob[len(blob) // 2 + 1:],
        "truncated": blob[: len(blob) - 100],
        "header": blob[:10],
        "empty": b"",
        "garbage": os.urandom(4096),
    }
    for name, content in bad_cases.items():
        p = tmp_path / f"{name}.fdpr"
        p.write_bytes(content)
        with pytest.raises(InputError, match="not a valid fastdpr index"):
            load(p)
    # a random byte flip anywhere is caught (fuzz, seeded)
    rng = np.random.default_rng(5)
    for trial in range(20):
        at = int(rng.integers(0, len(blob)))
        p = tmp_path / f"fuzz{trial}.fdpr"
        p.write_bytes(blob[:at] + bytes([blob[at] ^ (1 << int(rng.integers(8)))]) + blob[at + 1:])
        with pytest.raises(InputError):
            load(p)


@needs_c
def test_consistent_but_wrong_metadata_is_rejected(tmp_path, small):
    """A file with valid checksums but impossible contents (written on purpose) is refused, never trusted."""
    x, _ = small
    ref = IVFPQIndex(32, nlist=8, m=8, niter=3, pq_niter=3, backend="numpy")
    ref.train(x)
    ref.add(x[:500])
    impl = ref._impl
    impl._pos[0] = impl._pos[0] + 10_000  # positions past the end
    path = tmp_path / "bad.fdpr"
    w = fileformat.open_writer(path, "ivfpq", compiled=False)
    impl.write_sections(w)
    w.commit()
    with pytest.raises(InputError, match="out of range"):
        load_index(path)
    with pytest.raises(InputError, match="out of range"):
        NumpyIVFPQ.read_sections(fileformat.PyReader(path))


# ---------------------------------------------------------------------------------------------------------------
# bad parameters


def test_bad_params_have_clear_messages(small):
    x, q = small
    with pytest.raises(InputError, match="m=7 must divide the dimension 32"):
        build_index(x, "ivfpq,nlist=8,m=7")
    with pytest.raises(InputError, match="nlist=5000 exceeds the 3000 training vectors"):
        build_index(x, "ivfpq,nlist=5000,m=8")
    with pytest.raises(InputError, match="at least 256"):
        build_index(x[:100], "ivfpq,nlist=4,m=8")
    with pytest.raises(InputError, match="nbits=5 is not supported"):
        build_index(x, "ivfpq,nlist=8,m=8,nbits=5")
    with pytest.raises(InputError, match="unknown parameter"):
        build_index(x, "ivfpq,nlist=8,m=8,efc=3")
    with pytest.raises(InputError, match="spherical must be true or false"):
        build_index(x, "ivfpq,nlist=8,m=8,spherical=maybe")
    with pytest.raises(InputError, match="store must be"):
        build_index(x, "ivfpq,nlist=8,m=8,store=int8")
    with pytest.raises(InputError, match="needs the full vectors"):
        build_index(x, "ivfpq,nlist=8,m=8,rerank=10")
    index = IVFPQIndex(32, nlist=8, m=8)
    with pytest.raises(InputError, match="must be trained"):
        index.add(x)
    index.train(x)
    with pytest.raises(InputError, match="empty"):
        index.search(q, 5)
    index.add(x)
    with pytest.raises(InputError, match="needs the full vectors"):
        index.search(q, 5, rerank=10)
    with pytest.raises(InputError, match="nprobe must be >= 1"):
        index.search(q, 5, nprobe=-1)
    with pytest.raises(InputError, match="dimension 31"):
        index.search(q[:, :31], 5)
    bad = q.copy()
    bad[3, 4] = np.nan
    with pytest.raises(InputError, match="row 3"):
        index.search(bad, 5)
    with pytest.raises(InputError, match="already holds vectors"):
        index.train(x)


@needs_c
def test_every_simd_level_matches_reference(small):
    """The panel kernel and IVF-PQ search at each SIMD level this CPU has (scalar baseline, AVX2, AVX-512)."""
    x, q = small
    levels = simd_levels(_C)
    rng = np.random.default_rng(31)
    a = rng.normal(size=(45, 70)).astype(np.float32)
    b = rng.normal(size=(333, 70)).astype(np.float32)
    index = IVFPQIndex(32, nlist=8, m=8, store="fp32", niter=4, pq_niter=4)
    index.train(x)
    index.add(x)
    results = {}
    for level in levels:
        with capped(_C, level):
            np.testing.assert_allclose(_C.inner_products(a, b), a.astype(np.float64) @ b.T.astype(np.float64),
                                       rtol=1e-4, atol=1e-3)
            results[level] = index.search(q, 20, nprobe=4, rerank=0)
            lists, codes = index._impl.encode(x[:500])
            results[level + "-codes"] = codes
    s0, i0 = results["scalar"]
    for level in levels[1:]:
        s, i = results[level]
        assert (i == i0).mean() >= 0.99
        np.testing.assert_allclose(s, s0, rtol=1e-5, atol=1e-4)
        assert (results[level + "-codes"] == results["scalar-codes"]).mean() >= 0.999
    skip_unrun(SIMD_LEVELS, levels)


@needs_c
def test_search_while_adding(small):
    """Searches running during adds see a consistent index (never a crash or a half-added row)."""
    x, q = small
    index = IVFPQIndex(32, nlist=8, m=8, store="fp16", niter=3, pq_niter=3)
    index.train(x)
    index.add(x[:500])
    errors, stop = [], threading.Event()

    def searcher():
        while not stop.is_set():
            try:
                s, i = index.search(q, 10, nprobe=8, rerank=30)
                assert ((i >= 0) & (i < len(x))).all()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    for start in range(500, len(x), 250):
        index.add(x[start:start + 250])
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(index) == len(x)


@needs_c
@pytest.mark.parametrize("store,sq", [("fp16", 0), ("fp32", 4), ("none", 4)])
@pytest.mark.parametrize("reserve", [0, 700, 5000])
def test_many_small_adds_with_or_without_reserve_equal_one_add(store, sq, reserve):
    rng = np.random.default_rng(reserve + sq)
    x = rng.standard_normal((1100, 24)).astype(np.float32)
    params = {"nlist": 8, "m": 6, "nbits": 4, "store": store, "sq": sq}
    one, many = IVFPQIndex.from_spec(24, params), IVFPQIndex.from_spec(24, params)
    one.train(x)
    many.train(x)  # (seeded: the same centroids, codebooks and 4-bit row ranges)
    one.add(x)
    many.reserve(reserve)
    for start in range(0, len(x), 37):
        many.add(x[start:start + 37])
    q = rng.standard_normal((9, 24)).astype(np.float32)
    for kwargs in ({"rerank": 0}, {"rerank": 60, "exact": 0}, {"rerank": 60, "exact": 20}):
        if not sq and "exact" in kwargs:
            continue
        s1, i1 = one.search(q, 10, nprobe=3, **kwargs)
        s2, i2 = many.search(q, 10, nprobe=3, **kwargs)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(s1, s2)
    with pytest.raises(InputError, match="reserve"):
        many.reserve(-1)
