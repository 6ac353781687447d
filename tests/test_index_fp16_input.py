"""float16 vectors and queries go to the compiled indexes as they are (widened in C++, not copied to float32 in
Python) and give exactly what float32 input of the same (fp16-rounded) values gives; the compiled bindings take
float32 or float16 arrays only."""
from __future__ import annotations

import numpy as np
import pytest

from fastdpr.index import build_index
from fastdpr.index._native import native

C = native()
pytestmark = pytest.mark.skipif(C is None, reason="compiled extension not built")

SPECS = ["flat", "flat,fp16", "hnsw,M=8,efc=40", "hnsw,M=8,efc=40,fp16", "ivfpq,nlist=8,m=8,fp16"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x16 = (rng.standard_normal((600, 32)) * rng.lognormal(0, 0.3, (600, 1))).astype(np.float16)
    q16 = rng.standard_normal((40, 32)).astype(np.float16)
    return x16, q16


def _build(spec, x, train):
    from fastdpr.index import make_index

    index = make_index(spec, x.shape[1], n_hint=len(x))
    if not index.is_trained:
        index.train(train)  # the same training sample for both, so only the input dtype differs
    if spec.startswith("hnsw"):
        # two threads insert in whichever order wins the nodes' locks, so only one-thread builds give the same
        # graph twice; the input dtype is what this test varies
        index._add(np.ascontiguousarray(x), threads=1)
    else:
        index.add(x)
    return index


@pytest.mark.parametrize("spec", SPECS)
def test_fp16_input_equals_fp32_input(spec, data):
    x16, q16 = data
    x32, q32 = x16.astype(np.float32), q16.astype(np.float32)
    a, b = _build(spec, x16, x32), _build(spec, x32, x32)
    assert a._takes_half()
    params = {"nprobe": 8, "rerank": 50} if spec.startswith("ivfpq") else {}
    for qa, qb in ((q16, q32), (q16, q16), (q32, q32)):
        sa, ia = a.search(qa, 10, **params)
        sb, ib = b.search(qb, 10, **params)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(sa, sb)
    exact = build_index(x32, "flat").search(q32, 10)[1]
    assert (a.search(q16, 10, **params)[1] == exact).mean() > 0.5  # a real search, not two equal wrong answers


def test_fp16_add_is_not_widened_in_python(data, monkeypatch):
    """The array handed to the compiled add is the caller's fp16 array, not a float32 copy."""
    x16, _ = data
    index = build_index(x16[:10], "flat")
    seen = []
    real = index._impl

    class Spy:
        def add(self, x):
            seen.append(x.dtype)
            real.add(x)

        def __len__(self):
            return len(real)

    monkeypatch.setattr(index, "_impl", Spy())
    index.add(x16)
    assert seen == [np.float16]


def test_fp16_blocks_cover_every_row():
    """More half rows than one conversion block (4M floats): every block lands, in order."""
    d = 4
    rows = (1 << 22) // d + 3
    x = np.zeros((rows, d), dtype=np.float16)
    x[:, 0] = np.arange(rows) % 2000 / 1000
    x[-1] = [60000, 0, 0, 0]
    f = C.FlatIndex(d, "fp16")
    f.add(x)
    assert len(f) == rows
    scores, ids = f.search(np.array([[1, 0, 0, 0]], np.float16), 2)
    assert ids[0, 0] == rows - 1 and scores[0, 0] == 60000


@pytest.mark.parametrize("make", [lambda: C.FlatIndex(8), lambda: C.HNSWIndex(8, M=4, ef_construction=16)])
def test_other_dtypes_are_a_type_error(make):
    index = make()
    index.add(np.ones((3, 8), np.float32))
    for bad in (np.ones((3, 8)), np.ones((3, 8), np.int32), np.ones((3, 8), np.dtype(">f4")), [[1.0] * 8]):
        with pytest.raises(TypeError, match="float32 or float16"):
            index.add(bad)
        with pytest.raises(TypeError, match="float32 or float16"):
            index.search(bad, 2)
    assert len(index) == 3


def test_ivfpq_other_dtypes_are_a_type_error():
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    s = C.IVFPQ(8, 4, 2, 8, "fp16")
    s.train(x, niter=2, pq_niter=2)
    with pytest.raises(TypeError, match="vectors must be float32 or float16, got dtype float64"):
        s.add(x.astype(np.float64))
    with pytest.raises(TypeError, match="queries must be float32 or float16"):
        s.search(x[:2].astype(np.int64), 2, 4, 0, 1)
    s.add(x.astype(np.float16))
    assert len(s) == 300


def test_non_contiguous_fp16(data):
    x16, q16 = data
    wide = np.zeros((len(x16), 64), np.float16)
    wide[:, ::2] = x16
    a = build_index(wide[:, ::2], "flat")
    b = build_index(x16, "flat")
    np.testing.assert_array_equal(a.search(q16[::2], 5)[1], b.search(q16[::2], 5)[1])


def test_python_api_still_takes_other_real_dtypes(data):
    """The Index API converts float64 and integer input itself (only the compiled bindings refuse them)."""
    x16, q16 = data
    x64 = x16.astype(np.float64)
    a, b = build_index(x64, "flat"), build_index(x16, "flat")
    np.testing.assert_array_equal(a.search(q16.astype(np.float64), 5)[1], b.search(q16, 5)[1])
    assert build_index(np.eye(8, dtype=np.int32), "flat").search(np.eye(8, dtype=np.int64), 1)[1][:, 0].tolist() == \
        list(range(8))
