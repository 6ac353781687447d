"""Hostile and absurd input to the index core: thread counts, k far beyond the index, exceptions inside OpenMP loops,
sizes that would allocate before being checked, integers of every kind at the pybind boundary, and the same rules
in the Python layer and its numpy fallbacks.

Calls that crashed the process before (a segfault, std::terminate, the out-of-memory killer) run in a subprocess,
some under an address-space limit, so that a regression fails one test with its output instead of killing the run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index import build_index, fileformat, load_index, make_index
from fastdpr.index._native import MAX_THREADS, force_fallback, native

C = native()
needs_native = pytest.mark.skipif(C is None, reason="compiled extension not built")
# an address-space limit cannot work under AddressSanitizer (its shadow memory is terabytes of address space)
UNDER_SANITIZER = "asan" in os.environ.get("LD_PRELOAD", "")

_PRELUDE = """
import os, resource, sys
import numpy as np
if os.environ.get("FASTDPR_SANITIZED_EXTENSION"):
    import _asan_extension  # noqa: F401  (scripts/sanitize_index.sh: the sanitizer build as fastdpr._C)
import fastdpr._C as C

def limit_memory(extra_mb):
    # address space from now on: what the process maps already plus extra_mb
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra_mb * 2**20, resource.RLIM_INFINITY))
"""


def run_isolated(code: str, timeout: float = 300) -> str:
    """Run ``code`` in a fresh interpreter (with the prelude above); return its stdout, failing with its output
    when it does not exit cleanly (a crash shows up here as a signal)."""
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "2"})
    if proc.returncode != 0:
        pytest.fail(f"subprocess exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture
def fallback():
    force_fallback(True)
    yield
    force_fallback(False)


@pytest.fixture(params=[True, False], ids=["native", "fallback"])
def use_native(request):
    """Each test twice: on the compiled core (when built) and on the numpy fallbacks."""
    if request.param and C is None:
        pytest.skip("compiled extension not built")
    force_fallback(not request.param)
    yield request.param
    force_fallback(False)


# ---------------------------------------------------------------------------------------------------------------
# thread counts


@needs_native
def test_absurd_thread_counts_are_errors_not_crashes():
    """threads=100000 used to make OpenMP try to start that many threads (a segfault)."""
    out = run_isolated("""
        x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
        f = C.FlatIndex(8); f.add(x)
        h = C.HNSWIndex(8, M=4, ef_construction=20); h.add(x[:50])
        s = C.IVFPQ(8, 4, 2, 8, "none"); s.train(x, niter=2, pq_niter=2); s.add(x)
        calls = {
            "flat.search": lambda t: f.search(x[:3], 5, t),
            "hnsw.add": lambda t: h.add(x[50:60], t),
            "hnsw.search": lambda t: h.search(x[:3], 5, 0, t, 0),
            "ivfpq.search": lambda t: s.search(x[:3], 5, 4, 0, t),
            "parallel_check": lambda t: C.parallel_check(10, -1, t),
        }
        for name, call in calls.items():
            for t in (100000, 2**31, -1, np.int64(-5)):
                try:
                    call(t)
                except ValueError as exc:
                    assert "threads" in str(exc), (name, t, str(exc))
                else:
                    raise AssertionError(f"{name} accepted threads={t}")
            call(2)  # a sane count still works
            call(np.int32(1))
        print("ok", C.max_threads())
    """)
    assert out.split()[0] == "ok" and int(out.split()[1]) == MAX_THREADS


@pytest.mark.parametrize("spec", ["flat", "hnsw,M=8,efc=20", "ivfpq,nlist=4,m=4,fp16,niter=2,pq_niter=2"])
def test_thread_counts_checked_in_the_python_layer(spec, use_native):
    x = np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32)
    index = build_index(x, spec)
    for bad in (MAX_THREADS + 1, 10**9, -1):
        with pytest.raises(InputError, match="threads"):
            index.search(x[:2], 3, threads=bad)
    with pytest.raises(InputError, match="threads"):
        index.search(x[:2], 3, threads=2.0)
    assert index.search(x[:2], 3, threads=np.int64(MAX_THREADS))[1].shape == (2, 3)


# ---------------------------------------------------------------------------------------------------------------
# k far beyond the index


@needs_native
@pytest.mark.skipif(UNDER_SANITIZER, reason="address-space limits do not mix with AddressSanitizer")
def test_k_beyond_the_index_costs_only_its_output():
    """IVF-PQ sized its heaps by k and rerank: k = 5e6 over 300 vectors reserved 240 MB and, out of memory, died in
    an OpenMP region (std::terminate). Now the work is sized by the index and only the output is k wide."""
    out = run_isolated("""
        x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
        s = C.IVFPQ(8, 4, 2, 8, "fp32"); s.train(x, niter=2, pq_niter=2); s.add(x)
        h = C.HNSWIndex(8, M=4, ef_construction=20); h.add(x)
        f = C.FlatIndex(8); f.add(x)
        for index in (s, f, h):  # warm up: thread pools and first-touch allocations
            index.search(x[:1], 1)
        k = 5 * 10**6  # 60 MB of output
        limit_memory(200)
        for name, search in (("ivfpq", lambda: s.search(x[:1], k, 4, 2 * k, 1)),
                             ("flat", lambda: f.search(x[:1], k, 1)),
                             ("hnsw", lambda: h.search(x[:1], k, 0, 1, 0))):
            scores, ids = search()
            assert ids.shape == (1, k), name
            found = ids[0, :300]
            assert (found[:10] >= 0).all() and len(set(found[found >= 0].tolist())) == (found >= 0).sum(), name
            if name != "hnsw":  # a graph need not reach every node
                assert sorted(found.tolist()) == list(range(300)), name
            assert ids[0, -1] == -1 and np.isneginf(scores[0, -1]), name
            del scores, ids
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_native
@pytest.mark.skipif(UNDER_SANITIZER, reason="address-space limits do not mix with AddressSanitizer")
def test_absurd_k_is_refused_before_allocating():
    """k = 1e9 over 300 vectors: the result would be 12 GB of padding; refused with a clear error, not allocated."""
    out = run_isolated("""
        x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
        s = C.IVFPQ(8, 4, 2, 8, "none"); s.train(x, niter=2, pq_niter=2); s.add(x)
        f = C.FlatIndex(8); f.add(x)
        h = C.HNSWIndex(8, M=4, ef_construction=20); h.add(x)
        limit_memory(1024)
        for search in (lambda k: s.search(x[:2], k, 4, 0, 1), lambda k: f.search(x[:2], k, 1),
                       lambda k: h.search(x[:2], k, 0, 1, 0)):
            for k in (10**9, 2**62):
                try:
                    search(k)
                except ValueError as exc:
                    assert "k=" in str(exc) and ("larger than the index" in str(exc) or "fit" in str(exc)), str(exc)
                else:
                    raise AssertionError(k)
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.parametrize("spec", ["flat", "flat,fp16", "hnsw,M=8,efc=20", "ivfpq,nlist=4,m=4,fp16,niter=2,pq_niter=2"])
def test_k_beyond_the_index_pads_in_the_python_layer(spec, use_native):
    x = np.random.default_rng(2).standard_normal((300, 8)).astype(np.float32)
    index = build_index(x, spec, ids=np.arange(300) + 7)
    scores, ids = index.search(x[:3], 100_000)
    assert ids.shape == scores.shape == (3, 100_000)
    assert (ids[:, 300:] == -1).all() and np.isneginf(scores[:, 300:]).all()
    assert (ids[:, :10] >= 7).all()
    # the same first results as a k within the index
    np.testing.assert_array_equal(ids[:, :10], index.search(x[:3], 10)[1])


@pytest.mark.skipif(UNDER_SANITIZER, reason="address-space limits do not mix with AddressSanitizer")
def test_absurd_k_is_refused_in_the_python_layer(use_native):
    """k = 1e9 over 300 vectors asked every type for a 12 GB padded result."""
    out = run_isolated(f"""
        from fastdpr.errors import InputError
        from fastdpr.index import build_index
        from fastdpr.index._native import force_fallback
        force_fallback({not use_native})
        x = np.random.default_rng(2).standard_normal((300, 8)).astype(np.float32)
        indexes = [build_index(x, spec) for spec in ("flat", "hnsw,M=8,efc=20", "ivfpq,nlist=4,m=4,niter=2,pq_niter=2")]
        limit_memory(1024)
        for index in indexes:
            try:
                index.search(x[:3], 10**9)
            except InputError as exc:
                assert "larger than the index" in str(exc), str(exc)
            else:
                raise AssertionError(index)
        print("ok")
    """)
    assert out.strip() == "ok"


# ---------------------------------------------------------------------------------------------------------------
# exceptions inside OpenMP loops


@needs_native
def test_parallel_loops_rethrow_on_the_caller():
    assert C.parallel_check(1000, -1, 2) == 1000
    with pytest.raises(RuntimeError, match="task 37 failed"):
        C.parallel_check(1000, 37, 2)
    with pytest.raises(RuntimeError, match="task 0 failed"):
        C.parallel_check(5, 0, 1)


@needs_native
@pytest.mark.skipif(UNDER_SANITIZER, reason="address-space limits do not mix with AddressSanitizer")
def test_out_of_memory_inside_a_parallel_search_is_a_memory_error():
    """IVF-PQ allocates its per-thread tables inside the parallel loop (8 x nlist floats: 32 MB for 2^20 lists). Out
    of memory there used to escape the OpenMP region (std::terminate); now it is a MemoryError and the index still
    works once memory is back."""
    out = run_isolated("""
        nlist = 1 << 20
        rng = np.random.default_rng(0)
        s = C.IVFPQ(1, nlist, 1, 8, "none")
        s.set_trained(rng.standard_normal((nlist, 1)).astype(np.float32),
                      rng.standard_normal((1, 256, 1)).astype(np.float32))
        s.add(rng.standard_normal((100, 1)).astype(np.float32))
        q = np.ones((1, 1), np.float32)
        s.search(q, 5, 8, 0, 1)
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit_memory(16)
        try:
            s.search(q, 5, 8, 0, 1)
        except MemoryError:
            print("memory error")
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        print(s.search(q, 5, 8, 0, 1)[1].shape)
    """)
    assert out.split("\n")[:2] == ["memory error", "(1, 5)"]


# ---------------------------------------------------------------------------------------------------------------
# sizes checked before anything is allocated


def _ivfpq_file_claiming(path, nlist: int):
    """A file with valid checksums whose metadata claims `nlist` lists while its sections hold almost nothing."""
    w = fileformat.open_writer(path, "ivfpq", compiled=False)
    for key, value in (("dim", 4), ("nlist", nlist), ("m", 2), ("nbits", 8), ("storage", 0), ("assign_by_ip", 0),
                       ("trained", 0), ("ntotal", 0)):
        w.meta(key, value)
    w.add("list_offsets", np.zeros(2, np.int64))
    w.add("codes", np.zeros(0, np.uint8))
    w.add("list_pos", np.zeros(0, np.int64))
    w.commit()
    return path


@pytest.mark.skipif(UNDER_SANITIZER, reason="address-space limits do not mix with AddressSanitizer")
def test_file_metadata_cannot_make_the_loader_allocate(tmp_path, use_native):
    """nlist = 2^28 in the metadata of a tiny file: the loaders allocated 2^28 lists (GBs) before looking at the
    sections. Now the sections are checked first."""
    path = _ivfpq_file_claiming(tmp_path / "claims.fdpr", 1 << 28)
    out = run_isolated(f"""
        from fastdpr.errors import InputError
        from fastdpr.index import load_index
        from fastdpr.index._native import force_fallback
        force_fallback({not use_native})
        limit_memory(512)
        try:
            load_index({str(path)!r})
        except InputError as exc:
            print("refused:", exc)
    """)
    assert out.startswith("refused:") and "claims.fdpr" in out and "list_offsets" in out


@needs_native
def test_constructors_accept_what_the_loaders_accept(tmp_path):
    """An index built with parameters its own loader rejects could be saved but never loaded again."""
    with pytest.raises(ValueError, match="nlist"):
        C.IVFPQ(8, 2**40, 2, 8, "none")  # was a std::bad_alloc (MemoryError) after allocating
    with pytest.raises(ValueError, match="ef_search"):
        C.HNSWIndex(8, ef_search=2**31)
    with pytest.raises(ValueError, match="dim"):
        C.FlatIndex(2**21)
    with pytest.raises(InputError, match="ef"):
        make_index("hnsw,ef=2147483648", 8)
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    index = build_index(x, "hnsw,M=4,efc=20,ef=1073741824")  # the largest ef the loader takes
    again = load_index(index.save(tmp_path / "h.fdpr"))
    assert again.ef == 2**30


@needs_native
def test_kmeans_sizes_are_checked():
    x = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="max_points_per_centroid"):
        C.kmeans(x, 3, max_points_per_centroid=2**62)  # k x max_points overflowed
    c, info = C.kmeans(x, 3, niter=2, max_points_per_centroid=2**30)
    assert c.shape == (3, 4) and info["n_train"] == 300
    with pytest.raises(ValueError, match="at least k=400"):
        C.kmeans(x, np.int64(400))


# ---------------------------------------------------------------------------------------------------------------
# integers at the pybind boundary


@needs_native
def test_one_checked_integer_conversion_at_the_boundary():
    x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    f = C.FlatIndex(np.int64(8))
    f.add(x)
    for k in (np.int64(5), np.int32(5), np.uint8(5), 5):
        assert f.search(x[:2], k, np.int16(1))[1].shape == (2, 5)
    h = C.HNSWIndex(np.int32(8), M=np.uint16(4), ef_construction=np.int64(20), seed=np.uint64(3))
    h.add(x, np.int64(1))
    assert h.search(x[:1], np.int8(3), np.int64(16), 0, np.uint32(0))[1].shape == (1, 3)
    for bad, error, message in ((True, TypeError, "k must be an integer"), (2.0, TypeError, "k must be an integer"),
                                (np.float32(3), TypeError, "k must be an integer"), ("3", TypeError, "integer"),
                                (0, ValueError, "k must be >= 1"), (-3, ValueError, "k must be >= 1"),
                                (2**70, ValueError, "k must be in"), (np.uint64(2**64 - 1), ValueError, "k must be")):
        with pytest.raises(error, match=message):
            f.search(x[:1], bad)
    with pytest.raises(ValueError, match="dim must be in"):
        C.FlatIndex(-1)
    with pytest.raises(TypeError, match="dim must be an integer"):
        C.FlatIndex(np.bool_(True))
    with pytest.raises(ValueError, match="M must be in"):
        C.HNSWIndex(8, M=-4)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        C.HNSWIndex(8, seed=-1)
    s = C.IVFPQ(8, np.int64(4), np.int64(2), np.int64(8), "none")
    with pytest.raises(ValueError, match="nbits"):
        C.IVFPQ(8, 4, 2, 5, "none")
    with pytest.raises(IndexError):
        s.list_codes(np.int64(4))
    with pytest.raises(IndexError):
        s.list_codes(-1)
    assert s.list_codes(np.int64(3)).shape == (0, 2)


# ---------------------------------------------------------------------------------------------------------------
# the fallbacks: reached by FASTDPR_NO_NATIVE / force_fallback, and complete


def test_force_fallback_reaches_ivfpq_and_the_file_reader(tmp_path, fallback):
    x = np.random.default_rng(3).standard_normal((600, 16)).astype(np.float32)
    index = build_index(x, "ivfpq,nlist=8,m=4,fp16,niter=3,pq_niter=3")
    assert not index.compiled
    path = index.save(tmp_path / "i.fdpr")
    assert isinstance(fileformat.open_reader(path), fileformat.PyReader)
    assert isinstance(fileformat.open_writer(tmp_path / "w.fdpr", "flat"), fileformat.PyWriter)
    assert not load_index(path).compiled
    from fastdpr.errors import MissingDependency

    with pytest.raises(MissingDependency, match="disabled"):
        make_index("ivfpq,nlist=4,m=4,backend=compiled", 16)
    if C is not None:  # made while the core was on, trained after it was switched off: no silent numpy backend
        force_fallback(False)
        compiled = make_index("ivfpq,m=4,niter=2,pq_niter=2,backend=compiled", 16)
        force_fallback(True)
        with pytest.raises(MissingDependency, match="disabled"):
            compiled.train(x)


def test_no_native_environment_runs_every_index_type_end_to_end(tmp_path):
    """FASTDPR_NO_NATIVE=1: every type builds, searches, saves and loads on numpy alone (HNSW's fallback could not
    be saved), and a compiled process loads those files (building the HNSW graph from the saved vectors)."""
    script = f"""
        import numpy as np
        from fastdpr.index import build_index, load_index
        x = np.random.default_rng(4).standard_normal((800, 16)).astype(np.float32)
        for spec in ("flat", "flat,fp16", "hnsw,M=8,efc=40,fp16", "hnsw,M=8,mips=l2", "ivfpq,nlist=8,m=4,fp32"):
            index = build_index(x, spec, ids=np.arange(800) + 1000)
            assert getattr(index, "native", None) in (False, None) and not getattr(index, "compiled", False), spec
            path = index.save({str(tmp_path)!r} + "/" + spec.replace(",", "_") + ".fdpr")
            again = load_index(path)
            a, b = index.search(x[:5], 10), again.search(x[:5], 10)
            assert (a[1] == b[1]).all() and (a[0] == b[0]).all(), spec
        print("ok")
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env={**os.environ, "FASTDPR_NO_NATIVE": "1"}, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    if C is None:
        return
    x = np.random.default_rng(4).standard_normal((800, 16)).astype(np.float32)
    graph = load_index(tmp_path / "hnsw_M=8_efc=40_fp16.fdpr")
    assert graph.native and graph.M == 8 and graph.efc == 40 and graph.fp16 and len(graph) == 800
    exact = build_index(x, "flat,fp16", ids=np.arange(800) + 1000).search(x[:20], 10)[1]
    found = graph.search(x[:20], 10, ef=200)[1]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)]) >= 0.95
    l2 = load_index(tmp_path / "hnsw_M=8_mips=l2.fdpr")
    assert l2.native and l2.graph == "l2" and l2.phi == pytest.approx(float((x.astype(np.float64) ** 2).sum(1).max()))


def test_fp16_storage_range_is_checked_for_ivfpq_too():
    x = np.random.default_rng(5).standard_normal((300, 8)).astype(np.float32)
    index = build_index(x, "ivfpq,nlist=4,m=4,fp16,niter=2,pq_niter=2")
    bad = x[:4].copy()
    bad[2, 3] = 1e6  # inf in fp16: every re-ranked score it touches would be inf
    with pytest.raises(InputError, match="row 2.*fp16"):
        index.add(bad)
    assert len(index) == 300


def test_shape_check_message_names_what_is_accepted():
    index = make_index("flat", 3)
    index.add(np.arange(6, dtype=np.int64).reshape(2, 3))  # integers are numbers too
    with pytest.raises(InputError, match=r"real numbers \(floating point or integer\)"):
        index.add(np.array([["a", "b", "c"]]))
    with pytest.raises(InputError, match="real numbers"):
        index.add(np.ones((1, 3), dtype=bool))


def test_search_param_values_are_parsed_in_one_place():
    from fastdpr.commands.search import _search_params
    from fastdpr.index.spec import parse_spec, parse_value

    assert _search_params(["ef=256", "alpha=0.5", "rerank=auto"]) == {"ef": 256, "alpha": 0.5, "rerank": "auto"}
    assert parse_spec("ivfpq,rerank=auto,nprobe=8")[1] == {"rerank": "auto", "nprobe": 8}
    assert [parse_value(v) for v in ("3", "3.5", "x")] == [3, 3.5, "x"]


def test_kmeans_has_its_own_module():
    from fastdpr.index import ivfpq, kmeans

    assert ivfpq.kmeans is kmeans.kmeans  # the old import path still works
    x = np.random.default_rng(0).standard_normal((500, 4)).astype(np.float32)
    c = kmeans.kmeans(x, 8, niter=3)
    assert c.shape == (8, 4) and (kmeans.nearest(c, c, False) == np.arange(8)).all()
    for bad in (0, 2.5, True):
        with pytest.raises(InputError, match="k-means: k must be"):
            kmeans.kmeans(x, bad)


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
def test_ivfpq_rerank_is_a_named_setting(tmp_path, backend):
    if backend == "compiled" and C is None:
        pytest.skip("compiled extension not built")
    x = np.random.default_rng(6).standard_normal((600, 16)).astype(np.float32)
    index = build_index(x, f"ivfpq,nlist=8,m=4,fp32,niter=3,pq_niter=3,rerank=auto,backend={backend}")
    assert index.rerank == "auto"
    auto = index.search(x[:5], 10)
    np.testing.assert_array_equal(auto[1], index.search(x[:5], 10, rerank=40)[1])  # auto = 4 k
    np.testing.assert_array_equal(auto[1], index.search(x[:5], 10, rerank="auto")[1])
    # the old spellings keep their meaning: -1 = auto, and in search -2 / nprobe=0 = the index's setting
    np.testing.assert_array_equal(auto[1], index.search(x[:5], 10, rerank=-1)[1])
    np.testing.assert_array_equal(auto[1], index.search(x[:5], 10, rerank=-2, nprobe=0)[1])
    assert build_index(x, f"ivfpq,nlist=8,m=4,fp32,niter=3,pq_niter=3,rerank=-1,backend={backend}").rerank == "auto"
    for bad in ("sometimes", -3, 2.5):
        with pytest.raises(InputError, match="rerank"):
            index.search(x[:5], 10, rerank=bad)
    with pytest.raises(InputError, match="rerank"):
        make_index("ivfpq,nlist=8,m=4,rerank=often", 16)
    again = load_index(index.save(tmp_path / "r.fdpr"))
    assert again.rerank == "auto"
    np.testing.assert_array_equal(again.search(x[:5], 10)[1], auto[1])
    fixed = build_index(x, f"ivfpq,nlist=8,m=4,fp32,niter=3,pq_niter=3,rerank=25,backend={backend}")
    assert load_index(fixed.save(tmp_path / "f.fdpr")).rerank == 25


def test_hnsw_fallback_validates_like_the_graph(fallback):
    for spec in ("hnsw,M=5000", "hnsw,efc=0", "hnsw,entry=2000000", "hnsw,ef=2147483648", "hnsw,seed=-1"):
        with pytest.raises(InputError):
            make_index(spec, 8)


@pytest.mark.parametrize("spec", ["flat", "hnsw,M=8,efc=20", "ivfpq,nlist=4,m=4,niter=2,pq_niter=2"])
def test_inner_products_beyond_float32_are_an_error_not_an_answer(spec, use_native):
    """Vectors near 1e37 are finite, and indexed; but questions of 1e3 against them score beyond float32: flat
    answered inf and -1 ids, HNSW NaN scores, IVF-PQ -inf. Scores that large are refused; large finite ones are
    answers."""
    x = np.random.default_rng(3).standard_normal((300, 8)).astype(np.float32)
    index = build_index((x * np.float32(1e37)).astype(np.float32), spec)
    with pytest.raises(InputError, match="queries row 0: inner products beyond the float32 range"):
        index.search(x[:3] * np.float32(1e3), 5)
    scores, ids = index.search(x[:3], 5)  # up to ~1e38: still within float32
    assert np.isfinite(scores).all() and (ids >= 0).all()


def test_an_index_saved_to_a_path_ending_in_a_slash_is_a_directory(tmp_path):
    x = np.random.default_rng(4).standard_normal((20, 8)).astype(np.float32)
    path = build_index(x, "flat").save(str(tmp_path / "newdir") + "/")
    assert path == tmp_path / "newdir" / "index.fdpr" and path.is_file()
    assert len(load_index(tmp_path / "newdir")) == 20
