"""``"auto"`` (the index chosen from n, d and a memory budget) and ``index.tune`` (the cheapest search settings that
reach a recall target, saved in the index file)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from compiled_extension import extension
from test_index_ivfpq import clustered as ivfpq_clustered

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index, make_index
from fastdpr.index import fileformat
from fastdpr.index.auto import COMPRESSED_MIN_N, FLAT_MAX_FLOATS, MANY_LISTS_MIN_N, choose_index, parse_size
from fastdpr.index.tune import lower_bound, recall_at, recall_per_query, smallest

needs_c = pytest.mark.skipif(extension("IVFPQ") is None, reason="compiled extension not built")


def clustered(rng, n, d):
    return ivfpq_clustered(rng, n, d, n_clusters=24, rank=6, noise=0.5)


@pytest.fixture(scope="module")
def data():
    """6,000 vectors; 300 tuning queries and 300 held-out ones from the same mixture (not in the index)."""
    x = clustered(np.random.default_rng(32), 6600, 32)
    return x[:6000], x[6000:6300], x[6300:]


def exact_ids(x, q, k):
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


# ---------------------------------------------------------------------------------------------------------------
# auto: the shape from n, d and the budget


def test_parse_size():
    assert parse_size("2GB") == 2 * 10 ** 9
    assert parse_size("512MiB") == 512 * 2 ** 20
    assert parse_size("1.5 G") == 1_500_000_000
    assert parse_size(100000) == parse_size("100000") == 100000
    for bad in ("", "two GB", "2XB", "-1GB", "0", 0, -5, True, "nanGB", float("inf")):
        with pytest.raises(InputError, match="memory budget"):
            parse_size(bad)


def test_auto_shapes_by_n_d_and_budget():
    assert choose_index(1000, 384, compiled=True).spec == "flat"
    assert choose_index(FLAT_MAX_FLOATS // 768, 768, compiled=True).spec == "flat"
    # small sets are searched exactly: 5,125 MiniLM passages, and up to 20,000 x 384
    assert FLAT_MAX_FLOATS == 20_000 * 384
    assert choose_index(5_125, 384, compiled=True).spec == "flat"
    assert choose_index(20_000, 384, compiled=True).spec == "flat"
    assert choose_index(20_001, 384, compiled=True).spec.startswith("ivfpq")
    # exact search in fp16 when fp32 rows do not fit the budget
    assert choose_index(1000, 384, memory_budget=1000 * 384 * 3, compiled=True).spec == "flat,fp16"
    mid = choose_index(50_000, 384, compiled=True)
    assert mid.spec == "ivfpq,nbits=4,nlist=512,store=fp16" and not mid.mmap
    big = choose_index(COMPRESSED_MIN_N, 768, compiled=True)
    assert big.spec == "ivfpq,nbits=4,nlist=1024,m=96,store=fp16,aniso=0.2,sq=4,spread=0.5" and not big.mmap
    # the d/2 shape's fp16 rows do not fit 20 MB: the compressed shape, with its rows left in the file
    small_budget = choose_index(50_000, 384, memory_budget="20MB", compiled=True)
    assert ",sq=4," in small_budget.spec and small_budget.mmap and small_budget.resident_bytes <= 20 * 10 ** 6
    dpr = choose_index(21_015_324, 768, "24GB", compiled=True)
    assert dpr.mmap and "m=96" in dpr.spec and dpr.resident_bytes < 1.2 * 10 ** 9
    assert not choose_index(21_015_324, 768, "64GB", compiled=True).mmap
    # from 10M vectors about 4 sqrt(n) lists, from 16,384 lists trained in two levels with about sqrt(nlist) groups
    assert "nlist=16384," in dpr.spec and dpr.spec.endswith(",groups=128")
    below = choose_index(MANY_LISTS_MIN_N - 1, 768, compiled=True).spec
    assert "nlist=8192," in below and "groups" not in below
    huge = choose_index(40_000_000, 768, "64GB", compiled=True)
    assert "nlist=32768," in huge.spec and huge.spec.endswith(",groups=256")
    # no compiled core: the 8-bit codes the numpy backend builds
    assert choose_index(50_000, 384, compiled=False).spec == "ivfpq,nlist=1024,store=fp16"
    with pytest.raises(InputError, match="too small"):
        choose_index(10 ** 6, 768, "10MB", compiled=True)
    for n, d in ((0, 8), (10, 0), (1.5, 8)):
        with pytest.raises(InputError):
            choose_index(n, d)


def test_auto_spec_builds_the_choice():
    assert make_index("auto", 384, n_hint=1000).kind == "flat"
    assert make_index("auto,fp16", 384, n_hint=1000).fp16
    from fastdpr.index._native import fallback_forced, force_fallback, native

    if native() is not None:
        index = make_index("auto", 384, n_hint=50_000)
        assert (index.kind, index.nbits, index.store, index.nlist) == ("ivfpq", 4, "fp16", 512)
        assert make_index("auto,fp32", 384, n_hint=50_000).store == "fp32"
        assert make_index("auto,memory_budget=20MB", 384, n_hint=50_000).sq == 4
        assert make_index("auto", 384, n_hint=50_000, memory_budget="20MB").sq == 4
    was = fallback_forced()
    force_fallback(True)
    try:  # without the compiled core: the 8-bit codes the numpy backend builds
        index = make_index("auto", 384, n_hint=50_000)
        assert (index.kind, index.nbits, index.store, index.compiled) == ("ivfpq", 8, "fp16", False)
    finally:
        force_fallback(was)
    with pytest.raises(InputError, match="M"):
        make_index("auto,M=32", 384, n_hint=1000)
    with pytest.raises(InputError, match="memory budget"):
        make_index("auto,memory_budget=lots", 384, n_hint=1000)
    with pytest.raises(InputError, match="auto"):
        make_index("flat", 384, memory_budget="1GB")


# ---------------------------------------------------------------------------------------------------------------
# tune


def test_smallest_finds_the_threshold():
    for threshold in (1, 2, 3, 7, 64, 100):
        calls = []

        def reaches(v):
            calls.append(v)
            return v >= threshold

        assert smallest(reaches, 1, 100) == threshold
        assert len(calls) <= 2 * 7 + 1
    assert smallest(lambda v: False, 1, 50) is None


def test_the_lower_bound_is_the_mean_less_two_standard_errors():
    assert lower_bound(np.array([1.0, 0.8])) == pytest.approx(0.9 - 2 * 0.1)  # std 0.1414, over sqrt(2)
    assert lower_bound(np.array([0.7])) == 0.7  # one query: no spread to measure
    assert lower_bound(np.full(50, 0.96)) == pytest.approx(0.96)


def test_recall_at_counts_padding_as_nothing():
    truth = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    found = np.array([[4, 3, 9, 8], [6, -1, -1, -1]])
    assert recall_at(found, truth) == pytest.approx((2 / 4 + 1 / 2) / 2)


@needs_c
@pytest.mark.parametrize("spec", ["ivfpq,nbits=4,nlist=64,store=fp16",
                                  "ivfpq,nbits=4,nlist=64,m=8,store=fp16,sq=4,spread=0.5"])
def test_tune_reaches_the_target_on_held_out_queries(data, spec):
    x, q_tune, q_held = data
    index = build_index(x, spec)
    k, target = 50, 0.9
    before = recall_at(index.search(q_held, k)[1], exact_ids(x, q_held, k))
    result = index.tune(q_tune, target_recall=target, k=k)
    assert result.recall >= target and result.queries == len(q_tune) and result.confirmed_on == len(q_tune) // 2
    assert set(result.params) >= {"nprobe", "rerank"} and 1 <= result.params["nprobe"] <= index.nlist
    assert ("exact" in result.params) == (",sq=4" in spec)
    choose, confirm = q_tune[0::2], q_tune[1::2]  # the two halves of the sample

    def low(queries, **params):
        return lower_bound(recall_per_query(index.search(queries, k, **params)[1], exact_ids(x, queries, k)))

    # the choosing half's pick is its cheapest: with one list fewer its recall no longer clears the target
    chosen = result.chosen
    assert low(choose, **chosen) >= target
    if chosen["nprobe"] > 1:
        assert low(choose, **dict(chosen, nprobe=chosen["nprobe"] - 1)) < target
    # the confirming half passes what search now uses by default, and reports its own recall
    assert low(confirm) >= target
    # (tune's exact ids come from the index's fp16 rows: a near tie may fall the other way)
    assert result.recall == pytest.approx(recall_at(index.search(confirm, k)[1], exact_ids(x, confirm, k)), abs=2e-3)
    held = recall_at(index.search(q_held, k)[1], exact_ids(x, q_held, k))
    assert held >= target - 0.01, (held, before)


@needs_c
def test_a_confirming_half_that_falls_short_raises_the_settings(data):
    # easy queries in the rows that choose, far harder ones in the rows that confirm: the choice must grow
    x, q_tune, _ = data
    rng = np.random.default_rng(7)
    hard = (q_tune + rng.normal(0, 1.5, q_tune.shape)).astype(np.float32)
    mixed = np.empty_like(q_tune)
    mixed[0::2], mixed[1::2] = q_tune[0::2], hard[1::2]
    index = build_index(x, "ivfpq,nbits=4,nlist=64,store=fp16")
    k, target = 50, 0.9
    result = index.tune(mixed, target_recall=target, k=k)
    assert result.params["nprobe"] > result.chosen["nprobe"]
    assert index.nprobe == result.params["nprobe"]
    confirm = mixed[1::2]
    assert lower_bound(recall_per_query(index.search(confirm, k)[1], exact_ids(x, confirm, k))) >= target
    assert result.recall == pytest.approx(recall_at(index.search(confirm, k)[1], exact_ids(x, confirm, k)), abs=2e-3)
    # a confirming half that no setting satisfies (its exact ids are another query's) is refused by name
    truth = exact_ids(x, mixed, k)
    truth[1::2] = truth[1::2][::-1]
    with pytest.raises(InputError, match="confirming half"):
        index.tune(mixed, target_recall=target, k=k, truth=truth)


@needs_c
def test_tuned_settings_are_saved_loaded_and_used(tmp_path, data):
    x, q_tune, q_held = data
    index = build_index(x, "ivfpq,nbits=4,nlist=64,store=fp16")
    path = tmp_path / "index.fdpr"
    index.save(path)
    assert load_index(path).tuned is None  # a file written before tuning
    result = index.tune(q_tune, target_recall=0.9, k=50, save=path)
    reader = fileformat.open_reader(path)
    record = json.loads(reader.meta("tuned"))
    assert record["params"] == result.params and record["target_recall"] == 0.9 and record["k"] == 50
    assert reader.meta_int("nprobe") == result.params["nprobe"]
    for mmap in (False, True):
        loaded = load_index(path, mmap=mmap)
        assert loaded.tuned == record
        assert (loaded.nprobe, loaded.rerank) == (result.params["nprobe"], result.params["rerank"])
        s, i = loaded.search(q_held, 50)
        s2, i2 = loaded.search(q_held, 50, **result.params)
        np.testing.assert_array_equal(i, i2)
        # explicit parameters win over the tuned ones
        _, i1 = loaded.search(q_held, 50, nprobe=1, rerank=50)
        assert not np.array_equal(i1, i)
        assert recall_at(i1, exact_ids(x, q_held, 50)) < recall_at(i, exact_ids(x, q_held, 50))


@needs_c
def test_tuning_a_mapped_index_rewrites_its_own_file(tmp_path, data):
    x, q_tune, q_held = data
    path = build_index(x, "ivfpq,nbits=4,nlist=64,m=8,store=fp16,sq=4").save(tmp_path / "index.fdpr")
    mapped = load_index(path, mmap=True)
    result = mapped.tune(q_tune[:100], target_recall=0.8, k=10, save=path)
    np.testing.assert_array_equal(mapped.search(q_held[:20], 10, nprobe=mapped.nprobe)[1],
                                  mapped.search(q_held[:20], 10)[1])
    again = load_index(path, mmap=True)
    assert again.tuned["params"] == result.params and again.exact == result.params["exact"]
    np.testing.assert_array_equal(again.search(q_held[:20], 10)[1], mapped.search(q_held[:20], 10)[1])


def test_tune_on_the_numpy_backend_and_without_stored_vectors(data):
    x, q_tune, _ = data
    index = build_index(x[:3000], "ivfpq,nlist=32,m=8,backend=numpy")  # codes only: no re-rank possible
    with pytest.raises(InputError, match="vectors="):
        index.tune(q_tune[:50], target_recall=0.5, k=10)
    result = index.tune(q_tune[:50], target_recall=0.5, k=10, vectors=x[:3000])
    assert result.recall >= 0.5 and result.params["rerank"] == 0
    truth = exact_ids(x[:3000], q_tune[:50], 10)
    assert index.tune(q_tune[:50], target_recall=0.5, k=10, truth=truth).params == result.params
    with pytest.raises(InputError, match="out of reach"):
        index.tune(q_tune[:50], target_recall=1.0, k=10, truth=truth)


def test_tune_flat_is_exact(data):
    x, q_tune, _ = data
    index = build_index(x[:500], "flat")
    result = index.tune(q_tune[:20], target_recall=0.99, k=10)
    assert result.params == {} and result.recall == 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(target_recall=0), "target_recall"), (dict(target_recall=-0.5), "target_recall"),
    (dict(target_recall=1.01), "target_recall"), (dict(target_recall=float("nan")), "target_recall"),
    (dict(target_recall=True), "target_recall"), (dict(target_recall="0.9"), "target_recall"),
    (dict(k=0), "k must"), (dict(k=-3), "k must"), (dict(k=2.5), "k must"),
    (dict(max_queries=0), "max_queries"), (dict(threads=-1), "threads"),
])
def test_bad_targets_are_refused(data, small_index, kwargs, match):
    with pytest.raises(InputError, match=match):
        small_index.tune(data[1][:10], **kwargs)
    assert small_index.tuned is None


@pytest.fixture(scope="module")
def small_index(data):
    return build_index(data[0][:1000], "ivfpq,nlist=16,m=8,store=fp16,backend=numpy")


def test_bad_samples_are_refused(data, small_index):
    x, q_tune, _ = data
    index = small_index
    with pytest.raises(InputError, match="empty"):
        index.tune(np.empty((0, 32), np.float32))
    with pytest.raises(InputError, match="dimension"):
        index.tune(q_tune[:10, :16])
    with pytest.raises(InputError, match="NaN"):
        index.tune(np.full((2, 32), np.nan, np.float32))
    with pytest.raises(InputError, match="truth"):
        index.tune(q_tune[:10], k=10, truth=np.zeros((9, 10), np.int64))
    with pytest.raises(InputError, match="vectors"):
        index.tune(q_tune[:10], k=10, vectors=x[:999])
    with pytest.raises(InputError, match="not tuned"):
        build_index(x[:300], "hnsw,M=8,efc=16").tune(q_tune[:5], k=5)


@needs_c
def test_fastdpr_index_auto_and_tune_command(tmp_path, capsys):
    from fastdpr.cli import main
    from fastdpr.encode import load_vectors
    from tiny_models import tiny_vector_shards

    vec_dir = tiny_vector_shards(tmp_path)
    vectors, _ = load_vectors(vec_dir)
    out = tmp_path / "auto.fdpr"
    assert main(["index", str(vec_dir), "-o", str(out), "--memory-budget", "1GB", "--tune-queries", "40",
                 "--no-progress"]) == 0
    assert "auto: flat" in capsys.readouterr().out and load_index(out).kind == "flat"
    queries = tmp_path / "q.npy"
    np.save(queries, np.asarray(vectors[::10], np.float32))
    out = tmp_path / "ivf.fdpr"
    assert main(["index", str(vec_dir), "-o", str(out), "--spec", "ivfpq,nbits=4,nlist=8,store=fp16",
                 "--tune-queries", str(queries), "--target-recall", "0.9", "--tune-k", "10", "--no-progress"]) == 0
    assert "tuned on 40 queries" in capsys.readouterr().out
    index = load_index(out)
    assert index.tuned["k"] == 10 and index.nprobe == index.tuned["params"]["nprobe"]
    for bad in (["--target-recall", "0"], ["--target-recall", "1.5"], ["--tune-k", "0"],
                ["--memory-budget", "much"], ["--tune-queries", str(tmp_path / "none.npy")],
                ["--spec", "hnsw,M=8"]):
        args = ["index", str(vec_dir), "-o", str(tmp_path / "bad.fdpr"), "--tune-queries", "10", "--no-progress"]
        assert main(args + bad) != 0
    assert not (tmp_path / "bad.fdpr").exists()
