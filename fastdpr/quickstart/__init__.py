"""The whole chain on published QA data, in one call: data → one corpus of paragraphs → BM25 → hard
negatives → the packaged MiniLM fine-tuned with fastdpr's recipe → encode → index → search (BM25, the starting
model, fine-tuned, hybrid) → reader → evaluation on held-out questions and unseen domains, with paired bootstrap
intervals → speed → ``results.json``, a table and a bar chart.

Usage::

    from fastdpr.quickstart import QuickstartConfig, run_quickstart
    results = run_quickstart(QuickstartConfig.preset(fast=True, out="qs/"))
    results["retrieval"]["bm25"]["top20"]

Three modules: :mod:`.runner` (resumable stages), :mod:`.experiment` (what each stage does), :mod:`.report`
(claims, table, plot). An interrupted run resumes where it stopped; ``force=True`` redoes everything.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

from fastdpr.atomic import write_json, write_text
from fastdpr.data import sources
from fastdpr.quickstart import experiment as ex
from fastdpr.quickstart.config import QuickstartConfig
from fastdpr.quickstart.report import DATASETS, KS, RETRIEVERS, claims, comparisons, format_table, plot
from fastdpr.quickstart.runner import StageRunner


def run_quickstart(config: QuickstartConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) every stage and write ``results.json``, ``results.txt`` and ``results.png`` in
    ``config.out``; return the results dict."""
    import torch

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    runner = StageRunner(out, config.settings(), log, force=config.force)
    ws = ex.Workspace(config, out, Path(config.cache) if config.cache else sources.default_cache(), log)
    if config.threads:
        torch.set_num_threads(config.threads)
    wall = time.perf_counter()
    data = runner.stage("data", lambda: ex.stage_data(ws))
    corpus = runner.stage("corpus", lambda: ex.stage_corpus(ws), after=("data",))
    runner.stage("bm25", lambda: ex.stage_bm25(ws), after=("corpus",))
    mine = runner.stage("mine", lambda: ex.stage_mine(ws), after=("corpus",))
    zero = runner.stage("zero_shot", lambda: ex.stage_zero_shot(ws), after=("corpus",))
    train = runner.stage("train", lambda: ex.stage_train(ws), after=("mine",))
    dense = runner.stage("dense", lambda: ex.stage_dense(ws), after=("train",))
    search = runner.stage("search", lambda: ex.stage_search(ws), after=("bm25", "zero_shot", "dense"))
    reader = runner.stage("reader", lambda: ex.stage_reader(ws), after=("search", "corpus"))
    speed = runner.stage("speed", lambda: ex.stage_speed(ws), after=("search",))
    metrics = search["metrics"]
    compared = comparisons(metrics)
    ranks = {d: {n: m["retrieval"][n].pop("ranks") for n in RETRIEVERS} for d, m in metrics.items()}
    write_json(out / "ranks.json", ranks, indent=None)
    nq = metrics["nq_test"]["retrieval"]
    results = {
        "dataset": "nq_test: Natural Questions (QED dev, the test half of its articles); every set: "
                   "docs/architecture.md, 'Real data'",
        "retrieval": {name: {f"top{k}": nq[name][f"top{k}"] for k in KS} for name in RETRIEVERS},
        "reader": {k: reader[k] for k in ("em", "f1", "n", "top_k", "retriever", "source", "by_top_k",
                                          "squad_gold_paragraph", "nq_gold_paragraph", "read_seconds")
                   if k in reader},
        "qps": {name: speed["qps"][name] for name in RETRIEVERS},
        "datasets": metrics,
        "comparisons": compared,
        "hybrid_alpha": search["alpha"],
        "hybrid": {"fusion": search.get("fusion"), "alpha": search["alpha"],
                   "alpha_tuned_on_dev": search.get("alpha_tuned_on_dev")},
        "index": {"spec": dense["index_spec"], "bytes": dense["index_bytes"], "passages": dense["passages"],
                  "dim": dense["dim"], "truncated_passages": dense.get("truncated_passages"),
                  "max_passage_length": config.passage_length,
                  "encode_precision": ex.encode_precision(config)},
        "claims": claims(metrics, compared, reader),
        "corpus": corpus,
        "training": {"dual_encoder": train, "mining": mine["stats"], "reader": reader.get("train")},
        "notes": [
            "zero_shot is the packaged all-MiniLM-L6-v2, which was itself trained on NQ and SQuAD pairs (among "
            "others): its NQ and SQuAD numbers are not zero-shot in the usual sense; Reddit and Amazon are "
            "domains no part of this run trains, validates or tunes on.",
            "One passage per paragraph, every paragraph of every set in one corpus, the same for BM25 and dense; "
            "the splits keep every test article out of training.",
            "dense = the starting model fine-tuned here with fastdpr's recipe (fastdpr.train.recipe: shared tower, "
            "mean pooling, cosine / temperature, in-batch + one BM25 hard negative, new Wikipedia and QED "
            "training questions), the checkpoint best on validation kept; hybrid = the default fusion (each "
            "side's scores normalised per question), no tuning.",
            "Accuracy is DPR top-k (has_answer on passage text); MRR@10 from the first passage with an answer; "
            "gold_top20 is recall of the question's own paragraph in the top 20. Comparisons: paired bootstrap "
            "over questions, 2,000 resamples, 95% percentile intervals (ranks.json holds every first-hit rank).",
            "qps: questions/second for top-100 on 1 thread, question encoding included.",
        ],
        "config": {**config.settings(), "zero_shot_index_bytes": zero["index_bytes"]},
        "source_counts": data,
        "timings_s": {k: round(v, 1) for k, v in runner.timings.items()},
        # CPU seconds of this process per stage (all threads): on a busy machine, wall time overstates the cost
        "cpu_s": {k: round(v, 1) for k, v in runner.cpu_times.items()},
        "wall_s_this_invocation": round(time.perf_counter() - wall, 1),
        "stages_run_this_invocation": runner.redone,  # empty when every stage was taken from a finished run
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
    }
    write_json(out / "results.json", results)
    write_text(out / "results.txt", format_table(results) + "\n")
    plot(results, out / "results.png")
    return results


__all__ = ["QuickstartConfig", "run_quickstart", "format_table", "claims", "KS", "RETRIEVERS", "DATASETS"]
