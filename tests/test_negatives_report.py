"""benchmarks/negatives_bench.py's report: arms trained on several seeds, averaged per question, the pre-declared
metric leading, the seed-to-seed spread beside the interval."""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
nb = pytest.importorskip("negatives_bench")


def _ranks(rng, n, p_hit):
    """First-hit ranks: 1 with probability p_hit, else beyond 20 (rank 50) or none (0)."""
    return np.where(rng.random(n) < p_hit, 1, np.where(rng.random(n) < 0.5, 50, 0)).tolist()


def _stages(groups, seeds, p_hit_of_group, n=400):
    rng = np.random.default_rng(3)
    stages = {"corpus": {"summary": {"passages": 1000}}, "mine": {"summary": {"train_records": 64}},
              "eval_zero_shot": {"summary": {s: _ranks(rng, n, 0.5) for s in nb.SETS}}}
    for g in groups:
        for sd in seeds:
            stages[f"eval_g{g}_s{sd}"] = {"summary": {s: _ranks(rng, n, p_hit_of_group[g]) for s in nb.SETS}}
            stages[f"train_g{g}_s{sd}"] = {"summary": {
                "group": g, "seed": sd, "steps": 3, "batch": 8, "lr": 5e-4, "precision": "fp32", "chunk": 4,
                "loss_backend": "torch", "train_seconds": 1.0, "examples_per_s": 24.0, "peak_mib": 100.0,
                "peak_kind": "RSS", "losses": [2.0, 1.5]}}
    return stages


def _args(tmp_path, groups, seeds):
    return argparse.Namespace(groups=groups, seeds=seeds, frozen_pools=[], batch=8, steps=3, lr=5e-4, chunk=4,
                              device="cpu", passage_length=256, name="negatives_test", out=str(tmp_path))


def test_report_averages_seeds_and_leads_with_the_deciding_metric(tmp_path):
    groups, seeds = [2, 8], [0, 1, 2]
    assert nb._report(_args(tmp_path, groups, seeds), _stages(groups, seeds, {2: 0.6, 8: 0.9})) == 0
    out = json.loads((tmp_path / "negatives_test.json").read_text())
    body = (tmp_path / "negatives_test.md").read_text()
    lead = f"**Result** (decided by {nb.DECIDING_METRIC} on the {nb.DECIDING} set"
    assert lead in body and body.index(lead) < body.index("### Retrieval")
    deciding = [r for r in out["intervals"] if r["set"] == nb.DECIDING and r["metric"] == nb.DECIDING_METRIC]
    assert len(deciding) == 1 and deciding[0]["seeds"] == 3 and len(deciding[0]["per seed"]) == 3
    r = deciding[0]
    assert r["per seed min"] <= r["difference"] <= r["per seed max"]
    assert 0.2 < r["difference"] < 0.4 and r["excludes 0"] == "yes"
    assert "Every arm ends above the starting model on every seed" in out["verdict"]
    assert len(out["training"]) == 6 and out["unfinished"] == []
    assert "Question-side" not in body  # no question-side arm asked for: no table of them
    assert "Only the deciding row" in body


def test_report_names_missing_seeds_and_arms_below_the_start(tmp_path):
    groups, seeds = [2, 8], [0, 1]
    stages = _stages(groups, seeds, {2: 0.3, 8: 0.55})
    del stages["eval_g8_s1"]
    assert nb._report(_args(tmp_path, groups, seeds), stages) == 0
    out = json.loads((tmp_path / "negatives_test.json").read_text())
    assert out["unfinished"] == ["groups of 8, seed 1"]
    assert "Not above the starting model: groups of 2, seed 0, groups of 2, seed 1" in out["verdict"]
    deciding = next(r for r in out["intervals"] if r["set"] == nb.DECIDING and r["metric"] == nb.DECIDING_METRIC)
    assert deciding["seeds"] == 1  # only the seed both arms ran is paired
