"""benchmarks/ann_scale.py: a work folder keeps the settings its rows were generated with and refuses others."""
import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
ann_scale = pytest.importorskip("ann_scale")


def _args(work, **over):
    a = {"work": str(work), "n": 5000, "dim": 32, "seed": 0, "profile": "minilm-mean", "queries": 100}
    return argparse.Namespace(**(a | over))


def test_the_first_run_keeps_its_settings_and_the_same_settings_go_on(tmp_path):
    ann_scale.check_settings(_args(tmp_path))
    kept = json.loads((tmp_path / "settings.json").read_text())
    assert kept == {"n": 5000, "dim": 32, "seed": 0, "profile": "minilm-mean", "queries": 100}
    ann_scale.check_settings(_args(tmp_path))  # a resumed run with the same settings


def test_another_profile_in_the_same_folder_is_refused_by_name(tmp_path):
    ann_scale.check_settings(_args(tmp_path))
    with pytest.raises(SystemExit, match="--profile 'minilm-mean-growth' \\(the folder holds 'minilm-mean'\\)"):
        ann_scale.check_settings(_args(tmp_path, profile="minilm-mean-growth"))


def test_the_generator_draws_the_profile_asked_for(tmp_path):
    a = _args(tmp_path, n=300, dim=16, profile="minilm-mean-growth")
    g = ann_scale.generator(a)
    assert g.profile.name == "minilm-mean-growth"
