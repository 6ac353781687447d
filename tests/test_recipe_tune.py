"""benchmarks/recipe_tune.py: the run's own recipe read from its stage summary, and paired intervals between rows
that kept per-question ranks."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
recipe_tune = pytest.importorskip("recipe_tune")

from fastdpr.quickstart import QuickstartConfig  # noqa: E402
from fastdpr.train import recipe  # noqa: E402


def _row(name: str, ranks: dict[str, list[int]] | None) -> dict:
    row = {"row": name, "dev_top20": 0.9, "dev_mrr10": 0.8}
    for dev in recipe_tune.DEV_SETS:
        row[dev] = {"top20": 0.9, "mrr10": 0.8}
        if ranks is not None:
            row[dev]["ranks"] = ranks[dev]
    return row


def test_the_recipe_row_is_the_runs_own(tmp_path):
    config = QuickstartConfig.preset()
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "train.json").write_text(json.dumps(
        {"summary": {"examples": 2048, "lr": 1e-4, "steps": 16}}))  # a run from before the summary named alpha
    assert recipe_tune.run_recipe(tmp_path, config) == {"examples": 2048, "lr": 1e-4, "steps": 16,
                                                        "alpha": recipe.INTERPOLATE}
    (tmp_path / "stages" / "train.json").write_text(json.dumps(
        {"summary": {"examples": 5158, "lr": 1e-4, "steps": 40, "interpolate": 0.75}}))
    assert recipe_tune.run_recipe(tmp_path, config)["alpha"] == 0.75
    assert recipe_tune.run_recipe(tmp_path / "missing", config)["examples"] == config.train_examples


def test_intervals_pair_the_chosen_row_with_each_baseline_that_kept_ranks():
    rng = np.random.default_rng(7)
    n = {dev: int(rng.integers(20, 60)) for dev in recipe_tune.DEV_SETS}
    base = {dev: [0, *rng.integers(0, 30, size=k).tolist()] for dev, k in n.items()}  # at least one miss
    better = {dev: [max(1, r - 5) if r else 3 for r in ranks] for dev, ranks in base.items()}
    start, chosen = _row("starting model", base), _row("arm", better)
    rows = [start, _row("quickstart recipe", None), chosen]  # the recipe row kept no ranks: no interval for it
    table = recipe_tune.intervals(rows, chosen)
    assert [(c["comparison"], c["set"]) for c in table] == [
        ("chosen - starting model", dev) for dev in recipe_tune.DEV_SETS]
    for cell in table:
        mean, lo, hi = (float(x.strip("[],")) for x in cell["top20"].split())
        assert lo <= mean <= hi and mean > 0  # every question ranks its hit earlier, none later
    assert recipe_tune.intervals([chosen], chosen) == []
    stripped = recipe_tune._without_ranks(chosen)
    assert all("ranks" not in stripped[dev] for dev in recipe_tune.DEV_SETS) and "ranks" in chosen["dev_qed"]
