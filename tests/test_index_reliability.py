"""Index files and the compiled core under hostile input: special files, values at the edges of float32 (in files
with valid checksums, in training sets and in queries), conflicting spec strings, and the first add after an
installed training. Calls that crashed or hung before run in a subprocess (test_index_hardening.run_isolated)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from test_index_hardening import C, needs_native, run_isolated, use_native  # noqa: F401  (use_native: a fixture)

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index, make_index, parse_spec
from fastdpr.index._native import force_fallback


# ---------------------------------------------------------------------------------------------------------------
# special files


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO for reading waits for a writer: every loader refuses it instead."""
    fifo = tmp_path / "index.fdpr"
    os.mkfifo(fifo)
    out = run_isolated(f"""
        from fastdpr.index import load_index, fileformat
        from fastdpr.index._native import force_fallback
        path = {str(fifo)!r}
        seen = []
        for native in (True, False):
            force_fallback(not native)
            for call in (lambda: load_index(path), lambda: fileformat.open_reader(path),
                         lambda: fileformat.peek_type(path)):
                try:
                    call()
                except ValueError as exc:
                    seen.append("regular file" in str(exc))
        for call in (lambda: C.FileReader(path), lambda: C.peek_type(path)):
            try:
                call()
            except ValueError as exc:
                seen.append("regular file" in str(exc))
        print(seen)
    """, timeout=60)
    assert out.strip() == str([True] * 8)


# ---------------------------------------------------------------------------------------------------------------
# spec strings


@pytest.mark.parametrize("spec,key", [("ivfpq,m=8,m=4", "'m' twice"), ("ivfpq,nbits=4,nbits=8", "'nbits' twice"),
                                      ("hnsw,fp16,fp16", "'fp16' twice"), ("flat,fp16=1,fp16", "'fp16' twice")])
def test_a_key_given_twice_is_refused_by_name(spec, key):
    with pytest.raises(InputError, match=key):
        parse_spec(spec)


@pytest.mark.parametrize("spec,words", [
    ("flat,fp16,fp32", "fp16 and fp32 conflict"),
    ("hnsw,fp32,fp16", "fp16 and fp32 conflict"),
    ("ivfpq,fp16,fp32", "fp16 and fp32 conflict"),
    ("ivfpq,store=fp16,fp32", "store=fp16 and fp32 conflict"),
    ("ivfpq,store=none,fp16", "store=none and fp16 conflict"),
    ("hnsw,mips=l2,graph=ip", "mips=l2 and graph=ip conflict"),
    ("hnsw,graph=cos,mips=l2", "mips=l2 and graph=cos conflict"),
    ("ivfpq,aniso=0.2", "aniso applies to 4-bit codes only"),
    ("ivfpq,nbits=8,aniso=0.2", "aniso applies to 4-bit codes only"),
    ("ivfpq,spread=1e300", r"spread must be a number in \[0, 1e\+06\]"),
    ("ivfpq,spread=inf", "spread must be"),
])
def test_conflicting_settings_are_refused_naming_them(spec, words):
    with pytest.raises(InputError, match=words):
        make_index(spec, 16)


def test_consistent_spellings_still_build():
    assert make_index("hnsw,mips=l2,graph=l2", 16).graph == "l2"
    assert make_index("ivfpq,fp16", 16).store == "fp16"
    assert make_index("ivfpq,store=fp32", 16).store == "fp32"
    assert make_index("flat,fp32", 16).fp16 is False
    if C is not None:
        assert make_index("ivfpq,nbits=4,aniso=0.2", 16).aniso == 0.2


# ---------------------------------------------------------------------------------------------------------------
# extreme finite values in training sets and queries


def _clustered(n=2000, d=16, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((20, d)).astype(np.float32) * 2
    return (centers[rng.integers(0, 20, n)] + rng.standard_normal((n, d))).astype(np.float32)


def _recall(ids, truth):
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(ids, truth)]))


@needs_native
def test_kmeans_pq_and_anisotropic_training_survive_extreme_finite_values():
    """The sweep of every training path over magnitudes float32 can hold (1e-30 .. 3e38, and rows of all of them
    mixed): no signal, finite centroids and codebooks. 1e19 was a SIGSEGV: float32 distances overflowed to inf, and
    the k-means++ seeding then picked no candidate and read before its array."""
    out = run_isolated("""
        from fastdpr.index import build_index
        rng = np.random.default_rng(0)
        base = rng.standard_normal((1200, 16)).astype(np.float32)
        mixed = base * np.float32(10.0) ** rng.choice([-30, -20, 0, 19, 37], size=(1200, 1)).astype(np.float32)
        sets = {s: (base * np.float32(s)).astype(np.float32) for s in (1e-30, 1e-20, 1e19, 1e37)}
        sets["mixed"] = mixed.astype(np.float32)
        sets["max"] = np.where(base > 0, np.float32(3e38), np.float32(-3e38)).astype(np.float32)
        done = 0
        for name, x in sets.items():
            assert np.isfinite(x).all(), name
            for balance in (0.0, 0.5):
                for spherical in (False, True):
                    c, info = C.kmeans(x, 16, niter=4, spherical=spherical, balance=balance)
                    assert np.isfinite(c).all(), (name, balance, spherical)
                    done += 1
            for spec in ("ivfpq,nlist=8,m=4,niter=3,pq_niter=3",
                         "ivfpq,nlist=8,nbits=4,aniso=0.2,aniso_niter=2,niter=3,pq_niter=3,store=fp32,sq=4"):
                try:
                    index = build_index(x, spec)
                except ValueError as exc:  # residuals of +-3e38 rows leave float32: refused, by name
                    assert name == "max" and "beyond 2^126" in str(exc), (name, str(exc))
                    done += 1
                    continue
                assert np.isfinite(index._impl.centroids()).all() and np.isfinite(index._impl.codebooks()).all()
                index.search(x[:5], 3)
                done += 1
            try:
                C.IVFPQ(16, 8, 4, 8, "none").train(x, niter=2, pq_niter=2)
            except ValueError as exc:
                assert name == "max" and "beyond 2^126" in str(exc), (name, str(exc))
            done += 1
        print(done)
    """)
    assert out.strip() == str(6 * (4 + 2 + 1))


@needs_native
@pytest.mark.parametrize("scale", [2.0 ** -100, 2.0 ** -66, 2.0 ** 63, 2.0 ** 122])
def test_kmeans_is_scale_invariant(scale):
    """Scaled by a power of two, the same centroids scaled (1e-30 vanished below float32's normal range: every point
    looked alike)."""
    x = _clustered()
    for spherical in (False, True):
        c, info = C.kmeans(x, 20, niter=6, spherical=spherical, balance=0.5)
        cs, info_s = C.kmeans((x * np.float32(scale)).astype(np.float32), 20, niter=6, spherical=spherical,
                              balance=0.5)
        want = c if spherical else c * np.float32(scale)
        np.testing.assert_allclose(cs, want, rtol=1e-5, atol=0 if not spherical else 1e-6)


@needs_native
@pytest.mark.parametrize("spec", ["ivfpq,nlist=16,m=8", "ivfpq,nlist=16,nbits=4", "ivfpq,nlist=16,nbits=4,sq=4",
                                  "ivfpq,nlist=16,nbits=4,store=fp32,spread=0.5"])
def test_ivfpq_answers_the_same_at_any_scale(spec):
    """Data scaled by ~1e-20 trained to near-random codes (recall .02-.07); queries of ~1e38 overflowed every
    4-bit table (every id -1). The same ids now, the scores scaled by the same factor."""
    x = _clustered(3000)
    q = x[:50] + np.float32(0.1)
    ref = build_index(x, spec)
    s_ref, i_ref = ref.search(q, 10, nprobe=16)
    tiny = build_index((x * np.float32(2.0 ** -70)).astype(np.float32), spec)
    s_tiny, i_tiny = tiny.search(q, 10, nprobe=16)
    np.testing.assert_array_equal(i_tiny, i_ref)
    big_q = (q * np.float32(2.0 ** 124)).astype(np.float32)  # components up to ~2e38: scores beyond float32
    _, i_big = ref.search(big_q, 10, nprobe=16)
    np.testing.assert_array_equal(i_big, i_ref)
    s_mid, i_mid = ref.search((q * np.float32(2.0 ** 40)).astype(np.float32), 10, nprobe=16)
    np.testing.assert_array_equal(i_mid, i_ref)
    np.testing.assert_allclose(s_mid, s_ref * np.float32(2.0 ** 40), rtol=1e-6)


def test_the_numpy_backend_answers_the_same_at_any_scale():
    force_fallback(True)
    try:
        x = _clustered(3000)
        q = x[:50] + np.float32(0.1)
        spec = "ivfpq,nlist=16,m=8,niter=5,pq_niter=5"
        _, i_ref = build_index(x, spec).search(q, 10, nprobe=16)
        for scale in (2.0 ** -70, 2.0 ** 63):
            index = build_index((x * np.float32(scale)).astype(np.float32), spec)
            assert not index.compiled
            np.testing.assert_array_equal(index.search(q, 10, nprobe=16)[1], i_ref)
        _, i_big = build_index(x, spec).search((q * np.float32(2.0 ** 124)).astype(np.float32), 10, nprobe=16)
        np.testing.assert_array_equal(i_big, i_ref)
    finally:
        force_fallback(False)


@needs_native
def test_compiled_training_refuses_nan_and_inf_at_the_boundary():
    """NaN in a training set made the k-means++ potential NaN, no candidate was chosen, and the seeding read before
    its array (a heap overflow under ASan)."""
    out = run_isolated("""
        x = np.random.default_rng(0).standard_normal((600, 8)).astype(np.float32)
        seen = []
        for bad in (np.nan, np.inf, -np.inf):
            y = x.copy(); y[123, 5] = bad
            for call in (lambda: C.kmeans(y, 8, niter=2),
                         lambda: C.kmeans(y, 8, niter=2, kmeanspp=False),
                         lambda: C.IVFPQ(8, 4, 2, 8, "none").train(y, niter=2, pq_niter=2),
                         lambda: C.IVFPQ(8, 4, 4, 4, "none").train(y, niter=2, pq_niter=2)):
                try:
                    call()
                except ValueError as exc:
                    seen.append("point 123" in str(exc) or "row 123" in str(exc))
        print(seen)
    """)
    assert out.strip() == str([True] * 12)


# ---------------------------------------------------------------------------------------------------------------
# the first add after set_trained (4-bit rows)


@needs_native
def test_a_one_row_first_add_does_not_collapse_the_4bit_rows():
    """The rows' ranges came from the first add alone: one row made every step 0 and every row look like it."""
    x = _clustered(3000)
    q = x[:100] + np.float32(0.1)
    truth = build_index(x, "flat").search(q, 10)[1]
    spec = "ivfpq,nlist=16,nbits=4,sq=4"
    ref = build_index(x, spec)
    whole = _recall(ref.search(q, 10, nprobe=16, rerank=200)[1], truth)
    index = make_index(spec, x.shape[1])
    index.set_trained(ref._impl.centroids(), ref._impl.codebooks())
    index.add(x[:1])
    index.add(x[1:])
    assert index._impl.sq_ranges()[1].min() > 0
    assert _recall(index.search(q, 10, nprobe=16, rerank=200)[1], truth) >= whole - 0.03


# ---------------------------------------------------------------------------------------------------------------
# non-finite values inside files with valid checksums


def _poison(path, section, dtype, value, at=3):
    """Rewrite ``section`` of the file with ``value`` at element ``at``, checksums made valid again."""
    from test_fuzz_index import _parts, _write

    kind, meta, sections = _parts(path)
    data = np.frombuffer(sections[section], dtype).copy()
    data[at] = value
    sections[section] = data.tobytes()
    _write(path, kind, meta, sections)


@pytest.mark.parametrize("spec,section,dtype,value,words", [
    ("flat,fp16", "vectors", np.float16, np.nan, "'vectors' holds NaN or Inf"),
    ("flat", "vectors", np.float32, np.inf, "'vectors' holds NaN or Inf"),
    ("hnsw,M=8,efc=20,fp16", "vectors", np.float16, -np.inf, "'vectors' holds NaN or Inf"),
    ("ivfpq,nlist=4,m=4,store=fp16,niter=2,pq_niter=2", "vectors", np.float16, np.nan, "'vectors' holds NaN or Inf"),
    ("ivfpq,nlist=4,m=4,niter=2,pq_niter=2", "codebooks", np.float32, np.nan, "'codebooks' holds NaN or Inf"),
    ("ivfpq,nlist=4,m=4,niter=2,pq_niter=2", "centroids", np.float32, np.inf, "'centroids' holds NaN or Inf"),
    ("ivfpq,nlist=4,m=4,niter=2,pq_niter=2", "list_resid_sq", np.float64, 1e300, "too large for their spreads"),
])
def test_non_finite_values_in_a_file_are_refused_on_load(tmp_path, use_native, spec, section, dtype, value, words):
    x = np.random.default_rng(0).standard_normal((400, 16)).astype(np.float32)
    path = tmp_path / "index.fdpr"
    build_index(x, spec).save(path)
    _poison(path, section, dtype, value, at=0 if section == "list_resid_sq" else 3)
    for mmap in (False, True):
        with pytest.raises(InputError, match=words):
            load_index(path, mmap=mmap)


@needs_native
@pytest.mark.parametrize("section,dtype,value,words", [
    ("codebooks", np.float32, np.nan, "'codebooks' holds NaN or Inf"),
    ("vectors", np.float32, np.inf, "'vectors' holds NaN or Inf"),
    ("sq_step", np.float32, np.inf, "4-bit row ranges"),
    ("sq_step", np.float32, 3e38, "4-bit row ranges"),
])
def test_non_finite_values_in_a_4bit_file_are_refused_on_load(tmp_path, section, dtype, value, words):
    x = np.random.default_rng(0).standard_normal((400, 16)).astype(np.float32)
    path = tmp_path / "index.fdpr"
    build_index(x, "ivfpq,nlist=4,nbits=4,store=fp32,sq=4").save(path)
    _poison(path, section, dtype, value)
    with pytest.raises(InputError, match=words):
        load_index(path)


def test_the_sigbus_limit_of_mapped_files_stays_documented():
    """Truncating a memory-mapped index under a live process is a SIGBUS no check can prevent: said where users
    and maintainers look."""
    from pathlib import Path

    assert "SIGBUS" in load_index.__doc__
    assert "SIGBUS" in (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
