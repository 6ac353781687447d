"""The numpy IVF-PQ on 4-bit codes and 4-bit rows (fastdpr/index/numpy_pq4.py) against the compiled index.

Its parts against the compiled kernels bit for bit; whole searches of the same file at the specs the compiled tests
use, with every search option: bit-identical answers on integer data (every sum is exact in any order, and equal
scores are everywhere, so ties by id are tested throughout), the same answers up to ties within float rounding on
random data; files written by one backend and read by the other, byte for byte. Small sizes: seconds."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import SIMD_LEVELS, capped, extension, simd_levels, skip_unrun

from fastdpr.errors import InputError, MissingDependency
from fastdpr.index import fileformat, numpy_pq4
from fastdpr.index._native import force_fallback
from fastdpr.index import build_index, load_index
from fastdpr.index.ivfpq import IVFPQIndex, NumpyIVFPQ

_C = extension("pq4_quantize_lut")
HAVE_C = _C is not None and hasattr(_C, "sq4_scores")

pytestmark = pytest.mark.skipif(not HAVE_C, reason="compiled extension not built")

LEVELS = simd_levels(_C)


def numpy_twin(path, mmap=False):
    """The index file read by the numpy backend."""
    force_fallback(True)
    try:
        index = load_index(path, mmap=mmap)
    finally:
        force_fallback(False)
    assert not index.compiled and isinstance(index._impl, NumpyIVFPQ)
    return index


def clustered(rng, n, d, n_clusters=12):
    centres = rng.normal(size=(n_clusters, d))
    x = centres[rng.integers(0, n_clusters, n)] + 0.4 * rng.normal(size=(n, d))
    return np.ascontiguousarray(x * np.exp(0.25 * rng.normal(size=(n, 1))), dtype=np.float32)


def assert_same_answers(got, want, atol):
    """numpy's answers (got) against the compiled ones (want): the same number of results, scores equal to within
    atol position by position, and an id different only where two results tie to within atol (a result numpy
    placed elsewhere, or one that lost a tie at the end of the list)."""
    (gs, gi), (ws, wi) = got, want
    np.testing.assert_array_equal(gi < 0, wi < 0)
    np.testing.assert_allclose(gs, ws, rtol=0, atol=atol)
    differ = np.argwhere(gi != wi)
    assert len(differ) <= max(2, 0.02 * (wi >= 0).sum()), f"{len(differ)} of {(wi >= 0).sum()} ids differ"
    for r, c in differ:
        where = np.flatnonzero(wi[r] == gi[r, c])
        ref = ws[r, where[0]] if len(where) else ws[r][wi[r] >= 0][-1]
        assert abs(gs[r, c] - ref) <= atol, (r, c, gi[r, c], gs[r, c], ref)


# ---------------------------------------------------------------------------------------------------------------
# the parts, against the compiled kernels


@pytest.mark.parametrize("m", [1, 2, 3, 5, 24, 47])
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 100])
def test_pack_and_unpack_are_the_compiled_layout(m, n):
    rng = np.random.default_rng(100 * m + n)
    codes = rng.integers(0, 16, (n, m)).astype(np.uint8)
    blocks = numpy_pq4.pack(codes, m)
    assert blocks.size == numpy_pq4.packed_bytes(n, m)
    if n:
        np.testing.assert_array_equal(blocks, _C.pq4_pack(codes).reshape(-1))
    np.testing.assert_array_equal(numpy_pq4.unpack(blocks, n, m), codes)


@pytest.mark.parametrize("m", [1, 2, 3, 47, 192, 701])
def test_quantized_tables_equal_the_compiled_ones_bit_for_bit(m):
    rng = np.random.default_rng(m + 7)
    luts = [(rng.normal(size=(m, 16)) * rng.uniform(0.01, 30, (m, 1)) + rng.normal(size=(m, 1))).astype(np.float32),
            np.round(rng.normal(size=(m, 16)), 1).astype(np.float32),  # ties at a row's minimum
            np.full((m, 16), -0.0, np.float32),  # every row constant
            (rng.normal(size=(m, 16)) * 1e30).astype(np.float32)]
    bad = luts[0].copy()
    bad[m // 2, 5] = np.nan
    luts.append(bad)
    table, bias, delta = numpy_pq4.quantize_tables(np.stack(luts))
    for i, lut in enumerate(luts):
        for level in LEVELS:
            want_table, want_bias, want_delta, _, _ = _C.pq4_quantize_lut(lut, level)
            np.testing.assert_array_equal(table[i], want_table[:m], err_msg=f"{i} {level}")
            assert delta[i] == np.float32(want_delta), (i, level)
            assert bias[i] == np.float32(want_bias) or (np.isnan(bias[i]) and np.isnan(want_bias)), (i, level)
    skip_unrun(SIMD_LEVELS, LEVELS)


def test_scan_and_scores_are_the_compiled_sums():
    rng = np.random.default_rng(3)
    m, n = 37, 500
    codes = rng.integers(0, 16, (n, m)).astype(np.uint8)
    table, bias, delta = numpy_pq4.quantize_tables(rng.normal(size=(1, m, 16)).astype(np.float32))
    want = _C.pq4_scan(_C.pq4_pack(codes), n, m, np.concatenate([table[0], np.zeros((1, 16), np.uint8)]))
    sums = numpy_pq4.scan(codes, table[0])
    np.testing.assert_array_equal(sums, want)
    scores = numpy_pq4.code_scores(np.full(n, 1.25, np.float32), bias[0], delta[0], sums)
    base = float(np.float32(1.25) + bias[0])
    np.testing.assert_array_equal(scores, [_C.pq4_score(base, float(delta[0]), int(s)) for s in sums])


@pytest.mark.parametrize("d", [1, 2, 31, 33, 65, 100])
def test_row_scores_equal_the_compiled_ones(d):
    rng = np.random.default_rng(d)
    x = (rng.normal(size=(40, d)) * rng.uniform(0.1, 3, d)).astype(np.float32)
    lo, step = _C.sq4_train(x)
    rows = _C.sq4_encode(x, lo, step)
    q = rng.normal(size=d).astype(np.float32)
    got = numpy_pq4.row_scores(q, rows, lo, step)
    scale = float(np.abs(q).sum() * np.abs(x).max())
    for level in LEVELS:
        np.testing.assert_allclose(got, _C.sq4_scores(q, rows, lo, step, level), rtol=0, atol=2e-6 * scale)
    skip_unrun(SIMD_LEVELS, LEVELS)


# ---------------------------------------------------------------------------------------------------------------
# whole searches on integer data: every sum exact, so the answers must be identical


def integer_index(nbits, d, m, nlist, store, sq, seed, n=1200):
    """A compiled index whose centroids, codebooks, vectors and queries are small integers (every product and sum
    exact in float32 in any order; each dimension of the vectors spans 15 steps, so the 4-bit rows are exact too)
    and four of whose lists are far from every vector (empty lists that rank first for some queries)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-7, 9, (n, d)).astype(np.float32)
    x[0], x[1] = -7, 8
    centroids = rng.integers(-3, 4, (nlist, d)).astype(np.float32)
    centroids[:4] = rng.choice([-40, 40], (4, d))
    codebooks = rng.integers(-4, 5, (m, 2 ** nbits, d // m)).astype(np.float32)
    index = IVFPQIndex(d, nlist=nlist, m=m, nbits=nbits, store=store, sq=sq, backend="compiled")
    index.set_trained(centroids, codebooks)
    index.add(x)
    q = rng.integers(-3, 4, (30, d)).astype(np.float32)
    return index, q


INTEGER_SPECS = [  # nbits, d, m, nlist, store, sq
    (4, 20, 10, 16, "fp16", 0),
    (4, 21, 7, 8, "fp32", 4),
    (4, 18, 18, 12, "none", 4),
    (4, 15, 15, 6, "fp16", 4),
    (4, 12, 3, 5, "none", 0),
    (8, 20, 5, 16, "fp16", 4),
    (8, 14, 7, 8, "none", 4),
]


def search_grid(index, store, sq, n):
    nl = index.nlist
    grid = []
    for nprobe in sorted({1, 2, nl // 2, nl - 1, nl}):
        for spread in (0.0, 0.5):
            grid.append(dict(k=10, nprobe=nprobe, spread=spread, rerank=0))
            if store != "none" or sq:
                for rerank, exact in ((7, 0), (60, 0), (60, 5), (60, 25), (60, "auto"), (n + 50, 12)):
                    grid.append(dict(k=10, nprobe=nprobe, spread=spread, rerank=rerank,
                                     **({"exact": exact} if sq else {})))
    grid += [dict(k=1, nprobe=1, rerank=0), dict(k=n + 30, nprobe=1, rerank=0), dict(k=n + 30, nprobe=nl)]
    return grid


@pytest.mark.parametrize("nbits,d,m,nlist,store,sq", INTEGER_SPECS)
def test_integer_data_gives_identical_answers(tmp_path, nbits, d, m, nlist, store, sq):
    index, q = integer_index(nbits, d, m, nlist, store, sq, seed=nbits * 1000 + d * 10 + nlist)
    assert any(len(index._impl.list_positions(ln)) == 0 for ln in range(nlist))
    twin = numpy_twin(index.save(tmp_path / "int.fdpr"))
    assert (twin.nbits, twin.sq, twin.store, twin.m) == (nbits, sq, store, m)
    for params in search_grid(index, store, sq, len(index)):
        want = index.search(q, **params)
        got = twin.search(q, **params)
        np.testing.assert_array_equal(got[1], want[1], err_msg=str(params))
        np.testing.assert_array_equal(got[0], want[0], err_msg=str(params))


# ---------------------------------------------------------------------------------------------------------------
# whole searches on random data at the compiled tests' specs


@pytest.fixture(scope="module")
def pool():
    rng = np.random.default_rng()  # a fresh seed each run: the equality must not depend on one draw
    x = clustered(rng, 2500 + 25, 100)
    return x[:2500], x[2500:]


RANDOM_SPECS = [  # (dimensions used, spec)
    (32, "ivfpq,nbits=4,nlist=32,store=fp16,aniso=0.2,aniso_niter=4"),
    (96, "ivfpq,nbits=4,nlist=16,m=24,fp16,sq=4,exact=50,spread=0.5"),
    (36, "ivfpq,nbits=4,nlist=16,m=12,sq=4"),
    (50, "ivfpq,nbits=4,nlist=64,m=25,store=fp32,sq=4"),
    (26, "ivfpq,nbits=4,nlist=1,m=13,store=fp16"),
    (36, "ivfpq,nbits=4,nlist=8,m=1,store=fp16,spread=0.5"),
    (96, "ivfpq,nbits=8,nlist=16,m=24,store=fp16,sq=4"),
    (52, "ivfpq,nbits=8,nlist=8,m=13,sq=4"),
]


@pytest.mark.parametrize("d,spec", RANDOM_SPECS)
def test_random_data_gives_the_compiled_answers(tmp_path, pool, d, spec):
    x, q = pool[0][:, :d].copy(), pool[1][:, :d].copy()
    index = build_index(x, spec + ",niter=4,pq_niter=4")
    twin = numpy_twin(index.save(tmp_path / "r.fdpr"))
    for params in search_grid(index, index.store, index.sq, len(index)):
        want = index.search(q, **params)
        finite = np.isfinite(want[0])
        atol = 5e-6 * float(np.abs(want[0][finite]).max()) if finite.any() else 0.0
        assert_same_answers(twin.search(q, **params), want, atol)
    # the index's own settings when a search gives none
    assert_same_answers(twin.search(q, 10), index.search(q, 10), 5e-6 * float(np.abs(index.search(q, 1)[0]).max()))


@pytest.mark.parametrize("dsub", [1, 2, 3, 5])
def test_query_tables_are_the_compiled_ones_on_random_floats(tmp_path, dsub):
    """With one all-zero centroid the coarse score is exactly 0 in any order, so a 4-bit score is only the
    query's table (summed, quantized, looked up): on random floats it must equal the compiled one to the bit."""
    rng = np.random.default_rng()
    m = 11
    d = m * dsub
    x = clustered(rng, 1500, d)
    q = clustered(rng, 30, d) * 3.7
    index = IVFPQIndex(d, nlist=1, m=m, nbits=4, store="fp16")
    index.set_trained(np.zeros((1, d), np.float32), (rng.normal(size=(m, 16, dsub)) * 1.3).astype(np.float32))
    index.add(x)
    twin = numpy_twin(index.save(tmp_path / "t.fdpr"))
    for level in LEVELS:  # every level's tables are the scalar ones (csrc/ivfpq.cpp lut4, csrc/pq4.cpp)
        with capped(_C, level):
            for k in (1, 50, 1600):
                want = index.search(q, k, nprobe=1, rerank=0)
                got = twin.search(q, k, nprobe=1, rerank=0)
                np.testing.assert_array_equal(got[0], want[0], err_msg=level)
                np.testing.assert_array_equal(got[1], want[1], err_msg=level)
    skip_unrun(SIMD_LEVELS, LEVELS)


def test_equal_scores_come_back_in_id_order_as_compiled(tmp_path):
    """Exact copies of a vector share a list, codes and rows, hence every score: the ones kept at each cut are
    those with the smallest ids in both backends."""
    rng = np.random.default_rng(21)
    distinct = clustered(rng, 250, 24)
    x = distinct[rng.permutation(np.repeat(np.arange(len(distinct)), 6))]
    index = build_index(x, "ivfpq,nbits=4,nlist=8,m=12,store=fp16,sq=4,niter=4,pq_niter=4")
    twin = numpy_twin(index.save(tmp_path / "dup.fdpr"))
    q = clustered(rng, 20, 24)
    for params in (dict(k=5, rerank=0), dict(k=9, rerank=40, exact=0), dict(k=9, rerank=40, exact=13),
                   dict(k=40, rerank=100, exact=50)):
        want = index.search(q, nprobe=8, **params)
        got = twin.search(q, nprobe=8, **params)
        np.testing.assert_array_equal(got[1], want[1], err_msg=str(params))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# files


FILE_SPECS = ["ivfpq,nbits=4,nlist=8,m=12,store=fp16,aniso=0.2,aniso_niter=2,sq=4,spread=0.5,exact=7",
              "ivfpq,nbits=4,nlist=16,m=9,sq=4", "ivfpq,nbits=4,nlist=8,m=6,store=fp32",
              "ivfpq,nbits=8,nlist=8,m=12,store=fp16,sq=4"]


@pytest.mark.parametrize("spec", FILE_SPECS)
@pytest.mark.parametrize("mmap", [False, True])
def test_compiled_file_numpy_read_numpy_write_compiled_read_is_identical(tmp_path, pool, spec, mmap):
    x, q = pool[0][:600, :36].copy(), pool[1][:, :36].copy()
    index = build_index(x, spec + ",niter=3,pq_niter=3", ids=np.arange(len(x)) * 3 + 11)
    first = index.save(tmp_path / "compiled.fdpr")
    twin = numpy_twin(first, mmap=mmap)
    assert twin._impl.vectors_mapped == (mmap and (index.store != "none" or index.sq == 4))
    second = twin.save(tmp_path / "numpy.fdpr")
    assert second.read_bytes() == first.read_bytes()
    back = load_index(second, mmap=mmap)
    assert back.compiled
    for a, b in zip(back._impl.sq_ranges() or (), index._impl.sq_ranges() or ()):
        np.testing.assert_array_equal(a, b)
    for rerank in (0, 30):
        for a, b in zip(back.search(q, 10, nprobe=3, rerank=rerank), index.search(q, 10, nprobe=3, rerank=rerank)):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(twin.codes()[1], index.codes()[1])
    np.testing.assert_array_equal(twin.codes()[0], index.codes()[0])


@pytest.mark.parametrize("spec", FILE_SPECS[:2])
def test_a_compiled_index_through_the_python_writer_writes_the_same_file(tmp_path, pool, spec):
    x = pool[0][:400, :36].copy()
    index = build_index(x, spec + ",niter=3,pq_niter=3")
    first = index.save(tmp_path / "compiled.fdpr")
    writer = fileformat.PyWriter(tmp_path / "py.fdpr", "ivfpq")
    index._write(writer)  # no raw compiled writer: the state goes through a numpy copy
    writer.commit()
    assert (tmp_path / "py.fdpr").read_bytes() == first.read_bytes()


def test_an_index_with_4bit_rows_but_no_rows_yet_round_trips(tmp_path, pool):
    x = pool[0][:400, :36].copy()
    src = build_index(x, "ivfpq,nbits=4,nlist=4,m=12,niter=2,pq_niter=2")
    empty = IVFPQIndex(36, nlist=4, m=12, nbits=4, sq=4, store="fp16")
    empty.set_trained(src._impl.centroids(), src._impl.codebooks())  # the row ranges come with the first add
    first = empty.save(tmp_path / "e.fdpr")
    twin = numpy_twin(first)
    assert twin.sq == 4 and twin._impl.sq_ranges() is None and len(twin) == 0
    assert twin.save(tmp_path / "n.fdpr").read_bytes() == first.read_bytes()
    writer = fileformat.PyWriter(tmp_path / "py.fdpr", "ivfpq")
    empty._write(writer)  # the compiled state through a numpy copy
    writer.commit()
    assert (tmp_path / "py.fdpr").read_bytes() == first.read_bytes()


def test_numpy_refuses_to_build_4bit_codes_and_rows_but_says_why(tmp_path, pool):
    x = pool[0][:400, :36].copy()
    for spec in ("ivfpq,nbits=4,nlist=4,m=12,store=fp16,niter=2,pq_niter=2",
                 "ivfpq,nbits=8,nlist=4,m=12,sq=4,niter=2,pq_niter=2"):
        twin = numpy_twin(build_index(x, spec).save(tmp_path / "b.fdpr"))
        with pytest.raises(MissingDependency, match="reads, searches and writes"):
            twin.add(x[:5])
        with pytest.raises(MissingDependency, match="compiled extension"):
            twin._impl.train(x)
        assert len(twin) == len(x)  # nothing half-added
    with pytest.raises(MissingDependency, match="nbits=4"):
        build_index(x, "ivfpq,nbits=4,nlist=4,m=12,backend=numpy")


@pytest.mark.parametrize("change,message", [
    (("codes", lambda b: b[:-16]), "wrong length"),
    (("sq_rows", lambda b: b[:-1]), "wrong length"),
    (("sq_step", lambda b: np.frombuffer(np.full(36, -1, np.float32).tobytes(), np.uint8)), "finite"),
    (("meta", None), "aniso_eta"),
])
def test_the_numpy_reader_refuses_bad_4bit_sections(tmp_path, pool, change, message):
    x = pool[0][:400, :36].copy()
    good = build_index(x, "ivfpq,nbits=4,nlist=4,m=12,sq=4,store=fp16,niter=2,pq_niter=2").save(tmp_path / "g.fdpr")
    r = fileformat.PyReader(good)
    w = fileformat.PyWriter(tmp_path / "bad.fdpr", r.type)
    name, fn = change
    for section in r.names():
        if section != "meta":
            data = np.array(r.section(section))
            w.add(section, fn(data) if section == name and fn else data)
    for key, value in r._meta.items():
        w.meta(key, "-1.5" if key == "aniso_eta" and name == "meta" else value)
    w.commit()
    force_fallback(True)
    try:
        with pytest.raises(InputError, match=message):
            load_index(tmp_path / "bad.fdpr")
    finally:
        force_fallback(False)
