"""benchmarks/ann_peers.py: peers tuned by fastdpr's own procedure through an adapter, on a small stand-in for the
real pool's folder."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
ann_peers = pytest.importorskip("ann_peers")
from test_ann_growth import _fake_pool  # noqa: E402


def test_the_adapter_lets_tune_choose_a_peers_lists_and_depth():
    """A stand-in peer whose recall grows with the lists searched and the depth re-ranked: tune picks the cheapest
    setting that clears the target, and the adapter hands those knobs to the peer's own search."""
    from fastdpr.index import tune

    rng = np.random.default_rng(3)
    n, d, nlist = 3000, 8, 64
    base = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((240, d)).astype(np.float32)
    truth = np.argsort(-(q @ base.T), axis=1)[:, :100]
    calls = []

    def search(handle, queries, k, threads, nprobe, rerank):
        calls.append((nprobe, rerank))
        # the exact top-k, of which a share grows with nprobe / nlist is kept; the rest filled with far rows
        exact = np.argsort(-(queries @ handle.T), axis=1)[:, :k]
        keep = min(k, int(round(k * min(1.0, nprobe / (0.5 * nlist)))))
        out = exact.copy()
        out[:, keep:] = n - 1 - np.arange(k - keep)
        return out

    peer = ann_peers.PeerIndex("stand-in", base, search, n, d, nlist)
    result = tune.tune(peer, q, target_recall=0.95, k=100, truth=truth)
    assert result.recall >= 0.95
    assert 29 <= result.params["nprobe"] <= 32  # 0.95 of the top 100 kept needs 95% of half the lists
    assert result.params["rerank"] >= 200 and calls and all(r >= 100 for _, r in calls)
    assert (peer.nprobe, peer.rerank) == (result.params["nprobe"], result.params["rerank"])


def test_a_run_tunes_every_build_and_reports_the_test_questions(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=1500, n_queries=240)
    out = tmp_path / "out"
    assert ann_peers.main(["--work", str(work), "--n", "1500", "--queries", "120", "--lists-per-sqrt", "1,2",
                           "--peers", "faiss", "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads((out / "ann_peers_mean_1500.json").read_text())
    assert result["tune_questions"] == result["test_questions"] == 120
    assert result["lists"] == [39, 77]
    families = {t["system"] for t in result["tried"]}
    assert "faiss-ivfpq-fastscan" in families and len(result["tried"]) == 2 * len(families)
    chosen = {r["system"]: r for r in result["chosen"]}
    assert chosen["fastdpr auto + tune"]["test_recall"] > 0.9
    for name, row in chosen.items():
        if name != "fastdpr auto + tune":
            assert row["tune_recall"] >= 0.95 and 0.8 < row["test_recall"] <= 1.0 and row["test_qps"] > 0
            assert row["settings"]["rerank"] >= 200  # tune's ladder starts at 2k
    text = (out / "ann_peers_mean_1500.md").read_text()
    assert "against the best peer" in text and "Every build tried" in text


def test_more_rows_than_encoded_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=600, n_queries=40)
    with pytest.raises(SystemExit, match="only 600 rows of passages are encoded"):
        ann_peers.main(["--work", str(work), "--n", "5000", "--peers", "faiss", "--out", str(tmp_path / "out")])


def _faiss_run(tmp_path, monkeypatch, lists_per_sqrt: str) -> list[str]:
    """ann_peers arguments for faiss alone on a 1,500-row stand-in pool, the benchmark cache under ``tmp_path``."""
    pytest.importorskip("faiss")
    monkeypatch.setenv("FASTDPR_BENCH_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "pool"
    _fake_pool(work, n=1500, n_queries=240)
    return ["--work", str(work), "--n", "1500", "--queries", "120", "--lists-per-sqrt", lists_per_sqrt,
            "--peers", "faiss", "--rounds", "1"]


def test_a_second_run_builds_and_tunes_nothing_and_reloads_each_systems_fastest_build(tmp_path, monkeypatch):
    args = _faiss_run(tmp_path, monkeypatch, "1,2")
    assert ann_peers.main(args + ["--out", str(tmp_path / "first")]) == 0
    first = json.loads((tmp_path / "first" / "ann_peers_mean_1500.json").read_text())

    from fastdpr.index import tune

    def no_tuning(*a, **k):
        raise AssertionError("a kept build was tuned again")

    built = []
    real_builds = ann_peers.faiss_builds

    def counted_builds(*a, **k):
        specs, why = real_builds(*a, **k)
        for spec in specs:
            spec.build = lambda base, b=spec.build, key=spec.key: built.append(key) or b(base)
        return specs, why

    monkeypatch.setattr(tune, "tune", no_tuning)
    monkeypatch.setattr(ann_peers, "faiss_builds", counted_builds)
    assert ann_peers.main(args + ["--out", str(tmp_path / "second")]) == 0
    second = json.loads((tmp_path / "second" / "ann_peers_mean_1500.json").read_text())
    assert built == []  # every system's fastest build came back from disk
    assert [t["system"] for t in second["tried"]] == [t["system"] for t in first["tried"]]
    for a, b in zip(first["chosen"], second["chosen"]):
        assert a["system"] == b["system"] and a["settings"] == b["settings"]
        assert b["test_recall"] == pytest.approx(a["test_recall"])  # the same index, the same settings


def test_a_saved_index_that_went_missing_is_built_again_not_tuned_again(tmp_path, monkeypatch):
    args = _faiss_run(tmp_path, monkeypatch, "1")
    assert ann_peers.main(args + ["--out", str(tmp_path / "first")]) == 0
    stage = next((tmp_path / "cache").rglob("peers-train*"))
    for marker in stage.glob("*.index.json"):
        marker.unlink()
    from fastdpr.index import tune

    monkeypatch.setattr(tune, "tune", lambda *a, **k: (_ for _ in ()).throw(AssertionError("tuned again")))
    assert ann_peers.main(args + ["--out", str(tmp_path / "second")]) == 0
    assert list(stage.glob("*.index.json"))  # built again and kept for the next run


def test_tuned_only_times_the_systems_whose_sweep_is_tuned_and_names_the_rest(tmp_path, monkeypatch):
    args = _faiss_run(tmp_path, monkeypatch, "1")
    with pytest.raises(SystemExit, match="--tuned-only: fastdpr's tuned index is not in"):
        ann_peers.main(args + ["--tuned-only", "--out", str(tmp_path / "none")])
    assert ann_peers.main(args + ["--out", str(tmp_path / "first")]) == 0
    from fastdpr.index import tune

    monkeypatch.setattr(tune, "tune", lambda *a, **k: (_ for _ in ()).throw(AssertionError("tuned in --tuned-only")))
    # a second list count: every system has one build tuned and one not, so none of them is timed
    at = args.index("--lists-per-sqrt") + 1
    wider = args[:at] + ["1,2"] + args[at + 1:]
    assert ann_peers.main(wider + ["--tuned-only", "--out", str(tmp_path / "second")]) == 0
    second = json.loads((tmp_path / "second" / "ann_peers_mean_1500.json").read_text())
    assert [r["system"] for r in second["chosen"]] == ["fastdpr auto + tune"] and second["tried"] == []
    first = json.loads((tmp_path / "first" / "ann_peers_mean_1500.json").read_text())
    for system in {t["system"] for t in first["tried"]}:
        assert second["skipped"][system].startswith("1 of 2 builds tuned so far (lists [77] not yet")
    assert "Not measured" in (tmp_path / "second" / "ann_peers_mean_1500.md").read_text()
    # with the list count of the first run every sweep is tuned: all of them timed again
    assert ann_peers.main(args + ["--tuned-only", "--out", str(tmp_path / "third")]) == 0
    third = json.loads((tmp_path / "third" / "ann_peers_mean_1500.json").read_text())
    assert [r["system"] for r in third["chosen"]] == [r["system"] for r in first["chosen"]]


def test_a_build_whose_process_crashes_is_recorded_with_its_signal_and_the_sweep_goes_on(tmp_path, monkeypatch):
    args = _faiss_run(tmp_path, monkeypatch, "1")
    real_command = ann_peers.child_command
    crashing = "faiss-ivfpq-fastscan-nlist39"

    def command(a, key):  # that build's process aborts the way a segfaulting library would end it
        return [sys.executable, "-c", "import os; os.abort()"] if key == crashing else real_command(a, key)

    monkeypatch.setattr(ann_peers, "child_command", command)
    assert ann_peers.main(args + ["--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "ann_peers_mean_1500.json").read_text())
    tried = {t["system"]: t for t in result["tried"]}
    assert tried["faiss-ivfpq-fastscan"]["error"] == "the build or its tuning crashed (killed by signal 6)"
    chosen = [r["system"] for r in result["chosen"]]
    assert "faiss-ivfpq-fastscan" not in chosen and len(chosen) == len(tried)  # the other systems were measured
    stage = next((tmp_path / "cache").rglob("peers-train*"))
    assert not list(stage.glob("*.candidate*"))  # every candidate index was kept or removed
