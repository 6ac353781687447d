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


# ---------------------------------------------------------------------------------------------------------------
# no import circles: a module that imports a module that imports it back works only while the imports run in a
# lucky order (one of them inside a function, run late); every import counts, wherever it is, so a circle cannot
# hide behind one moved into a function


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def run_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at module level, in classes and in functions alike; not those under
    ``if TYPE_CHECKING:`` (never run; they name types for annotations only)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(extra: dict[Path, str] | None = None) -> dict[str, set[str]]:
    """{module: the fastdpr modules of the tree it imports}; ``extra``: more files (path: source). ``from
    fastdpr.a import b`` points at the module ``fastdpr.a.b`` when there is one, else at ``fastdpr.a``."""
    files = {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))} | (extra or {})
    modules = {module_name(path) for path in files}
    graph = {}
    for path, text in files.items():
        here = module_name(path)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        targets = set()
        for node in run_imports(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                # a compiled module (fastdpr._C, ...) is a leaf: it imports nothing of the tree
                targets.add(full if full in modules or full in EXTENSIONS else base)
        graph[here] = {t for t in targets if t in modules and t != here}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles (``[a, b, ..., a]``) of each group of modules that import one another, a shortest one through
    each member (the groups are Tarjan's strongly connected components; iterative, so a deep graph cannot exhaust
    the stack)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(set(group))
    cycles, seen = [], set()
    for group in groups:
        for start in sorted(group):  # a shortest circle through each member, each circle once
            cycle = _cycle_through(start, group, graph)
            if frozenset(cycle) not in seen:
                seen.add(frozenset(cycle))
                cycles.append(cycle)
    return cycles


def _cycle_through(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from ``start`` back to itself, inside its group."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


def test_no_module_imports_itself_back():
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles:\n" + \
        "\n".join(" -> ".join(c) for c in cycles)


def test_an_import_circle_is_found():
    """The check can fail: two probe modules importing each other are a circle, three in a ring are one, and so is
    a pair held apart by an import inside a function; one of a pair importing the other under ``if TYPE_CHECKING``
    is not."""
    probes = {
        PACKAGE / "index" / "probe_a.py": "from fastdpr.index import probe_b\n",
        PACKAGE / "index" / "probe_b.py": "import fastdpr.index.probe_a\n",
        PACKAGE / "data" / "probe_c.py": "from .probe_d import x\n",
        PACKAGE / "data" / "probe_d.py": "try:\n    from fastdpr.data.probe_e import y\nexcept ImportError:\n    pass\n",
        PACKAGE / "data" / "probe_e.py": "class C:\n    from fastdpr.data import probe_c\n",
        PACKAGE / "eval" / "probe_f.py": "from fastdpr.eval.probe_g import g\n",
        PACKAGE / "eval" / "probe_g.py": "def g():\n    from fastdpr.eval import probe_f\n",
        PACKAGE / "sparse" / "probe_h.py": "import fastdpr.sparse.probe_i\n",
        PACKAGE / "sparse" / "probe_i.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from fastdpr.sparse import probe_h\n"),
    }
    cycles = import_cycles(import_graph(probes))
    assert ["fastdpr.index.probe_a", "fastdpr.index.probe_b", "fastdpr.index.probe_a"] in cycles, cycles
    assert ["fastdpr.data.probe_c", "fastdpr.data.probe_d", "fastdpr.data.probe_e", "fastdpr.data.probe_c"] in cycles
    assert ["fastdpr.eval.probe_f", "fastdpr.eval.probe_g", "fastdpr.eval.probe_f"] in cycles, cycles
    assert not [c for c in cycles if any("probe_h" in m or "probe_i" in m for m in c)], cycles
