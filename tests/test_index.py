"""The Index protocol, spec strings, exact Flat search (compiled and numpy), files, bad input, concurrency."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index, make_index, parse_spec
from fastdpr.index._native import force_fallback, native
from fastdpr.index.flat import FlatIndex, numpy_exact_search
from fastdpr.index.synthetic import gaussian_mixture

needs_native = pytest.mark.skipif(native() is None, reason="compiled extension not built")


@pytest.fixture
def fallback():
    force_fallback(True)
    yield
    force_fallback(False)


def brute(x: np.ndarray, q: np.ndarray, k: int):
    s = q.astype(np.float64) @ x.astype(np.float64).T
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[0]), s.shape), -s), axis=-1)[:, :k]
    return np.take_along_axis(s, order, 1), order


def assert_same_topk(scores, ids, ref_scores, ref_ids, atol=1e-4):
    """Equal up to float rounding: scores close, ids equal except where neighbouring scores tie within rounding."""
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=atol)
    k = ids.shape[1]
    for row in range(ids.shape[0]):
        if not np.array_equal(ids[row], ref_ids[row]):
            diff = np.flatnonzero(ids[row] != ref_ids[row])
            # a swap must be between near-equal scores, and the last kept score must agree
            assert np.all(np.abs(scores[row, diff] - ref_scores[row, diff]) <= atol + 1e-4 * np.abs(ref_scores[row, diff]))
            assert set(ids[row, : max(0, diff[0])]) == set(ref_ids[row, : max(0, diff[0])])
            assert diff[-1] < k


# ---------------------------------------------------------------------------------------------------------------
# spec strings


def test_parse_spec_forms():
    assert parse_spec("flat") == ("flat", {})
    assert parse_spec("flat,fp16") == ("flat", {"fp16": True})
    assert parse_spec("hnsw,M=32,efc=200,ef=128,fp16,mips=l2") == (
        "hnsw", {"M": 32, "efc": 200, "ef": 128, "fp16": True, "mips": "l2"})
    assert parse_spec("ivfpq,nlist=1024,m=48,nbits=8,rerank=200")[1]["nlist"] == 1024
    assert parse_spec("faiss:IVF256,PQ16x8") == ("faiss", {"factory": "IVF256,PQ16x8"})
    assert parse_spec(" auto ") == ("auto", {})
    assert parse_spec("hnsw,phi=2.5")[1]["phi"] == 2.5


@pytest.mark.parametrize("bad", ["", "nonsense", "flat,", "hnsw,M=", "faiss:", "hnsw,=3"])
def test_parse_spec_rejects(bad):
    with pytest.raises(InputError):
        parse_spec(bad)


def test_unknown_parameter_is_named():
    with pytest.raises(InputError, match="efSearch"):
        make_index("hnsw,efSearch=10", 8)
    with pytest.raises(InputError, match="integer"):
        make_index("hnsw,M=abc", 8)


def test_auto_picks_flat_for_small_and_ivfpq_above():
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    assert build_index(x, "auto").kind == "flat"
    # never HNSW: IVF-PQ above the size where exact search wins (fastdpr/index/auto.py; its own tests there)
    assert make_index("auto", 16, n_hint=10**6).kind == "ivfpq"


# ---------------------------------------------------------------------------------------------------------------
# exact search: compiled vs float64 brute force vs numpy fallback


@needs_native
@pytest.mark.parametrize("n,d,nq,k", [(1, 3, 1, 1), (997, 37, 5, 10), (1500, 64, 70, 50), (300, 129, 33, 300),
                                     (600, 70, 250, 20)])
def test_flat_matches_brute_force(n, d, nq, k):
    rng = np.random.default_rng(n + d)
    x = (rng.standard_normal((n, d)) * rng.lognormal(0, 0.5, (n, 1))).astype(np.float32)
    q = rng.standard_normal((nq, d)).astype(np.float32)
    scores, ids = build_index(x, "flat").search(q, k)
    kk = min(k, n)
    ref_s, ref_i = brute(x, q, kk)
    assert_same_topk(scores[:, :kk], ids[:, :kk], ref_s, ref_i)
    assert (ids[:, kk:] == -1).all() and np.isneginf(scores[:, kk:]).all()


@needs_native
def test_flat_thread_counts_give_identical_results():
    x, q = gaussian_mixture(3000, 48, n_queries=9, seed=3)
    index = build_index(x, "flat")
    s1, i1 = index.search(q, 20, threads=1)
    for t in (2, 3, 8):
        s, i = index.search(q, 20, threads=t)
        np.testing.assert_array_equal(i, i1)
        np.testing.assert_array_equal(s, s1)
    # more queries than one block, odd count
    q2 = np.random.default_rng(1).standard_normal((45, 48)).astype(np.float32)
    a = index.search(q2, 7, threads=1)
    b = index.search(q2, 7, threads=4)
    np.testing.assert_array_equal(a[1], b[1])
    # several query blocks of 384 (the GEMM path), each also split over the vectors when threads > 1
    q3 = np.random.default_rng(2).standard_normal((800, 48)).astype(np.float32)
    a = index.search(q3, 11, threads=1)
    for t in (2, 3):
        b = index.search(q3, 11, threads=t)
        np.testing.assert_array_equal(b[1], a[1])
        np.testing.assert_array_equal(b[0], a[0])


@needs_native
@pytest.mark.parametrize("fp16", [False, True])
def test_flat_numpy_fallback_equals_compiled(fp16, fallback):
    x, q = gaussian_mixture(2000, 40, n_queries=25, seed=5)
    spec = "flat,fp16" if fp16 else "flat"
    ref_s, ref_i = build_index(x, spec).search(q, 30)  # fallback (fixture)
    force_fallback(False)
    s, i = build_index(x, spec).search(q, 30)
    assert build_index(x[:10], spec).native
    assert_same_topk(s, i, ref_s, ref_i)


def test_fp16_storage_scores_are_inner_products_with_halves():
    x, q = gaussian_mixture(500, 33, n_queries=4, seed=9)
    scores, ids = build_index(x, "flat,fp16").search(q, 5)
    halves = x.astype(np.float16).astype(np.float64)
    ref = np.take_along_axis(q.astype(np.float64) @ halves.T, ids, 1)
    np.testing.assert_allclose(scores, ref, rtol=1e-5, atol=1e-5)


def test_numpy_exact_search_direct():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40000, 8)).astype(np.float32)  # spans several numpy blocks
    q = rng.standard_normal((3, 8)).astype(np.float32)
    s, i = numpy_exact_search(x, q, 12)
    ref_s, ref_i = brute(x, q, 12)
    assert_same_topk(s, i, ref_s, ref_i)


# ---------------------------------------------------------------------------------------------------------------
# ids, padding, bad input


def test_custom_ids_and_padding():
    x = np.eye(4, dtype=np.float32) * np.arange(1, 5, dtype=np.float32)[:, None]
    index = build_index(x, "flat", ids=[10, 20, 30, 40])
    s, i = index.search(np.ones((1, 4), np.float32), k=6)
    assert i.tolist() == [[40, 30, 20, 10, -1, -1]]
    assert s[0, :4].tolist() == [4, 3, 2, 1] and np.isneginf(s[0, 4:]).all()
    index.add(np.full((1, 4), 9, np.float32), ids=[7])
    assert index.search(np.ones(4, np.float32), 1)[1].tolist() == [[7]]
    with pytest.raises(InputError, match="already present"):
        index.add(np.ones((1, 4), np.float32), ids=[10])
    with pytest.raises(InputError, match="unique"):
        index.add(np.ones((2, 4), np.float32), ids=[1, 1])
    with pytest.raises(InputError, match=">= 0"):
        index.add(np.ones((1, 4), np.float32), ids=[-3])


@pytest.mark.parametrize("spec", ["flat", "flat,fp16", "hnsw,M=8,efc=20"])
def test_bad_input_errors(spec):
    x = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)
    index = build_index(x, spec)
    with pytest.raises(InputError, match="dimension"):
        index.search(np.ones((2, 7), np.float32), 3)
    with pytest.raises(InputError, match="NaN"):
        index.search(np.array([[np.nan] * 6], np.float32), 3)
    with pytest.raises(InputError, match="k must"):
        index.search(x[:1], 0)
    with pytest.raises(InputError, match="k must"):
        index.search(x[:1], 2.5)
    bad = x[:3].copy()
    bad[2, 1] = np.inf
    with pytest.raises(InputError, match="row 2"):
        index.add(bad)
    assert len(index) == 50  # nothing added by the failed call
    with pytest.raises(InputError, match="floating"):
        index.add(np.array([["a"] * 6]))
    with pytest.raises(InputError, match="unknown parameter"):
        index.search(x[:1], 3, nprobe=3)
    empty = make_index(spec, 6)
    with pytest.raises(InputError, match="empty"):
        empty.search(x[:1], 1)
    with pytest.raises(InputError):
        build_index(np.zeros((0, 6), np.float32), spec)


@pytest.mark.parametrize("spec", ["flat,fp16", "hnsw,M=4,fp16"])
def test_fp16_storage_rejects_out_of_range(spec):
    x = np.ones((5, 3), np.float32)
    x[3, 1] = 1e5
    index = make_index(spec, 3)
    with pytest.raises(InputError, match="row 3.*fp16"):
        index.add(x)
    assert len(index) == 0


def test_fp16_and_fp64_inputs_are_accepted():
    x = np.random.default_rng(0).standard_normal((100, 12))
    q = x[:3].astype(np.float32)
    a = build_index(x, "flat").search(x[:3], 4)
    b = build_index(x.astype(np.float16), "flat").search(q, 4)
    ref = brute(x.astype(np.float32), q, 4)[1]
    np.testing.assert_array_equal(a[1], ref)
    assert b[1][:, 0].tolist() == ref[:, 0].tolist()


# ---------------------------------------------------------------------------------------------------------------
# files


@pytest.mark.parametrize("spec", ["flat", "flat,fp16"])
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(tmp_path, spec, mmap):
    x, q = gaussian_mixture(700, 24, n_queries=6, seed=1)
    index = build_index(x, spec, ids=np.arange(700) * 3 + 1)
    path = index.save(tmp_path / "a.fdpr")
    again = load_index(path, mmap=mmap)
    assert again.kind == "flat" and len(again) == 700 and again.dim == 24
    for a, b in zip(index.search(q, 9), again.search(q, 9)):
        np.testing.assert_array_equal(a, b)
    again.add(x[:5], ids=[5000, 5001, 5002, 5003, 5004])  # a mapped index copies on write
    assert len(again) == 705
    # a directory path holds index.fdpr
    d = tmp_path / "dir"
    d.mkdir()
    index.save(d)
    assert len(load_index(d)) == 700


@needs_native
def test_python_and_compiled_file_formats_agree(tmp_path, fallback):
    from fastdpr.index import fileformat

    x, q = gaussian_mixture(300, 16, n_queries=3, seed=2)
    py_index = build_index(x, "flat,fp16")  # numpy fallback writes with the Python writer
    path = py_index.save(tmp_path / "py.fdpr")
    force_fallback(False)
    native_index = load_index(path)
    assert native_index.native
    np.testing.assert_array_equal(native_index.search(q, 5)[1], py_index.search(q, 5)[1])
    path2 = native_index.save(tmp_path / "c.fdpr")
    r = fileformat.PyReader(path2)
    assert r.type == "flat" and r.meta_int("count") == 300
    assert fileformat.peek_type(path2) == "flat"


def test_missing_file_is_named(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_index(tmp_path / "nope.fdpr")


def _flip_and_truncate_cases(data: bytes, rng: np.random.Generator, n: int):
    for _ in range(n):
        buf = bytearray(data)
        for _ in range(rng.integers(1, 4)):
            pos = int(rng.integers(0, len(buf)))
            buf[pos] ^= int(rng.integers(1, 256))
        yield bytes(buf)
    for cut in sorted({0, 1, 8, 63, 64, 100, len(data) // 2, len(data) - 49, len(data) - 1}
                      | {int(c) for c in rng.integers(0, len(data), 10)}):
        yield data[:cut]
    yield data + b"\0" * 64


# the numpy fallback has no graph to write, so hnsw files are only written by the compiled path
@pytest.mark.parametrize("spec,compiled", [("flat", True), ("flat,fp16", True), ("hnsw,M=6,efc=20", True),
                                           ("flat", False), ("flat,fp16", False)])
def test_corrupted_files_raise_clear_errors(tmp_path, spec, compiled):
    """Random byte flips and truncations: always a ValueError naming the file, never a crash or a silent load."""
    from fastdpr.index import fileformat

    if compiled and native() is None:
        pytest.skip("compiled extension not built")
    if not compiled:
        force_fallback(True)
    try:
        x = np.random.default_rng(0).standard_normal((60, 5)).astype(np.float32)
        path = build_index(x, spec, ids=np.arange(60) + 100).save(tmp_path / "good.fdpr")
        data = path.read_bytes()
        rng = np.random.default_rng(hash(spec) % 1000)
        bad = tmp_path / "bad.fdpr"
        for case in _flip_and_truncate_cases(data, rng, 40):
            if case == data:
                continue
            bad.write_bytes(case)
            with pytest.raises(ValueError, match="bad.fdpr"):
                load_index(bad)
            # the pure-Python reader must reject the same files
            with pytest.raises(ValueError):
                fileformat.PyReader(bad)
    finally:
        force_fallback(False)


# ---------------------------------------------------------------------------------------------------------------
# concurrency


@pytest.mark.parametrize("spec", ["flat", "flat,fp16", "hnsw,M=12,efc=60"])
def test_concurrent_searches_equal_serial(spec):
    x, q = gaussian_mixture(3000, 32, n_queries=64, seed=4)
    index = build_index(x, spec)
    serial = [index.search(q[i::8], 15) for i in range(8)]
    results: dict[int, tuple] = {}
    errors = []

    def worker(i):
        try:
            for _ in range(3):
                results[i] = index.search(q[i::8], 15)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        np.testing.assert_array_equal(results[i][1], serial[i][1])
        np.testing.assert_array_equal(results[i][0], serial[i][0])


@needs_native
@pytest.mark.parametrize("spec", ["flat", "hnsw,M=8,efc=30"])
def test_search_while_adding_is_safe(spec):
    x, q = gaussian_mixture(4000, 16, n_queries=20, seed=8)
    index = build_index(x[:1000], spec)
    stop = threading.Event()
    errors = []

    def searcher():
        try:
            while not stop.is_set():
                s, i = index.search(q, 10)
                assert (i >= 0).all() and (i < 4000).all()
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    for start in range(1000, 4000, 500):
        index.add(x[start:start + 500])
    stop.set()
    for t in threads:
        t.join()
    assert not errors and len(index) == 4000
