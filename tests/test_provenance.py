"""Stage cache keys name the code as well as the settings (fastdpr/quickstart/provenance.py)."""
import importlib.machinery

from fastdpr.quickstart import provenance
from fastdpr.quickstart.provenance import code_digest, package_digest, provenance_key, tree_digest
from fastdpr.quickstart.runner import StageRunner


def _tree(root):
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    ext = root / f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"\x7fELF compiled")
    return root / "pkg", ext


def test_a_changed_source_byte_or_extension_byte_changes_the_digest(tmp_path):
    root, ext = _tree(tmp_path)
    before = tree_digest(root, [ext])
    assert tree_digest(root, [ext]) == before  # same inputs, same digest
    (root / "sub" / "mod.py").write_text("def f():\n    return 3\n")
    changed_source = tree_digest(root, [ext])
    assert changed_source != before
    ext.write_bytes(b"\x7fELF compiled!")
    assert tree_digest(root, [ext]) not in (before, changed_source)
    (root / "sub" / "new.py").write_text("")  # a new (even empty) module counts too
    assert len({before, changed_source, tree_digest(root, [ext])}) == 3


def test_the_key_changes_with_settings_stage_code_and_package(tmp_path, monkeypatch):
    script = tmp_path / "bench.py"
    script.write_text("STEPS = 10\n")
    key = provenance_key({"steps": 10}, code=[script])
    assert provenance_key({"steps": 10}, code=[script]) == key
    assert provenance_key({"steps": 11}, code=[script]) != key
    script.write_text("STEPS = 11\n")
    assert provenance_key({"steps": 10}, code=[script]) != key
    script.write_text("STEPS = 10\n")
    assert provenance_key({"steps": 10}, code=[script]) == key
    monkeypatch.setattr(provenance, "package_digest", lambda: "another build")
    assert provenance_key({"steps": 10}, code=[script]) != key


def test_the_package_digest_covers_the_installed_package_and_is_computed_once():
    assert package_digest() == package_digest()
    assert package_digest.cache_info().misses <= 1
    root = provenance._package_root()
    assert (root / "quickstart" / "provenance.py").is_file()
    assert tree_digest(root, provenance._extension_files(root)) == package_digest()
    assert code_digest(test_the_package_digest_covers_the_installed_package_and_is_computed_once) == \
        code_digest(__file__)


def test_a_cached_stage_is_reused_until_its_code_changes(tmp_path, monkeypatch):
    calls = []

    def stage():
        calls.append(1)
        return {"n": len(calls)}

    def runner():
        return StageRunner(tmp_path, {"steps": 3}, log=lambda line: None)

    first = runner()
    assert first.stage("a", stage) == {"n": 1} and first.redone == ["a"]
    again = runner()
    assert again.stage("a", stage) == {"n": 1} and len(calls) == 1  # nothing changed: reused
    assert again.redone == []
    monkeypatch.setattr(provenance, "package_digest", lambda: "the library changed")
    assert runner().stage("a", stage) == {"n": 2} and len(calls) == 2
    assert StageRunner(tmp_path, {"steps": 4}, log=lambda line: None).stage("a", stage) == {"n": 3}
