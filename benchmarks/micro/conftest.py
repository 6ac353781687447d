"""Micro-benchmarks of the hot paths under pytest-benchmark, kept apart from the unit tests (``testpaths`` is
``tests``, so a plain ``pytest`` never collects them).

    make microbench                      # runs them, compares with the last saved run, saves this one
    .venv/bin/python -m pytest benchmarks/micro --benchmark-autosave
    .venv/bin/python -m pytest benchmarks/micro --benchmark-compare --benchmark-compare-fail=median:25%

Saved runs go to ``.benchmarks/`` (ignored by git), one folder per machine/interpreter. Everything is timed on one
thread so that a run on a shared machine compares with the next; every benchmark also checks its result, so a
speed-up that breaks the answer fails instead of showing as a win. Data is small, synthetic or the committed
samples under ``tests/data``, and built once per session.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
sys.path.insert(0, str(REPO / "tests"))  # tiny_models


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
    yield


def read_jsonl(path: Path) -> list[dict]:
    import json

    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="session")
def squad_passages() -> list[dict]:
    """120 SQuAD dev paragraphs with titles (``tests/data/sparse_squad_passages.jsonl``)."""
    return read_jsonl(DATA / "sparse_squad_passages.jsonl")


@pytest.fixture(scope="session")
def squad_questions() -> list[dict]:
    """240 questions on those paragraphs, each with its answers and ``gold_passage_id``."""
    return read_jsonl(DATA / "sparse_squad_questions.jsonl")
