"""``fastdpr quickstart``: its pieces on committed samples (corpus building, claims, table, plot, resumable stages)
and, marked slow, the ``--fast`` run end to end on the real data (fetched into the cache on first use)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from fastdpr import quickstart as qs
from fastdpr.quickstart import experiment as ex
from fastdpr.quickstart.report import DATASETS, claims, comparisons, plot
from fastdpr.quickstart.runner import StageRunner, take
from fastdpr.data import sources

SAMPLES = Path(__file__).parent / "data" / "sources"


@pytest.fixture
def sample_cache(tmp_path):
    """A cache whose fetched files are the committed samples (QED, SQuAD dev standing in for XQuAD, and the three
    SQuADShifts sets), prepared as `fastdpr data fetch` prepares them."""
    cache = tmp_path / "cache"
    samples = {"qed-dev.jsonlines": "qed_sample.jsonlines", "xquad.en.json": "squad_dev_sample.json",
               "squadshifts_new_wiki_v1.0.json": "squadshifts_new_wiki_sample.json",
               "squadshifts_reddit_v1.0.json": "squadshifts_reddit_sample.json",
               "squadshifts_amazon_reviews_v1.0.json": "squadshifts_amazon_sample.json"}
    for name, sample in samples.items():
        path = sources.cached_path(name, cache)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLES / sample, path)
    sources.prepare(cache)
    return cache


def _workspace(tmp_path, cache, **overrides):
    settings = dict(out=str(tmp_path / "out"), cache=str(cache), show_progress=False, test_questions=None,
                    dev_questions=None)
    settings.update(overrides)
    config = qs.QuickstartConfig(**settings)
    return ex.Workspace(config, Path(config.out), Path(cache), log=lambda line: None)


def test_corpus_holds_every_paragraph_and_no_held_out_one_is_trained_on(tmp_path, sample_cache):
    ws = _workspace(tmp_path, sample_cache)
    summary = ex.stage_corpus(ws)
    passages = list(sources.read_jsonl(ws.out / "corpus.jsonl"))
    ids = {p["id"] for p in passages}
    assert len(ids) == len(passages) == summary["passages"]
    every = {p["id"] for name in sources.PASSAGE_SETS
             for p in sources.read_jsonl(sample_cache / "prepared" / name / "passages.jsonl")}
    assert ids == every  # one passage per paragraph, all of them
    assert set(summary["by_source"]) == {"nq", "squad", "newwiki", "reddit", "amazon"}
    held = set()
    for name in [*ex.EVAL_SETS, "dev"]:
        records = ws.questions(name)
        assert records, name
        for q in records:
            assert q["gold_ids"] and set(q["gold_ids"]) <= ids
            held.update(q["gold_ids"])
    # no held-out paragraph in the training pool, and validation apart from training
    train_ids = {p["id"] for p in sources.read_jsonl(ws.out / "train_corpus.jsonl")}
    dev_ids = {p["id"] for p in sources.read_jsonl(ws.out / "dev_corpus.jsonl")}
    assert train_ids and dev_ids and not train_ids & held and not train_ids & dev_ids
    for name in ex.TRAIN_SOURCES:
        assert ws.questions(f"train_{name}")
        for q in ws.questions(f"train_{name}"):
            assert set(q["gold_ids"]) <= train_ids
    # the unseen domains are test sets only
    assert summary["train_pool"]["questions"].keys() == set(ex.TRAIN_SOURCES)


def test_corpus_cap_keeps_the_gold_paragraphs(tmp_path, sample_cache):
    full = ex.stage_corpus(_workspace(tmp_path / "full", sample_cache))
    for cap in (1, 12):
        ws = _workspace(tmp_path / f"capped{cap}", sample_cache, max_passages=cap, test_questions=1,
                        dev_questions=1)
        capped = ex.stage_corpus(ws)
        ids = {p["id"] for p in sources.read_jsonl(ws.out / "corpus.jsonl")}
        gold = {g for name in [*ex.EVAL_SETS, "dev"] for q in ws.questions(name) for g in q["gold_ids"]}
        assert gold <= ids and capped["passages"] == len(ids) == max(cap, len(gold))
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
    args, task_args = recipe.arguments("out", examples=1000, batch_size=128, chunk_size=32, eval_times=2,
                                       device="cpu", n_hard=2)
    assert args.max_steps == 7 and args.eval_steps == 3 and args.epochs == 1
    assert task_args.grad_cache and task_args.chunk_size == 32 and task_args.n_hard == 2


def _metrics(top20: dict[str, dict[str, float]], n: int = 200) -> dict:
    """Metrics of each test set with per-question ranks that give the top-20 wanted: the first round(n * v)
    questions found at rank 1 ... 20, the rest not found."""
    import numpy as np

    def retriever(v):
        hit = round(n * v)
        ranks = np.zeros(n, dtype=int)
        ranks[:hit] = 1 + np.arange(hit) % 20
        m = {f"top{k}": float(((ranks > 0) & (ranks <= k)).mean()) for k in (1, 5, 20, 100)}
        return {**m, "mrr10": float(np.where((ranks > 0) & (ranks <= 10), 1 / np.maximum(ranks, 1), 0).mean()),
                "gold_top20": v, "ranks": ranks.tolist()}

    return {d: {"questions": n, "retrieval": {name: retriever(v) for name, v in top20[d].items()}}
            for d in DATASETS}


GOOD = {d: {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.8, "hybrid": 0.9} for d in DATASETS}


def test_claims_are_computed_from_the_numbers():
    metrics = _metrics(GOOD)
    compared = comparisons(metrics, rounds=200)
    held = claims(metrics, compared, {"em": 0.45, "n": 200, "top_k": 5})
    assert len(held) == 5 + 1 + 2 + 5 + 1 and all(c["holds"] for c in held), [c for c in held if not c["holds"]]
    bad = {d: dict(v) for d, v in GOOD.items()}
    bad["reddit"] = {"bm25": 0.8, "zero_shot": 0.7, "dense": 0.72, "hybrid": 0.79}  # 20% of the gap; hybrid below
    bad["nq_test"] = {"bm25": 0.6, "zero_shot": 0.9, "dense": 0.85, "hybrid": 0.95}  # dense below the start
    metrics = _metrics(bad)
    held = {c["claim"]: c for c in claims(metrics, comparisons(metrics, rounds=200), {"em": 0.3, "n": 9,
                                                                                      "top_k": 5})}
    missed = sorted(claim for claim, c in held.items() if not c["holds"])
    assert missed == sorted([
        "NQ (QED test): fine-tuned dense >= the starting model (top-20 and MRR@10 intervals above -0.005)",
        "Reddit (unseen): fine-tuning closes at least half of the starting model's top-20 gap to BM25",
        "Reddit (unseen): hybrid >= max(BM25, dense) at top-20",
        "Reader: open-domain EM from the top-5 passages on NQ test >= 0.4"])
    gap = "Reddit (unseen): fine-tuning closes at least half of the starting model's top-20 gap to BM25"
    assert "20% of the gap closed" in held[gap]["detail"]


def test_paired_bootstrap_interval():
    import numpy as np

    from fastdpr.eval.compare import paired_bootstrap

    a = np.array([1] * 50 + [0] * 50)
    assert paired_bootstrap(a, a, "top20") == (0.0, 0.0, 0.0)
    b = np.array([1] * 60 + [0] * 40)
    mean, lo, hi = paired_bootstrap(a, b, "top20", rounds=500)
    assert mean == pytest.approx(0.1) and 0 < lo < 0.1 < hi < 0.2
    with pytest.raises(ValueError, match="equal"):
        paired_bootstrap(a, b[:10], "top20")
    with pytest.raises(ValueError, match="unknown metric"):
        paired_bootstrap(a, b, "ndcg")


def test_table_and_plot(tmp_path):
    metrics = _metrics(GOOD)
    results = {"datasets": metrics, "qps": {"bm25": 500.0, "zero_shot": 40.0, "dense": 40.0, "hybrid": 30.0},
               "reader": {"em": 0.45, "f1": 0.5, "n": 10, "top_k": 5, "retriever": "hybrid",
                          "squad_gold_paragraph": {"em": 0.5, "f1": 0.6, "n": 10},
                          "nq_gold_paragraph": {"em": 0.55, "f1": 0.65, "n": 10}},
               "index": {"spec": "flat", "passages": 100, "dim": 384, "bytes": 153600},
               "hybrid_alpha": 0.5}
    results["claims"] = claims(metrics, comparisons(metrics, rounds=100), results["reader"])
    table = qs.format_table(results)
    assert "NQ (QED test) (200 questions)" in table and "EM 0.450" in table and "500.0 q/s" in table
    assert "from the gold paragraph, 10 questions: EM 0.500" in table
    assert "the same NQ questions from their gold paragraph: EM 0.550" in table
    # set beside what models of about its size reach on SQuAD v1.1 dev
    assert "published, whole SQuAD v1.1 dev" in table and "DistilBERT" in table
    assert table.count("[holds]") == len(results["claims"]) == 14
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
    training_questions = 550 + 6197  # QED's and new Wikipedia's train splits (test_sources checks the splits)
    assert full.reader_train_questions is None  # all of them
    assert full.reader_steps * full.reader_batch_size <= training_questions  # at most one epoch


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
    ws = _workspace(tmp_path, sample_cache, reader_steps=7, reader_batch_size=2,
                    reader_passages=3, reader_lr=3e-4, reader_train_length=64, reader_train_questions=None,
                    reader_test_questions=4, reader_squad_questions=3, reader_top_k=3)
    ex.stage_data(ws)
    ex.stage_corpus(ws)
    clock = itertools.count(0.0, 1000.0)  # every reading of the clock: another 1,000 s gone
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    result = ex.stage_reader(ws)
    # the same reader recipe judged on the validation questions only (benchmarks/quickstart_reader.py --eval dev)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import quickstart_reader

    dev = quickstart_reader.validate(ws, ex)
    reread = quickstart_reader.validate(ws, ex, trained=str(ws.out / "reader"))  # the reader it saved, not retrained
    monkeypatch.undo()
    assert len(calls) == 2 and calls[0] == calls[1]
    assert reread["by_set"] == dev["by_set"] and reread["train"] == {"trained": str(ws.out / "reader")}
    sizes = {name: len(ws.questions(name)) for name in quickstart_reader.DEV_SETS}
    assert dev["questions"] == sum(sizes.values()) > 0 and set(dev["by_set"]) == set(sizes)
    pooled = sum(dev["by_set"][n]["top3"]["em"] * sizes[n] for n in sizes) / sum(sizes.values())
    assert dev["em_top3_pooled"] == pytest.approx(pooled, abs=1e-4)
    assert all(dev["by_set"][n]["top1"]["n"] == dev["by_set"][n]["gold_paragraph"]["n"] == sizes[n] for n in sizes)
    kwargs = calls[0]
    assert kwargs["max_steps"] == 7 and kwargs.get("time_budget_s") is None
    assert (kwargs["batch_size"], kwargs["n_passages"], kwargs["lr"], kwargs["max_length"]) == (2, 3, 3e-4, 64)
    assert result["train"]["steps"] == 7 and result["train"]["stopped_by"] == "steps"
    assert result["n"] == min(4, len(ws.questions("nq_test"))) and set(result["by_top_k"]) == {"top1", "top3"}
    assert "7 steps of 2 questions x 3 passages" in result["source"]
    assert result["squad_gold_paragraph"]["n"] == 3 and result["train"]["cpu_s"] > 0
    assert result["nq_gold_paragraph"]["n"] == result["n"]  # the same NQ questions, from their gold paragraph


def test_a_reader_mixture_draws_its_shares_repeating_a_small_source():
    from fastdpr.errors import InputError

    by_source = {"big": [{"qid": f"b{i}"} for i in range(50)], "small": [{"qid": f"s{i}"} for i in range(7)]}
    drawn = ex.mixed_questions(by_source, {"big": 0.5, "small": 0.5}, 40, "reader")
    small = [q["qid"] for q in drawn if q["qid"].startswith("s")]
    assert len(drawn) == 40 and len(small) == 20 and len(set(small)) == 7  # every small one, repeated
    assert max(small.count(q) for q in set(small)) - min(small.count(q) for q in set(small)) <= 1  # evenly
    assert len({q["qid"] for q in drawn if q["qid"].startswith("b")}) == 20  # the big source: no repeat
    assert ex.mixed_questions(by_source, {"big": 0.5, "small": 0.5}, 40, "reader") == drawn  # deterministic
    with pytest.raises(InputError, match="unknown sources"):
        ex.mixed_questions(by_source, {"nyt": 1.0}, 10, "reader")
    with pytest.raises(InputError, match="no training questions"):
        ex.mixed_questions({"big": [], "small": by_source["small"]}, {"big": 1.0}, 10, "reader")


def test_a_reader_mixture_with_a_question_count_is_refused():
    from fastdpr.errors import InputError

    with pytest.raises(InputError, match="reader_train_questions 300 are both set"):
        qs.QuickstartConfig(reader_mixture={"qed": 1.0}, reader_train_questions=300)
    # the fast preset's own count gives way to a mixture asked for
    fast = qs.QuickstartConfig.preset(fast=True, reader_mixture={"qed": 1.0})
    assert fast.reader_mixture == {"qed": 1.0} and fast.reader_train_questions is None
    assert qs.QuickstartConfig.preset(fast=True).reader_train_questions == 200


def test_fast_preset_is_smaller_than_the_default():
    fast, full = qs.QuickstartConfig.preset(fast=True), qs.QuickstartConfig.preset()
    assert fast.fast and fast.max_passages and fast.train_examples < full.train_examples
    assert qs.QuickstartConfig.preset(fast=True, train_examples=3, max_passages=None).train_examples == 3


# ------------------------------------------------------------------------------------------- end to end (slow)


@pytest.mark.slow
def test_quickstart_fast_end_to_end(tmp_path):
    """The real chain on the published QA files, fetched (sha256-checked) from $FASTDPR_DATA_DIR into a fresh
    cache, as a new machine does after `fastdpr data fetch --from DIR`."""
    from fastdpr.cli import main

    if sources.default_source_dir() is None:
        pytest.skip(f"no local copy of the published QA files: set ${sources.DATA_DIR_ENV} (README, 'Real data')")
    cache = str(tmp_path / "cache")
    assert main(["data", "fetch", "--cache", cache, "--quiet"]) == 0
    out = tmp_path / "qs"
    assert main(["quickstart", "--fast", "--out", str(out), "--cache", cache, "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    # the output contract of the quickstart
    assert set(results["retrieval"]) == {"bm25", "dense", "zero_shot", "hybrid"}
    assert set(results["datasets"]) == set(DATASETS)
    for dataset in DATASETS:
        for name, acc in results["datasets"][dataset]["retrieval"].items():
            values = [acc[f"top{k}"] for k in (1, 5, 20, 100)]
            assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values), (dataset, name, values)
            assert acc["top1"] <= acc["mrr10"] <= acc["top20"], (dataset, name)
    reader = results["reader"]
    assert 0 <= reader["em"] <= reader["f1"] <= 1 and reader["squad_gold_paragraph"]["n"] > 0
    assert set(results["qps"]) >= {"bm25", "dense"} and all(v > 0 and math.isfinite(v) for v in results["qps"].values())
    # BM25 far above chance: a random top-20 out of the corpus would hit the gold paragraph with p = 20 / corpus
    corpus = results["corpus"]["passages"]
    for dataset in DATASETS:
        bm25 = results["datasets"][dataset]["retrieval"]["bm25"]
        assert bm25["gold_top20"] > 10 * 20 / corpus and bm25["top20"] > 0.3, (dataset, bm25)
    assert len(results["claims"]) == 14 and all(isinstance(c["holds"], bool) for c in results["claims"])
    compared = results["comparisons"]["squad: dense - bm25"]["top20"]
    assert compared["lo"] <= compared["mean"] <= compared["hi"]
    ranks = json.loads((out / "ranks.json").read_text())
    assert len(ranks["reddit"]["bm25"]) == results["datasets"]["reddit"]["questions"]
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert "claims" in (out / "results.txt").read_text()
    # a second run resumes: every stage is skipped and the numbers are the same
    assert main(["quickstart", "--fast", "--out", str(out), "--cache", cache, "--quiet"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["retrieval"] == results["retrieval"] and again["stages_run_this_invocation"] == []
    assert results["stages_run_this_invocation"]  # the first run did run them


def test_stale_vectors_are_found_by_their_fingerprint(tmp_path):
    """The dense stages' vectors are encoded again when the model's fingerprint is not the one they record (a new
    fine-tuning), kept when it is, and the index carries that fingerprint."""
    import torch

    from fastdpr.encode import model_fingerprint
    from fastdpr.index import load_index
    from tiny_models import tiny_biencoder

    ws = _workspace(tmp_path, tmp_path / "cache", encode_precision="fp32")
    lines = []
    ws.log = lines.append
    ws.out.mkdir(parents=True)
    words = ["river", "king", "city", "war", "song", "law"]
    sources.write_passages_jsonl(ws.out / "corpus.jsonl", [
        {"id": f"p{i}", "title": f"t{i}", "text": " ".join(words[(i * j) % 6] for j in range(i % 5 + 2))}
        for i in range(40)])
    model = tiny_biencoder(tmp_path / "m", pooling="mean", similarity="dot", max_passage_length=16)
    first = ex._encode_and_index(ws, model, "zero_shot")
    before = model_fingerprint(model)
    assert load_index(first["index_path"]).model_fingerprint == before
    shard = ws.out / "vectors_zero_shot" / "shard-00000.npy"
    written = shard.stat().st_mtime_ns

    ex._encode_and_index(ws, model, "zero_shot")  # the same model: the vectors stand
    assert shard.stat().st_mtime_ns == written and not lines

    with torch.no_grad():  # another model: the passage tower's weights moved
        next(model.passage_encoder.parameters()).add_(0.01)
    after = model_fingerprint(model)
    assert after != before
    ex._encode_and_index(ws, model, "zero_shot")
    assert any("stale vectors" in line for line in lines), lines
    assert load_index(first["index_path"]).model_fingerprint == after
    assert json.loads((ws.out / "vectors_zero_shot" / "manifest.json").read_text())["model_fingerprint"] == after
