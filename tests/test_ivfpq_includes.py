"""The IVF-PQ search stages know nothing of the index class: no source of the search (csrc/ivfpq_search.*,
ivfpq_scan.cpp, ivfpq_rerank.cpp) reaches csrc/ivfpq.h through its includes, directly or through another header,
and the list store does not either (csrc/ivf_lists.*)."""
from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
STAGES = ("ivfpq_search.h", "ivfpq_search.cpp", "ivfpq_scan.cpp", "ivfpq_rerank.cpp", "ivf_lists.h", "ivf_lists.cpp")


def reached(source: str) -> set[str]:
    """Every project header `source` includes, directly or through others."""
    seen: set[str] = set()
    todo = [source]
    while todo:
        text = (CSRC / todo.pop()).read_text()
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, flags=re.M):
            if name not in seen and (CSRC / name).exists():
                seen.add(name)
                todo.append(name)
    return seen


def test_the_search_stages_do_not_include_the_index_class():
    for source in STAGES:
        assert "ivfpq.h" not in reached(source), source


def test_the_walk_follows_includes_through_headers():
    """It can fail: the index class's own source reaches the stages' header, and through it the list store."""
    assert {"ivfpq.h", "ivfpq_search.h", "ivf_lists.h", "io.h"} <= reached("ivfpq.cpp")
