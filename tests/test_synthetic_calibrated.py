"""The calibrated synthetic generator (fastdpr.index.synthetic.calibrated): shapes, determinism, chunking, and the
fitted profiles' norms against the real MiniLM pools' (benchmarks/results/ann_calibration.md at c97483c; for the
growth profile, benchmarks/real_pool.py's)."""
from __future__ import annotations

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index.synthetic import BLOCK, PROFILES, CalibratedGenerator, calibrated

# p5 / median / p95 of the real pool's norms (23,582 passages, 1,000 NQ questions, 384 dimensions); for the growth
# profiles, of benchmarks/real_pool.py's first 30,000 (minilm-mean-growth) and 100,000 (minilm-mean-pool) passages
# and 1,000 test-half questions (as `ann_fit_synthetic.py --growth` printed them)
REAL_NORMS = {"minilm-mean": {"passages": (1.62, 2.23, 4.56), "queries": (5.02, 5.99, 6.84)},
              "minilm-cls": {"passages": (6.67, 7.15, 7.93), "queries": (7.21, 7.91, 8.44)},
              "minilm-mean-growth": {"passages": (2.02, 2.64, 4.36), "queries": (4.72, 5.74, 6.67)},
              "minilm-mean-pool": {"passages": (2.02, 2.64, 4.34), "queries": (4.72, 5.74, 6.67)},
              "minilm-mean-families": {"passages": (2.02, 2.64, 4.34), "queries": (4.72, 5.74, 6.67)}}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_shapes_dtype_and_seed(profile):
    base, queries = calibrated(3000, 48, profile, n_queries=70, seed=3)
    assert base.shape == (3000, 48) and queries.shape == (70, 48)
    assert base.dtype == np.float32 and queries.dtype == np.float32
    assert np.isfinite(base).all() and np.isfinite(queries).all()
    again = calibrated(3000, 48, profile, n_queries=70, seed=3)
    assert np.array_equal(base, again[0]) and np.array_equal(queries, again[1])
    other = calibrated(3000, 48, profile, n_queries=70, seed=4)
    assert not np.allclose(base, other[0]) and not np.allclose(queries, other[1])


def test_chunks_equal_one_shot():
    n = 2 * BLOCK + 1234  # chunks that cross the generator's block boundaries
    gen = CalibratedGenerator(n, 16, "minilm-mean", seed=1)
    whole = gen.passages()
    cuts = [0, 5, BLOCK - 1, BLOCK + 17, 2 * BLOCK, n]
    pieces = [gen.passages(a, b) for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(np.concatenate(pieces), whole)
    out = np.zeros((n - 100, 16), dtype=np.float32)
    assert gen.passages(100, n, out=out) is out and np.array_equal(out, whole[100:])
    # a fresh generator with the same arguments draws the same rows
    assert np.array_equal(CalibratedGenerator(n, 16, "minilm-mean", seed=1).passages(BLOCK, BLOCK + 9),
                          whole[BLOCK:BLOCK + 9])


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_norms_match_the_real_pool(profile):
    base, queries = calibrated(12000, 384, profile, n_queries=1000, seed=0)
    for what, x in (("passages", base), ("queries", queries)):
        got = np.percentile(np.linalg.norm(x, axis=1), [5, 50, 95])
        want = np.array(REAL_NORMS[profile][what])
        assert np.all(np.abs(got / want - 1) < 0.10), (profile, what, got, want)


def test_leaf_growth_sets_how_the_leaf_count_grows_and_zero_makes_nested_samples_of_one_distribution():
    import dataclasses

    from fastdpr.index.synthetic import leaf_count

    base = dataclasses.replace(PROFILES["minilm-mean"], leaf_size=50.0, reference_n=10_000)
    counts = {g: [leaf_count(n, dataclasses.replace(base, leaf_growth=g)) for n in (10_000, 40_000, 1_000_000)]
              for g in (0.0, 0.5, 1.0)}
    assert counts == {0.0: [200, 200, 200], 0.5: [200, 400, 2000], 1.0: [200, 800, 20000]}
    # leaf size fixed (growth 1) is the generator's old rule: n / leaf_size at any reference size
    assert leaf_count(777, dataclasses.replace(base, reference_n=3)) == round(777 / 50.0)
    # with a fixed number of leaves the structure does not depend on n: a smaller set is the larger one's prefix,
    # as the real pool's nested prefixes are
    fixed = dataclasses.replace(base, leaf_growth=0.0, reference_n=2000)
    small, large = CalibratedGenerator(3000, 24, fixed, seed=2), CalibratedGenerator(BLOCK + 500, 24, fixed, seed=2)
    assert small.n_leaves == large.n_leaves == 40
    assert np.array_equal(small.passages(), large.passages(0, 3000))
    assert np.array_equal(small.queries(30), large.queries(30))
    # growth 1: the larger set has more leaves, so other rows
    grows = dataclasses.replace(fixed, leaf_growth=1.0)
    assert not np.allclose(CalibratedGenerator(3000, 24, grows, seed=2).passages(),
                           CalibratedGenerator(BLOCK + 500, 24, grows, seed=2).passages(0, 3000))


def test_families_fill_up_as_n_grows_and_bring_neighbours_closer():
    import dataclasses

    # a fixed number of families: a sample far smaller than it has about one passage per family and looks like the
    # profile without them; a sample many times larger puts its nearest neighbours inside a family
    plain = dataclasses.replace(PROFILES["minilm-mean-pool"], reference_n=2000)
    fam = dataclasses.replace(plain, name="fam", families=300, family_share=0.85)

    def nearest_ratio(profile, n, seed=5):
        # median over 200 passages of (distance to the nearest other passage) / (distance to the 50th)
        x = CalibratedGenerator(n, 32, profile, seed=seed).passages()
        d = np.sqrt(np.maximum((x[:200] ** 2).sum(1)[:, None] - 2 * x[:200] @ x.T + (x ** 2).sum(1)[None, :], 0))
        d.sort(axis=1)
        return float(np.median(d[:, 1] / d[:, 50]))

    assert nearest_ratio(fam, 150) > 0.6 * nearest_ratio(plain, 150)  # about one passage a family: alike
    assert nearest_ratio(fam, 6000) < 0.6 * nearest_ratio(plain, 6000)  # 20 a family: the nearest are kin
    # nested like the profile it extends: the structure, families included, does not depend on n
    small, large = CalibratedGenerator(3000, 24, fam, seed=2), CalibratedGenerator(BLOCK + 500, 24, fam, seed=2)
    assert np.array_equal(small.passages(), large.passages(0, 3000))
    # the families add to the structure; the profiles without them keep their rows (and cached sets)
    assert CalibratedGenerator(10, 24, fam).family_offset.dtype == np.float16
    assert CalibratedGenerator(10, 24, plain).family_offset is None
    with pytest.raises(InputError, match="shares <= 1"):
        CalibratedGenerator(10, 24, dataclasses.replace(fam, family_share=0.95))
    with pytest.raises(InputError, match="families >= 0"):
        CalibratedGenerator(10, 24, dataclasses.replace(fam, families=-1))


def test_shared_vector_sets_the_anisotropy():
    # [CLS] vectors share one large component (mean length / mean norm 0.83 on the real pool), mean pooling much less
    ratios = {}
    for profile in ("minilm-mean", "minilm-cls"):
        base, _ = calibrated(5000, 384, profile, n_queries=1)
        ratios[profile] = np.linalg.norm(base.mean(axis=0)) / np.linalg.norm(base, axis=1).mean()
    assert 0.1 < ratios["minilm-mean"] < 0.3 and 0.75 < ratios["minilm-cls"] < 0.9, ratios


def test_bad_arguments():
    with pytest.raises(InputError, match="unknown synthetic profile 'nope'"):
        calibrated(10, 8, "nope")
    with pytest.raises(InputError, match="n >= 1"):
        CalibratedGenerator(0, 8, "minilm-mean")
    gen = CalibratedGenerator(10, 8, "minilm-mean")
    with pytest.raises(InputError, match="rows 5:11 outside 0:10"):
        gen.passages(5, 11)
    with pytest.raises(InputError, match="out has shape"):
        gen.passages(0, 10, out=np.empty((9, 8), dtype=np.float32))
    with pytest.raises(InputError, match="count"):
        gen.queries(-1)
