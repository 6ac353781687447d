"""benchmarks/ann_growth.py: the neighbourhood measures on cases with a known answer, and a run over a small
stand-in for the real pool's folder."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
ann_growth = pytest.importorskip("ann_growth")


def test_mips_distances_are_those_of_the_augmented_vectors():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((50, 9)).astype(np.float32) * rng.uniform(0.5, 2.0, (50, 1)).astype(np.float32)
    q = rng.standard_normal((4, 9)).astype(np.float32)
    norms_sq = np.einsum("ij,ij->i", x, x)
    big = float(norms_sq.max())
    x_aug = np.hstack([x, np.sqrt(big - norms_sq)[:, None]])
    q_aug = np.hstack([q, np.zeros((4, 1), np.float32)])
    want = np.linalg.norm(q_aug[:, None, :] - x_aug[None, :, :], axis=2)
    got = ann_growth.mips_distances(q, q @ x.T, big)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the nearest in the augmented space is the largest inner product
    assert (got.argmin(axis=1) == (q @ x.T).argmax(axis=1)).all()


@pytest.mark.parametrize("dim", [2, 8])
def test_lid_of_uniform_points_is_near_their_dimension(dim):
    rng = np.random.default_rng(dim)
    points = rng.uniform(size=(20_000, dim))
    centres = rng.uniform(0.3, 0.7, size=(40, dim))
    d = np.sort(np.linalg.norm(centres[:, None, :] - points[None, :, :], axis=2), axis=1)[:, :100]
    lid = np.median(ann_growth.lid_mle(d))
    assert abs(lid - dim) < 0.25 * dim


def test_lid_skips_zero_distances_and_is_nan_when_every_neighbour_is_equally_far():
    d = np.array([[0.0, 1.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    lid = ann_growth.lid_mle(d)
    assert np.isfinite(lid[0]) and lid[0] > 0
    assert np.isnan(lid[1])  # every neighbour at the same distance: no estimate, not a division by zero


def _fake_pool(work: Path, n: int, n_queries: int, dim: int = 16, shard: int = 300) -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((12, dim)) * 3
    folder = work / "encode" / "passages"
    folder.mkdir(parents=True)
    x = (centres[rng.integers(0, 12, n)] + rng.standard_normal((n, dim))).astype(np.float16)
    for start in range(0, n, shard):
        stop = min(n, start + shard)
        for pooling in ("mean", "cls"):
            np.save(folder / f"{pooling}-{start:08d}-{stop:08d}.npy", x[start:stop])
        (folder / f"shard-{start:08d}-{stop:08d}.done.json").write_text("{}")
    qfolder = work / "encode" / "queries"
    qfolder.mkdir(parents=True)
    q = (centres[rng.integers(0, 12, n_queries)] + rng.standard_normal((n_queries, dim))).astype(np.float16)
    for pooling in ("mean", "cls"):
        np.save(qfolder / f"{pooling}-00000000-{n_queries:08d}.npy", q)
    (qfolder / f"shard-00000000-{n_queries:08d}.done.json").write_text("{}")
    with open(work / "queries.jsonl", "w") as f:
        for i in range(n_queries):
            f.write(json.dumps({"qid": str(i), "question": f"q{i}", "answers": [],
                                "source": "s", "split": "test" if i % 2 else "tune"}) + "\n")


def test_growth_rows_for_the_sizes_encoded_and_a_line_for_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=900, n_queries=60)
    out = tmp_path / "out"
    assert ann_growth.main(["--work", str(work), "--sizes", "400,900,5000", "--queries", "20", "--no-synthetic",
                            "--out", str(out)]) == 0
    rows = json.loads((out / "ann_growth.json").read_text())["rows"]
    assert [r["n"] for r in rows] == [400, 900] and all(r["queries"] == 20 for r in rows)
    assert "real mean at 5,000: skipped (only 900 rows" in capsys.readouterr().out
    for r in rows:
        assert r["nlist"] == round(4 * np.sqrt(r["n"]))
        assert 1 <= r["lists for 95% (median)"] <= r["nlist"]
        assert 0 < r["share of passages (median)"] <= r["share of passages (p90)"] <= 1
        assert r["lid_median"] > 0 and r["relative_contrast_median"] > 1


def test_no_size_encoded_is_an_error_that_says_what_to_run(tmp_path):
    work = tmp_path / "pool"
    _fake_pool(work, n=300, n_queries=10)
    with pytest.raises(SystemExit, match="real_pool.py encode"):
        ann_growth.main(["--work", str(work), "--sizes", "1000", "--no-synthetic", "--out", str(tmp_path)])


def test_passage_queries_come_from_beyond_every_measured_prefix(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=900, n_queries=60)
    ds = ann_growth.real_set(work, "mean", 400, 50, "passages", beyond=600)
    import real_pool

    rows = real_pool.load_vectors(work, "mean", 650)[600:].astype(np.float32)
    assert ds.name == "real-mean-passage-queries-400" and ds.n == 400
    np.testing.assert_array_equal(ds.queries, rows)
    # not enough rows beyond the prefixes: skipped with the reason
    assert ann_growth.real_set(work, "mean", 400, 400, "passages", beyond=600) is None


def test_sizes_that_are_not_numbers_are_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="--sizes must be positive whole numbers"):
        ann_growth.main(["--work", str(tmp_path), "--sizes", "10k"])


def test_the_generator_fitted_to_the_growth_curve_matches_every_size_no_worse_than_where_it_started(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    fit_synthetic = pytest.importorskip("ann_fit_synthetic")
    work = tmp_path / "pool"
    _fake_pool(work, n=900, n_queries=60)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    start = dict(fit_synthetic.START["mean"])
    profile, want, got = fit_synthetic.fit_growth("mean", [300, 900, 5000], 1, start, scratch, work, n_queries=20)
    assert sorted(want) == sorted(got) == [300, 900]  # 5,000 is not encoded: left out
    for n in want:
        for stats in (want[n], got[n]):  # each size partitioned into its own 4 sqrt(n) lists
            assert 1 <= stats["partition"]["nprobe_for_95pct_median"] <= fit_synthetic.growth_nlist(n, 4.0)
    # the profile's norms come from the largest prefix measured
    largest = ann_growth.real_set(work, "mean", 900, 20, beyond=5000)
    assert profile.norm_table == fit_synthetic.measured_profile("x", largest)["norm_table"]

    def mean_loss(values):
        p = fit_synthetic.Profile(**{**{k: getattr(profile, k) for k in profile.__dataclass_fields__}, **values})
        return np.mean([fit_synthetic.loss(
            fit_synthetic.stats(fit_synthetic.synthetic_set(p, n, 16, 20), scratch, fit_synthetic.growth_nlist(n, 4.0),
                                lid=True),
            want[n]) for n in want])

    assert profile.reference_n == 300 and 0.0 <= profile.leaf_growth <= 1.0  # leaf size read at the smallest size
    assert "lid_median" in want[300]["partition"] and "lid_median" in got[300]["partition"]
    fitted = {k: getattr(profile, k) for k in (*fit_synthetic.STRUCTURE, "spectrum_decay", "leaf_growth")}
    # where the search started: the start's structure with the leaves' size fixed (growth 1), one of the scanned
    started = {**start, "spectrum_decay": profile.spectrum_decay, "leaf_growth": 1.0}
    assert mean_loss(fitted) <= mean_loss(started) + 1e-9  # the search keeps a step only when it lowers the loss
    with pytest.raises(SystemExit, match="real_pool.py encode"):
        fit_synthetic.fit_growth("mean", [5000], 1, start, scratch, work, n_queries=20)


def test_a_later_run_keeps_the_rows_measured_before_and_measures_only_the_new_size(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=900, n_queries=60)
    out = tmp_path / "out"
    args = ["--work", str(work), "--queries", "20", "--no-synthetic", "--out", str(out)]
    assert ann_growth.main(args + ["--sizes", "400"]) == 0
    first = json.loads((out / "ann_growth.json").read_text())["rows"]
    measured = []
    real_partition = ann_growth.partition_spread
    monkeypatch.setattr(ann_growth, "partition_spread",
                        lambda ds, *a, **k: measured.append(ds.n) or real_partition(ds, *a, **k))
    assert ann_growth.main(args + ["--sizes", "400,900"]) == 0
    rows = json.loads((out / "ann_growth.json").read_text())["rows"]
    assert measured == [900]  # the 400 row came from the cache
    assert rows[0] == first[0] and [r["n"] for r in rows] == [400, 900]


def test_the_report_has_a_plot_and_an_unknown_profile_is_refused_by_name(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=900, n_queries=60)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="--profiles: unknown profile 'minilm-nope'"):
        ann_growth.main(["--work", str(work), "--sizes", "400", "--profiles", "minilm-nope", "--out", str(out)])
    assert ann_growth.main(["--work", str(work), "--sizes", "400", "--queries", "20", "--no-synthetic",
                            "--out", str(out)]) == 0
    assert (out / "ann_growth.png").stat().st_size > 1000


def test_the_grid_start_is_the_grid_point_with_the_lowest_loss():
    fit_synthetic = pytest.importorskip("ann_fit_synthetic")
    want = {"off_manifold": 0.7, "topic_share": 0.02, "leaf_share": 0.3, "leaf_size": 8.0}
    seen = []

    def evaluate(values):
        seen.append(values)
        return sum((values[k] - v) ** 2 for k, v in want.items()), {}

    start = {"off_manifold": 0.0, "topic_share": 0.5, "leaf_share": 0.5, "leaf_size": 50.0, "norm_by_leaf": 0.4}
    loss, got, stats = fit_synthetic.grid_start(evaluate, start, show=lambda got: "")
    assert got == {**start, **want} and loss == 0 and stats == {}  # the other keys kept as they were
    assert len(seen) == int(np.prod([len(v) for v in fit_synthetic.GRID.values()]))


def test_the_generators_rows_can_be_measured_before_the_pool_reaches_their_size(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=600, n_queries=40)
    out = tmp_path / "out"
    assert ann_growth.main(["--work", str(work), "--sizes", "2000", "--no-real", "--dim", "16", "--queries", "20",
                            "--out", str(out)]) == 0
    rows = json.loads((out / "ann_growth.json").read_text())["rows"]
    assert [(r["set"], r["n"]) for r in rows] == [("synthetic-minilm-mean", 2000)]
    # beside an earlier result: its rows kept, the one measured again replaced
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": [{**rows[0], "set": "real-mean"}, {**rows[0], "lid_median": -1.0}]}))
    assert ann_growth.main(["--work", str(work), "--sizes", "2000", "--no-real", "--dim", "16", "--queries", "20",
                            "--merge", str(earlier), "--out", str(out)]) == 0
    result = json.loads((out / "ann_growth.json").read_text())
    assert [r["set"] for r in result["rows"]] == ["real-mean", "synthetic-minilm-mean"]
    assert result["rows"][1] == rows[0] and result["settings"]["merge"] == str(earlier)
    with pytest.raises(SystemExit, match="leave nothing to measure"):
        ann_growth.main(["--work", str(work), "--no-real", "--no-synthetic", "--out", str(out)])


def _growth_rows(sizes, fit_synthetic, scratch, profile, name="real-mean"):
    """ann_growth.py-like rows of ``profile`` at ``sizes`` (16 dimensions, 20 queries): a curve with a known
    source."""
    rows = []
    for n in sizes:
        pt = fit_synthetic.stats(fit_synthetic.synthetic_set(profile, n, 16, 20), scratch,
                                 fit_synthetic.growth_nlist(n, 4.0), lid=True)["partition"]
        rows.append({"set": name, "n": n, "nlist": fit_synthetic.growth_nlist(n, 4.0),
                     "lists for 95% (median)": pt["nprobe_for_95pct_median"],
                     "lists for 95% (p90)": pt["nprobe_for_95pct_p90"], "lid_median": pt["lid_median"]})
    return rows


def test_the_families_fitted_to_a_measured_curve_come_no_worse_than_the_grid_and_every_size_is_scored(
        tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    fit_synthetic = pytest.importorskip("ann_fit_synthetic")
    from fastdpr.index.synthetic import PROFILES

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    start = dataclasses.replace(PROFILES["minilm-mean-pool"], reference_n=300)
    truth = dataclasses.replace(start, families=400, family_share=0.8)
    path = tmp_path / "ann_growth.json"
    path.write_text(json.dumps({"rows": _growth_rows([300, 900, 2000], fit_synthetic, scratch, truth)
                                + [{"set": "other", "n": 300}]}))
    targets = fit_synthetic.curve_targets(path, [300, 900, 2000], "real-mean")
    assert list(targets) == [300, 900, 2000]
    with pytest.raises(SystemExit, match="no 'real-mean' row at n = 5000"):
        fit_synthetic.curve_targets(path, [300, 5000], "real-mean")
    monkeypatch.setattr(fit_synthetic, "FAMILY_GRID", {"families": (100, 400), "family_share": (0.3, 0.8)})
    profile, log = fit_synthetic.fit_to_curve(targets, [300, 900], start, 1, scratch, "fitted", finalists=2,
                                              dim=16, n_queries=20)
    assert profile.name == "fitted" and isinstance(profile.families, int)
    fits = [r for r in log if r["stage"] == "fit"]
    finals = [r for r in log if r["stage"] == "final"]
    assert len(fits) >= 4 and len(finals) == 2
    assert all("2,000" in r and "900" in r for r in finals) and all("2,000" not in r for r in fits)
    # the winner is the finalist with the lowest loss over every size, and the finalists are the best fits
    assert min(finals, key=lambda r: r["loss"])["families"] == profile.families
    best_fit_losses = sorted(r["loss"] for r in fits)[:2]
    point = lambda r: tuple(r[k] for k in fit_synthetic.CURVE_SEARCHED)  # noqa: E731
    assert sorted(r["loss"] for r in fits if point(r) in {point(f) for f in finals}) == best_fit_losses
    # the search never leaves the shares' budget
    assert profile.topic_share + profile.leaf_share + profile.family_share <= 0.98 + 1e-9
    # every point is kept: the same fit again measures nothing
    monkeypatch.setattr(fit_synthetic, "stats", lambda *a, **k: pytest.fail("measured again"))
    again, _ = fit_synthetic.fit_to_curve(targets, [300, 900], start, 1, scratch, "fitted", finalists=2, dim=16,
                                          n_queries=20)
    assert again == profile


def test_merge_keeps_earlier_rows_and_replaces_those_measured_again(tmp_path):
    earlier = tmp_path / "old.json"
    earlier.write_text(json.dumps({"rows": [{"set": "real-mean", "n": 10, "v": 1}, {"set": "syn-a", "n": 10, "v": 2},
                                            {"set": "real-mean", "n": 5, "v": 3}]}))
    rows = ann_growth.merged([{"set": "syn-a", "n": 10, "v": 9}, {"set": "syn-b", "n": 5, "v": 4}], earlier)
    assert [(r["set"], r["n"], r["v"]) for r in rows] == [("real-mean", 5, 3), ("syn-b", 5, 4),
                                                          ("real-mean", 10, 1), ("syn-a", 10, 9)]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="--merge .*bad.json"):
        ann_growth.merged([], tmp_path / "bad.json")
