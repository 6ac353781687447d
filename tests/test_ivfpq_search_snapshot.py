"""The compiled IVF-PQ search gives, bit for bit, the results it gave when the snapshot was taken
(tests/data/ivfpq/search_snapshot.json: scripts/ivfpq_search_snapshot.py's reduced grid, saved with
``python scripts/ivfpq_search_snapshot.py save --small tests/data/ivfpq/search_snapshot.json``). A change meant to
keep the results (a refactoring, a faster kernel) must pass it unchanged; one meant to change them saves the snapshot
again and says why in its commit."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from compiled_extension import extension

import fastdpr

_C = extension("IVFPQ")
pytestmark = pytest.mark.skipif(_C is None, reason="compiled extension not built")

ROOT = Path(__file__).resolve().parent.parent
SAVED = ROOT / "tests" / "data" / "ivfpq" / "search_snapshot.json"


def script():
    spec = importlib.util.spec_from_file_location("ivfpq_search_snapshot", ROOT / "scripts" / "ivfpq_search_snapshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_search_results_match_the_snapshot():
    snap = script()
    saved = json.loads(SAVED.read_text())
    if not fastdpr.cpu_features().get(saved["level"]):
        pytest.skip(f"{saved['level']} (the snapshot's level): this CPU cannot run it")
    now = snap.digests(snap.snapshot(small=True, level=saved["level"]))
    total, differ = snap.differences(saved, now)
    assert total == len(saved) - 1 > 200
    assert not differ, f"{len(differ)} of {total} searches changed, e.g. {differ[:5]}"


def test_a_changed_search_is_reported():
    """The comparison can fail: one changed score byte, one missing search."""
    snap = script()
    saved = json.loads(SAVED.read_text())
    changed = dict(saved)
    key = sorted(k for k in saved if k != "level")[3]
    changed[key] = "0" * 64
    assert snap.differences(saved, changed)[1] == [key]
    del changed[key]
    assert snap.differences(saved, changed)[1] == [key]
    with pytest.raises(ValueError, match="different SIMD levels"):
        snap.differences(saved, dict(saved, level="scalar"))
