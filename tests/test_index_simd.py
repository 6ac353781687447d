"""Every SIMD level against the scalar kernels (and float64 references) on odd lengths, plus fp16 conversions."""
from __future__ import annotations

import numpy as np
import pytest

from compiled_extension import SIMD_LEVELS, capped, level_params, simd_levels, skip_unrun
from fastdpr.index._native import native

C = native()
pytestmark = pytest.mark.skipif(C is None, reason="compiled extension not built")
LEVELS = simd_levels(C)  # the ones this CPU runs
LENGTHS = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129, 255, 384, 511, 767, 768, 769, 1000]


def test_the_widest_enabled_level_is_active():
    assert C.simd_level() == LEVELS[-1]


@pytest.mark.parametrize("level", level_params(SIMD_LEVELS))
@pytest.mark.parametrize("n", LENGTHS)
def test_dot_l2_against_scalar_and_float64(level, n):
    rng = np.random.default_rng(n * 7 + len(level))
    a = (rng.standard_normal(n) * 3).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    tol = 1e-5 * (np.abs(a).astype(np.float64) @ np.abs(b) + 1)
    ref = float(a.astype(np.float64) @ b.astype(np.float64))
    assert abs(C.simd_dot(a, b, level) - ref) <= tol
    assert abs(C.simd_dot(a, b, level) - C.simd_dot(a, b, "scalar")) <= tol
    ref_l2 = float(((a.astype(np.float64) - b) ** 2).sum())
    assert abs(C.simd_l2sq(a, b, level) - ref_l2) <= 1e-5 * (ref_l2 + 1)
    assert abs(C.simd_l2sq(a, b, level) - C.simd_l2sq(a, b, "scalar")) <= 1e-5 * (ref_l2 + 1)


@pytest.mark.parametrize("level", level_params(SIMD_LEVELS))
@pytest.mark.parametrize("n", LENGTHS)
def test_dot_f16_against_scalar(level, n):
    rng = np.random.default_rng(n + 1000)
    a = rng.standard_normal(n).astype(np.float32)
    h = rng.standard_normal(n).astype(np.float16)
    ref = float(a.astype(np.float64) @ h.astype(np.float64))
    tol = 1e-5 * (np.abs(a).astype(np.float64) @ np.abs(h.astype(np.float64)) + 1)
    got = C.simd_dot_f16(a, h.view(np.uint16), level)
    assert abs(got - ref) <= tol
    assert abs(got - C.simd_dot_f16(a, h.view(np.uint16), "scalar")) <= tol


@pytest.mark.parametrize("level", level_params(SIMD_LEVELS))
@pytest.mark.parametrize("d", [1, 5, 16, 17, 64, 100, 768])
def test_dot4x4_micro_kernel(level, d):
    rng = np.random.default_rng(d)
    q = rng.standard_normal((4, d)).astype(np.float32)
    x = rng.standard_normal((4, d)).astype(np.float32)
    ref = q.astype(np.float64) @ x.T.astype(np.float64)
    np.testing.assert_allclose(C.simd_dot4x4(q, x, level), ref, rtol=1e-5, atol=1e-5 * np.sqrt(d))


@pytest.mark.parametrize("level", level_params(SIMD_LEVELS))
def test_half_conversions_match_numpy_bit_for_bit(level):
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e6, -1e6, 6.1e-5, 5.96e-8, 2.98e-8, 1e-9,
                        np.inf, -np.inf, 0.33325195, 2049.0, 2051.0], dtype=np.float32)
    x = np.concatenate([special, (rng.standard_normal(1001) * rng.choice([1e-6, 1e-3, 1, 1e3, 7e4], 1001))
                        .astype(np.float32)])
    with np.errstate(over="ignore"):
        halves = x.astype(np.float16)
    np.testing.assert_array_equal(C.to_half(x, level), halves.view(np.uint16))
    np.testing.assert_array_equal(C.from_half(halves.view(np.uint16), level), halves.astype(np.float32))
    # NaN stays NaN
    assert np.isnan(C.from_half(C.to_half(np.array([np.nan], np.float32), level), level)[0])


def test_every_level_gives_the_same_search_results():
    from fastdpr.index import build_index
    from fastdpr.index.synthetic import gaussian_mixture

    x, q = gaussian_mixture(1500, 45, n_queries=13, seed=11)
    results = {}
    for level in LEVELS:
        with capped(C, level):
            assert C.simd_level() == level
            results[level] = [build_index(x, spec).search(q, 10) for spec in ("flat", "flat,fp16")]
            results[level].append(build_index(x, "hnsw,M=8,efc=40").search(q, 10, ef=200))
    base = results["scalar"]
    for level in LEVELS:
        for (s, i), (s0, i0) in zip(results[level], base):
            np.testing.assert_allclose(s, s0, rtol=1e-4, atol=1e-4)
            assert (i == i0).mean() > 0.97  # swaps only between near-ties
    skip_unrun(SIMD_LEVELS, LEVELS)


@pytest.mark.parametrize("d", [1, 5, 16, 17, 33, 100])
@pytest.mark.parametrize("n", [1, 15, 17, 37, 300])
def test_blocked_exact_search_scores_at_every_level(d, n):
    """The GEMM path (>= 8 queries: vector panels packed 16 x 16 in registers, dimensions past a multiple of 16 one
    by one, panels of fewer vectors padded with zeros) against float64, at every SIMD level."""
    from fastdpr.index import build_index

    seed = int(np.random.SeedSequence().generate_state(1)[0])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((20, d)).astype(np.float32)
    want = np.sort(q.astype(np.float64) @ x.T.astype(np.float64), axis=1)[:, ::-1][:, : min(n, 10)]
    for level in LEVELS:
        with capped(C, level):
            scores, _ = build_index(x, "flat").search(q, 10)
        np.testing.assert_allclose(scores[:, : min(n, 10)], want, rtol=1e-5, atol=1e-5 * np.sqrt(d),
                                   err_msg=f"{level}, seed {seed}")
    skip_unrun(SIMD_LEVELS, LEVELS)

def test_unknown_level_is_an_error():
    with pytest.raises(ValueError, match="set_cpu_cap: unknown CPU level 'sse9'"):
        C.set_cpu_cap("sse9")
    with pytest.raises(ValueError, match="simd_dot: unknown CPU level 'sse9'"):
        C.simd_dot(np.ones(3, np.float32), np.ones(3, np.float32), "sse9")
