"""4-bit fast-scan PQ (csrc/pq4.*) and its IVF integration (ivfpq,nbits=4): every SIMD level against the scalar
path, the quantized table's error bound, the anisotropic training (fastdpr/index/pq4.py), recall against exact
search and files. Small sizes: the file runs in seconds."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import SIMD_LEVELS, capped, extension, simd_levels, skip_unrun

from fastdpr.errors import InputError
from fastdpr.index import pq4
from fastdpr.index import build_index, load_index

_C = extension("pq4_scan")
HAVE_C = _C is not None

pytestmark = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")

LEVELS = simd_levels(_C)


def clustered(rng, n, d, n_clusters=16, rank=4):
    """Non-normalised Gaussian mixture with log-normal norms (the shape of DPR-like embeddings)."""
    centres = rng.normal(size=(n_clusters, d))
    basis = rng.normal(size=(n_clusters, rank, d)) / np.sqrt(rank)
    lab = rng.integers(0, n_clusters, n)
    x = centres[lab] + np.einsum("nr,nrd->nd", rng.normal(size=(n, rank)), basis[lab]) + 0.3 * rng.normal(size=(n, d))
    x *= np.exp(0.25 * rng.normal(size=(n, 1)))
    return np.ascontiguousarray(x, dtype=np.float32)


def recall(ids, gt):
    k = gt.shape[1]
    return float(np.mean([len(set(ids[i, :k]) & set(gt[i])) / k for i in range(len(gt))]))


def table_sums(table, codes):
    """The exact integer sums the kernels must produce: sum_j table[j, code_j]."""
    m = codes.shape[1]
    return table[:m].astype(np.int64)[np.arange(m)[None], codes].sum(1)


# ---------------------------------------------------------------------------------------------------------------
# kernel


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 47, 48, 193])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 77, 1001])
def test_scan_every_level_equals_scalar(m, n):
    rng = np.random.default_rng(1000 * m + n)
    codes = rng.integers(0, 16, (n, m)).astype(np.uint8)
    blocks = _C.pq4_pack(codes)
    assert blocks.size == -(-n // 32) * _C.pq4_padded_m(m) * 16
    np.testing.assert_array_equal(_C.pq4_unpack(blocks, n, m), codes)
    table, *_ = _C.pq4_quantize_lut(rng.normal(size=(m, 16)).astype(np.float32))
    want = table_sums(table, codes)
    for level in LEVELS:
        got = _C.pq4_scan(blocks, n, m, table, level)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, want, err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


def test_scan_sums_near_the_uint16_limit_do_not_wrap():
    """Many sub-spaces whose largest entries all get picked: the sum sits just under 2^16 at every level."""
    m, n = 700, 64
    rng = np.random.default_rng(3)
    lut = rng.normal(size=(m, 16)).astype(np.float32)
    table, _, delta, *_ = _C.pq4_quantize_lut(lut)
    best = np.argmax(table[:m], 1).astype(np.uint8)
    codes = np.repeat(best[None], n, 0)
    codes[1::2] = rng.integers(0, 16, (n // 2, m))
    want = table_sums(table, codes)
    assert want.max() > 60000 and want.max() < 65536  # the shared scale is set by the sum bound here
    for level in LEVELS:
        np.testing.assert_array_equal(_C.pq4_scan(_C.pq4_pack(codes), n, m, table, level), want, err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


@pytest.mark.parametrize("m", [1, 7, 48, 192, 700])
def test_quantized_scores_within_the_documented_bound(m):
    rng = np.random.default_rng(m)
    lut = (rng.normal(size=(m, 16)) * rng.uniform(0.1, 3, (m, 1))).astype(np.float32)
    table, bias, delta, bound, _ = _C.pq4_quantize_lut(lut)
    assert table.shape == (_C.pq4_padded_m(m), 16) and not table[m:].any()
    assert bound == pytest.approx(m * delta / 2)
    codes = rng.integers(0, 16, (500, m)).astype(np.uint8)
    exact = lut.astype(np.float64)[np.arange(m)[None], codes].sum(1)
    approx = bias + delta * _C.pq4_scan(_C.pq4_pack(codes), 500, m, table).astype(np.float64)
    err = np.abs(approx - exact)
    assert err.max() <= bound * (1 + 1e-5) + 1e-5 * np.abs(exact).max()
    assert err.max() > 0  # the check has something to check


def test_quantize_lut_edge_cases():
    t, bias, delta, *_ = _C.pq4_quantize_lut(np.full((3, 16), 2.5, np.float32))
    assert not t.any() and bias == pytest.approx(7.5)  # constant rows: every entry 0, the offsets carry the score
    lut = np.zeros((2, 16), np.float32)
    lut[1, 3] = np.nan
    t, bias, delta, *_ = _C.pq4_quantize_lut(lut)
    assert np.isnan(bias) and delta == 0 and not t.any()
    with pytest.raises(ValueError, match=r"\(m, 16\)"):
        _C.pq4_quantize_lut(np.zeros((2, 8), np.float32))


@pytest.mark.parametrize("m", [1, 2, 3, 47, 192, 701])
def test_quantize_lut_every_level_equals_scalar(m):
    """The AVX-512 table is the scalar one to the bit (bias, scale, every entry) and so is the largest sum."""
    rng = np.random.default_rng(m)
    luts = [(rng.normal(size=(m, 16)) * rng.uniform(0.01, 30, (m, 1)) + rng.normal(size=(m, 1))).astype(np.float32),
            np.round(rng.normal(size=(m, 16)), 1).astype(np.float32),  # ties: several entries equal to a row's min
            np.full((m, 16), -0.0, np.float32)]
    bad = luts[0].copy()
    bad[m // 2, 5] = np.inf
    luts.append(bad)
    for lut in luts:
        want = _C.pq4_quantize_lut(lut, "scalar")
        table = want[0]
        if np.isfinite(want[1]):
            assert want[4] == table[:m].max(1).astype(np.int64).sum()  # the largest sum a code row can reach
        else:
            assert want[4] == 0 and not table.any()
        for level in LEVELS:
            got = _C.pq4_quantize_lut(lut, level)
            np.testing.assert_array_equal(got[0], table, err_msg=level)
            assert got[1:] == want[1:] or (np.isnan(got[1]) and np.isnan(want[1]) and got[2:] == want[2:]), level
    skip_unrun(SIMD_LEVELS, LEVELS)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 32, 33, 100, 1001])
def test_filter_every_level_equals_the_reference(n):
    rng = np.random.default_rng(n)
    sums = rng.integers(0, 65536, n).astype(np.uint16)
    sums[::7] = 65535
    for floor in (0, 1, 30000, 65535, 65536, *(sums[:3].tolist())):
        want = np.flatnonzero(sums.astype(np.int64) >= floor)
        for level in LEVELS:
            np.testing.assert_array_equal(_C.pq4_filter(sums, floor, level), want, err_msg=f"{level} {floor}")
    with pytest.raises(ValueError, match="floor"):
        _C.pq4_filter(sums, 65537)
    skip_unrun(SIMD_LEVELS, LEVELS)


def test_first_reaching_is_the_exact_inverse_of_the_score():
    """The smallest sum whose float score reaches a threshold, checked against every sum around it; includes
    thresholds that equal a score exactly, scales where rounding makes neighbouring sums score the same, a
    threshold no sum reaches and one every sum reaches."""
    rng = np.random.default_rng(7)
    cases = [(float(rng.normal() * 10), float(rng.uniform(1e-6, 1e-2)), float(rng.normal() * 10)) for _ in range(300)]
    cases += [(1e4, 1e-6, 1e4 + 0.01), (-3.0, 1e-3, 50.0), (2.0, 1e-3, -np.inf), (2.0, 1e-3, 1.5),
              (np.nan, 1e-3, 0.0), (1.0, 0.0, 0.0), (-np.inf, 1e-3, 0.0), (-np.inf, 1e-3, -np.inf)]
    for base, delta, _ in cases[:100]:  # thresholds that are exactly some sum's score
        s = int(rng.integers(0, 65536))
        cases.append((base, delta, _C.pq4_score(base, delta, s)))
    for base, delta, thr in cases:
        base, delta, thr = (float(np.float32(v)) for v in (base, delta, thr))  # what the kernels see
        s = _C.pq4_first_reaching(base, delta, thr)
        if delta == 0:  # the mark of a non-finite table: nothing is scored
            assert s == 65536
            continue
        assert 0 <= s <= 65536
        if s < 65536:
            assert _C.pq4_score(base, delta, s) >= thr, (base, delta, thr, s)
        if s > 0:
            lower = range(max(0, s - 3), s) if s < 65536 else range(65533, 65536)
            assert all(not (_C.pq4_score(base, delta, t) >= thr) for t in lower), (base, delta, thr, s)


def test_pack_rejects_codes_above_4_bits_and_scan_checks_sizes():
    with pytest.raises(ValueError, match="not a 4-bit code"):
        _C.pq4_pack(np.full((2, 3), 16, np.uint8))
    blocks = _C.pq4_pack(np.zeros((40, 3), np.uint8))
    table = np.zeros((4, 16), np.uint8)
    with pytest.raises(ValueError, match="packed bytes"):
        _C.pq4_scan(blocks, 70, 3, table)
    with pytest.raises(ValueError, match="quantized table"):
        _C.pq4_scan(blocks, 40, 3, np.zeros((3, 16), np.uint8))


@pytest.mark.parametrize("k", [1, 10, 100, 5000])
def test_topk_equals_sorting_the_scalar_scan(k):
    n, m = 5000, 24  # three chunks of up to 64 blocks: the scan of each is told the next one to prefetch
    rng = np.random.default_rng(k)
    codes = rng.integers(0, 16, (n, m)).astype(np.uint8)
    blocks = _C.pq4_pack(codes)
    table, *_ = _C.pq4_quantize_lut(rng.normal(size=(m, 16)).astype(np.float32))
    sums = _C.pq4_scan(blocks, n, m, table, "scalar").astype(np.int64)
    order = np.lexsort((np.arange(n), -sums))[:k]  # score descending, index ascending on ties
    for level in LEVELS:
        s, ids = _C.pq4_topk(blocks, n, m, table, k, level)
        np.testing.assert_array_equal(ids, order, err_msg=level)
        np.testing.assert_array_equal(s, sums[order], err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


# ---------------------------------------------------------------------------------------------------------------
# anisotropic training


def test_anisotropic_eta():
    assert pq4.anisotropic_eta(384, 0.0) == pytest.approx(1.0, rel=1e-3)  # no threshold: plain squared error
    ratios = [pq4.anisotropic_eta(d, 0.2) / ((d - 1) * 0.04 / 0.96) for d in (128, 384, 768, 20000)]
    assert all(r > 1 for r in ratios) and ratios == sorted(ratios, reverse=True)
    assert ratios[-1] < 1.01  # T = 0.2: the large-d limit (d - 1) T^2 / (1 - T^2) of the paper's Theorem 3.4
    # the integral against a Monte Carlo estimate: q uniform on the sphere, t = q[0] conditioned on t >= 0.2
    q = np.random.default_rng(0).normal(size=(400_000, 16))
    t = q[:, 0] / np.linalg.norm(q, axis=1)
    m2 = float(np.mean(t[t >= 0.2] ** 2))
    assert pq4.conditional_second_moment(16, 0.2) == pytest.approx(m2, rel=0.01)
    assert pq4.anisotropic_eta(384, 0.3) > pq4.anisotropic_eta(384, 0.2)
    with pytest.raises(InputError, match=r"\[0, 1\)"):
        pq4.anisotropic_eta(384, 1.0)


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(11)
    n, d, m = 3000, 32, 16
    x = clustered(rng, n, d)
    resid = x - x.mean(0)  # one coarse centroid: the residuals of a single IVF list
    # plain k-means codebooks: the starting point and the baseline
    from fastdpr.index.kmeans import kmeans

    cb = np.stack([kmeans(np.ascontiguousarray(resid[:, j * 2:(j + 1) * 2]), 16, 20, 5 + j, False, 256)
                   for j in range(m)])
    eta = pq4.anisotropic_eta(d, 0.2)
    refined, codes, losses = pq4.train_anisotropic(x, resid, cb, eta, niter=6)
    return x, resid, cb, eta, refined, codes, losses


def test_anisotropic_loss_decreases_and_beats_kmeans(trained):
    x, resid, cb, eta, refined, codes, losses = trained
    assert len(losses) == 7
    assert all(b <= a * (1 + 1e-5) for a, b in zip(losses, losses[1:])), losses
    kmeans_loss = pq4.anisotropic_loss(x, resid - pq4.reconstruct(pq4.nearest_codes(resid, cb), cb), eta)
    assert losses[0] == pytest.approx(kmeans_loss, rel=1e-4)
    final = pq4.anisotropic_loss(x, resid - pq4.reconstruct(codes, refined), eta)
    assert final == pytest.approx(losses[-1], rel=1e-4)
    assert final < 0.9 * kmeans_loss  # 15% lower here (eta ~ 2.9 at d = 32; more at larger d)
    # what the loss stands for: the score error of the queries that rank a point high is smaller
    rng = np.random.default_rng(5)
    q = clustered(rng, 200, x.shape[1])
    s = q @ x.T
    top = s >= np.quantile(s, 0.99, axis=1, keepdims=True)
    err_km = np.abs(q @ (resid - pq4.reconstruct(pq4.nearest_codes(resid, cb), cb)).T)[top].mean()
    err_an = np.abs(q @ (resid - pq4.reconstruct(codes, refined)).T)[top].mean()
    assert err_an < err_km


# ---------------------------------------------------------------------------------------------------------------
# IVF with 4-bit codes


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(20240611)
    n, nq, d = 6000, 100, 32
    x = clustered(rng, n + nq, d)
    q, x = x[n:], x[:n]
    gt = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :10]
    return x, q, gt


@pytest.fixture(scope="module")
def ivf4(data):
    x, _, _ = data
    return build_index(x, "ivfpq,nbits=4,nlist=32,store=fp16,aniso=0.2,aniso_niter=4")


def test_ivf4_recall_with_rerank(data, ivf4):
    x, q, gt = data
    assert ivf4.nbits == 4 and ivf4.m == 16 and ivf4.compiled
    _, ids = ivf4.search(q, 10, nprobe=32, rerank=100)
    assert recall(ids, gt) >= 0.97
    _, ids_small = ivf4.search(q, 10, nprobe=8, rerank=0)
    plain = build_index(x, "ivfpq,nbits=4,nlist=32,store=fp16")  # the default: plain k-means codebooks
    _, ids_plain = plain.search(q, 10, nprobe=8, rerank=0)
    assert recall(ids_small, gt) > recall(ids_plain, gt)  # score-aware codes rank better before any re-rank
    assert ivf4.train_losses[-1] < ivf4.train_losses[0] and plain.train_losses == []


def test_ivf4_codes_are_chosen_for_the_anisotropic_loss(data, ivf4):
    x, _, _ = data
    lists, codes = ivf4.codes()
    assert codes.shape == (len(x), 16) and codes.max() < 16
    cb = ivf4._impl.codebooks()
    resid = x - ivf4._impl.centroids()[lists]
    eta = ivf4._impl.aniso_eta
    assert eta == pytest.approx(pq4.anisotropic_eta(32, 0.2), rel=1e-6)
    stored = pq4.anisotropic_loss(x, resid - pq4.reconstruct(codes, cb), eta)
    nearest = pq4.anisotropic_loss(x, resid - pq4.reconstruct(pq4.nearest_codes(resid, cb), cb), eta)
    assert stored < nearest


def _search_at_every_level(index, q, k, **params):
    """{CPU level: index.search(q, k, **params)} with the index kernels capped at each level in turn."""
    results = {}
    for level in LEVELS:
        with capped(_C, level):
            results[level] = index.search(q, k, **params)
    return results


def test_ivf4_scores_and_results_equal_at_every_level(data, ivf4):
    _, q, _ = data
    results = _search_at_every_level(ivf4, q, 20, nprobe=4, rerank=0)
    for level in LEVELS:
        # the integer sums are identical; the list scores <q, c> they are added to come from each level's float
        # kernels, so the dequantized scores may differ in the last bits
        np.testing.assert_allclose(results[level][0], results["scalar"][0], rtol=1e-6, err_msg=level)
        np.testing.assert_array_equal(results[level][1], results["scalar"][1], err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


@pytest.mark.parametrize("k", [1, 7, 64])
def test_ivf4_search_equals_a_numpy_reference(data, ivf4, k):
    """The compiled search (candidate buffer cut back to the k best) against the same arithmetic in numpy."""
    x, q, _ = data
    impl = ivf4._impl
    centroids, cb = impl.centroids(), impl.codebooks()
    lists, codes = ivf4.codes()
    got_s, got_i = ivf4.search(q, k, nprobe=5, rerank=0)
    overlap = []
    for r, qv in enumerate(q):
        coarse = centroids @ qv
        probe = np.lexsort((np.arange(len(coarse)), -coarse))[:5]
        lut = np.einsum("jcd,jd->jc", cb, qv.reshape(ivf4.m, -1)).astype(np.float32)
        table, bias, delta, *_ = _C.pq4_quantize_lut(lut)
        rows = np.flatnonzero(np.isin(lists, probe))
        sums = table_sums(table, codes[rows])
        scores = (coarse[lists[rows]] + bias).astype(np.float32) + np.float32(delta) * sums.astype(np.float32)
        best = np.lexsort((rows, -scores))[:k]
        np.testing.assert_allclose(got_s[r], scores[best], rtol=1e-5, atol=1e-4)
        overlap.append(len(set(got_i[r]) & set(rows[best])) / k)
    assert np.mean(overlap) >= 0.99  # ids may differ only between scores equal to float rounding


@pytest.mark.parametrize("mmap", [False, True])
def test_ivf4_save_load_round_trip(tmp_path, data, ivf4, mmap):
    x, q, _ = data
    path = tmp_path / "ivf4.fdpr"
    ivf4.save(path)
    back = load_index(path, mmap=mmap)
    assert back.nbits == 4 and back.m == ivf4.m and len(back) == len(ivf4)
    assert back._impl.aniso_eta == ivf4._impl.aniso_eta
    for a, b in zip(ivf4.codes(), back.codes()):
        np.testing.assert_array_equal(a, b)
    for rerank in (0, 50):
        for a, b in zip(ivf4.search(q, 10, nprobe=8, rerank=rerank), back.search(q, 10, nprobe=8, rerank=rerank)):
            np.testing.assert_array_equal(a, b)
    # vectors added after loading get the codes the original index gives them
    extra = x[:70] * 1.01
    if not mmap:
        _, want = ivf4._impl.encode(extra)
        _, got = back._impl.encode(extra)
        np.testing.assert_array_equal(got, want)
    back.add(extra)
    assert len(back) == len(x) + 70


def _rewrite(src, dst, change):
    """Copy an index file section by section (metadata included), letting ``change(name, bytes)`` alter one."""
    from fastdpr.index import fileformat

    r = fileformat.PyReader(src)
    w = fileformat.PyWriter(dst, r.type)
    for name in r.names():
        if name != "meta":
            w.add(name, change(name, np.array(r.section(name))))
    for key, value in r._meta.items():
        w.meta(key, value)
    w.commit()
    return dst


@pytest.mark.parametrize("use_native", [True, False])
def test_ivf4_file_with_wrong_code_section_is_refused(tmp_path, ivf4, use_native):
    from fastdpr.index._native import force_fallback

    good = tmp_path / "ivf4.fdpr"
    ivf4.save(good)
    short = _rewrite(good, tmp_path / "short.fdpr", lambda name, b: b[:-16] if name == "codes" else b)
    force_fallback(not use_native)
    try:
        # both readers size the packed codes from the list sizes
        with pytest.raises((InputError, ValueError), match="wrong length"):
            load_index(short)
        assert len(load_index(good)) == len(ivf4)
    finally:
        force_fallback(False)


def test_ivf4_bad_settings(data):
    x, _, _ = data
    with pytest.raises(InputError, match="aniso"):
        build_index(x, "ivfpq,nbits=4,nlist=8,aniso=1.5")
    with pytest.raises(InputError, match="nbits=5 is not supported"):
        build_index(x, "ivfpq,nbits=5,nlist=8")
    with pytest.raises(ValueError, match="at most 2048"):
        _C.IVFPQ(4096, 4, 4096, 4, "none")
    from fastdpr.errors import MissingDependency

    with pytest.raises(MissingDependency, match="nbits=4"):
        build_index(x, "ivfpq,nbits=4,nlist=8,backend=numpy")
    with pytest.raises(ValueError, match="aniso_eta applies to 4-bit"):
        _C.IVFPQ(8, 4, 2, 8, "none").aniso_eta = 4.0


@pytest.mark.parametrize("k,rerank", [(1, 0), (3, 0), (10, 0), (5, 12), (40, 0)])
def test_ivf4_equal_scores_across_the_candidate_cut_keep_the_smallest_ids(k, rerank):
    """Exact copies of a vector share a list and codes, hence a score: when the candidate buffer is cut inside such
    a group, the copies kept must be those with the smallest ids (the order every index uses), and equal scores
    come back in id order."""
    rng = np.random.default_rng(k * 100 + rerank)
    distinct = clustered(rng, 300, 16)
    copies = 7
    source = rng.permutation(np.repeat(np.arange(len(distinct)), copies))  # row r is a copy of distinct[source[r]]
    x = distinct[source]
    index = build_index(x, "ivfpq,nbits=4,nlist=8,store=fp16,niter=4,pq_niter=4")
    q = clustered(rng, 40, 16)
    scores, ids = index.search(q, k, nprobe=8, rerank=rerank)
    assert (ids >= 0).all()
    for s_row, i_row in zip(scores, ids):
        assert np.all(np.diff(s_row) <= 0)
        for a in range(len(i_row) - 1):
            if s_row[a] == s_row[a + 1]:
                assert i_row[a] < i_row[a + 1]
        for g in np.unique(source[i_row]):
            group = np.flatnonzero(source == g)  # ascending ids of every copy
            got = np.sort(i_row[source[i_row] == g])
            np.testing.assert_array_equal(got, group[:len(got)])


def test_ivf4_results_for_each_k_are_prefixes_of_a_longer_list(data, ivf4):
    """The best k by (score, then smaller id) are the first k of the best K > k: each k cuts the candidate buffer
    at different sizes and moments, so every cut must keep exactly the best candidates."""
    _, q, _ = data
    long_s, long_i = ivf4.search(q, 1000, nprobe=10, rerank=0)
    assert (long_i >= 0).all()
    for k in (1, 2, 5, 17, 64, 300, 999):
        s, i = ivf4.search(q, k, nprobe=10, rerank=0)
        np.testing.assert_array_equal(i, long_i[:, :k], err_msg=str(k))
        np.testing.assert_array_equal(s, long_s[:, :k], err_msg=str(k))
    # with a re-rank the candidates are the best `rerank` whatever k <= rerank
    long_s, long_i = ivf4.search(q, 150, nprobe=6, rerank=150)
    for k in (1, 9, 100):
        s, i = ivf4.search(q, k, nprobe=6, rerank=150)
        np.testing.assert_array_equal(i, long_i[:, :k], err_msg=str(k))
        np.testing.assert_array_equal(s, long_s[:, :k], err_msg=str(k))


@pytest.mark.parametrize("dsub", [1, 2, 3])
def test_ivf4_query_tables_are_identical_at_every_level(dsub):
    """With one all-zero centroid the coarse score is exactly 0 at every level, so a dequantized score comes only
    from the query's table (built and quantized per level) and must agree to the bit: a wide kernel that fused a
    multiply and an add would round the table, its offset and its scale differently."""
    from fastdpr.index.ivfpq import IVFPQIndex

    rng = np.random.default_rng(11 + dsub)
    m = 13
    d = m * dsub
    x = clustered(rng, 3000, d)
    q = clustered(rng, 60, d) * 3.7
    index = IVFPQIndex(d, nlist=1, m=m, nbits=4, store="fp16")
    index.set_trained(np.zeros((1, d), np.float32), (rng.normal(size=(m, 16, dsub)) * 1.3).astype(np.float32))
    index.add(x)
    results = _search_at_every_level(index, q, 50, nprobe=1, rerank=0)
    for level in LEVELS:
        np.testing.assert_array_equal(results[level][0], results["scalar"][0], err_msg=level)
        np.testing.assert_array_equal(results[level][1], results["scalar"][1], err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


@pytest.mark.parametrize("nbits", [4, 8])
def test_ivf_adds_in_batches_equal_one_add(data, nbits):
    # the codes live in one allocation with room per list: batches that fit the room left by an earlier add and
    # batches that make the lists move must both give what one add gives
    x, q, _ = data
    one = _C.IVFPQ(x.shape[1], 16, 16, nbits, "fp16")
    one.train(x, niter=4, pq_niter=4)
    many = _C.IVFPQ(x.shape[1], 16, 16, nbits, "fp16")
    many.set_trained(one.centroids(), one.codebooks())
    one.add(x)
    for a, b in [(0, 3000), (3000, 3010), (3010, 3500), (3500, 6000)]:
        many.add(x[a:b])
    assert len(many) == len(one) == len(x)
    for ln in range(16):
        np.testing.assert_array_equal(many.list_codes(ln), one.list_codes(ln))
        np.testing.assert_array_equal(many.list_positions(ln), one.list_positions(ln))
    for rerank in (0, 40):
        for a, b in zip(one.search(q, 10, 6, rerank), many.search(q, 10, 6, rerank)):
            np.testing.assert_array_equal(a, b)
