"""The layer rules of docs/architecture.md §1, read from the document itself (so the two cannot drift apart) and
checked on every import statement of every fastdpr module (at module level or inside functions alike):

- imports point down the layer table, never up (a package may import its own modules freely);
- the index core ``fastdpr._C`` is imported from ``index/`` only, the model kernels ``fastdpr.models._kernels_C``
  from ``models/`` only, and models know nothing of indexes;
- the exceptions the document names (``from`` → ``to``) and no others.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fastdpr"
DOC = ROOT / "docs" / "architecture.md"
# the compiled modules and the table entry each belongs to (docs/architecture.md §1: the index core is part of
# index/, the model kernels of models/)
EXTENSIONS = {"fastdpr._C": "index/", "fastdpr._cpu": "_cpu", "fastdpr.models._kernels_C": "models/"}


def _section_1() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## 1. Layers")
    return text[start:text.index("\n## 2.", start)]


def layer_table() -> dict[str, int]:
    """{package or file as the table writes it (``models/``, ``cli.py``, ``_C``): layer number}."""
    table = {}
    for line in _section_1().splitlines():
        m = re.match(r"\|\s*(\d+)\.[^|]*\|([^|]*)\|", line)
        if m:
            for entry in re.findall(r"`([^`]+)`", m.group(2)):
                table[entry] = int(m.group(1))
    return table


def exceptions() -> set[tuple[str, str]]:
    """The imports the document allows against the table: (`from`, `to`) pairs written `a` → `b`."""
    return set(re.findall(r"`([^`]+)` → `([^`]+)`", _section_1()))


def entry_of(module: str, table: dict[str, int]) -> str | None:
    """The table entry a dotted fastdpr module belongs to (None: not in the table)."""
    if module in EXTENSIONS:
        inner = EXTENSIONS[module]
        return inner if inner in table else None
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py" if "__init__.py" in table else None
    for candidate in (parts[0] + "/", parts[0] + ".py", parts[0]):
        if candidate in table:
            return candidate
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, text: str) -> list[tuple[int, str]]:
    """(line, dotted module) for every fastdpr import in the file; `from fastdpr.x import y` counts as
    fastdpr.x.y when y is a module of the tree (or a compiled one), else as fastdpr.x."""
    tree = ast.parse(text, filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "fastdpr"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "fastdpr":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                rel = Path(*full.split("."))
                is_module = full in EXTENSIONS or (ROOT / rel).is_dir() or (ROOT / rel).with_suffix(".py").exists()
                found.append((node.lineno, full if is_module else base))
    return found


def violations(extra: dict[Path, str] | None = None) -> list[str]:
    """Every broken rule, one line each; ``extra``: more files (path in the tree: source) to check as well."""
    table, allowed = layer_table(), exceptions()
    problems = []
    files = {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))} | (extra or {})
    for path, text in files.items():
        here = module_name(path)
        rel = path.relative_to(PACKAGE).as_posix()
        own = entry_of(here, table)
        if own is None:
            problems.append(f"fastdpr/{rel}: in no layer of docs/architecture.md §1")
            continue
        for line, target in imports_of(path, text):
            where = f"fastdpr/{rel}:{line} imports {target}"
            theirs = entry_of(target, table)
            if theirs is None:
                problems.append(f"{where}: in no layer of docs/architecture.md §1")
                continue
            if (rel, theirs) in allowed or (own, theirs) in allowed or \
                    (rel, target.removeprefix("fastdpr.").replace(".", "/") + ".py") in allowed:
                continue
            if target == "fastdpr._C" and own != "index/":
                problems.append(f"{where}: the index core is reached from index/ only")
            if target == "fastdpr.models._kernels_C" and own != "models/":
                problems.append(f"{where}: the model kernels are reached from models/ only")
            if own == "models/" and theirs == "index/":
                problems.append(f"{where}: models know nothing of indexes")
            if own != theirs and table[theirs] < table[own]:
                problems.append(f"{where}: layer {table[own]} ({own}) imports layer {table[theirs]} ({theirs})")
    return problems


def test_the_table_is_read_from_the_document():
    table = layer_table()
    # every layer has entries, and the ones the rules below name are there
    assert sorted(set(table.values())) == list(range(min(table.values()), max(table.values()) + 1))
    for entry in ("index/", "models/", "cli.py", "__init__.py", "_cpu"):
        assert entry in table, entry


def test_every_module_follows_the_layer_rules():
    problems = violations()
    assert not problems, "\n".join(problems)


def test_a_violation_is_found():
    """The check can fail: a models/ module that imports the index core and a command breaks three rules."""
    probe = PACKAGE / "models" / "probe.py"
    source = "def f():\n    from fastdpr import _C\n    from fastdpr.commands import bench\n"
    problems = [p for p in violations({probe: source}) if "models/probe.py" in p]
    assert any("index/ only" in p for p in problems), problems
    assert any("models know nothing of indexes" in p for p in problems), problems
    assert any("imports layer 1" in p for p in problems), problems
