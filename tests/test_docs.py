"""Code cites docs/architecture.md by section (``docs/architecture.md §4.3``); every cited section must exist."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
CITATION = re.compile(r"docs/architecture\.md §(\d+(?:\.\d+)?)")


def _sections() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    top = set(re.findall(r"^## (\d+)\. ", text, re.M))
    sub = set(re.findall(r"^\*\*(\d+\.\d+) ", text, re.M))
    return top | sub


def test_every_cited_section_exists():
    sections = _sections()
    assert {"1", "2", "3", "4", "4.1", "4.9"} <= sections
    cited = {}
    for path in [*REPO.glob("fastdpr/**/*.py"), *REPO.glob("tests/*.py"), *REPO.glob("benchmarks/**/*.py"),
                 *REPO.glob("csrc/*")]:
        for number in CITATION.findall(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(number, []).append(path.relative_to(REPO).as_posix())
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, f"citations of sections docs/architecture.md does not have: {missing}"
    assert cited, "nothing cites docs/architecture.md"
