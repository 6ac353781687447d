"""``index_from_vectors``: a vectors directory or an array to an index file carrying the model fingerprint, and
``fastdpr index`` (its command) in a Python where torch cannot be imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index import build_index, index_from_vectors, load_index

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def vec_dir(tmp_path_factory):
    from tiny_models import tiny_vector_shards

    return tiny_vector_shards(tmp_path_factory.mktemp("vectors"), n=400, shard_size=150)


def _manifest(vec_dir) -> dict:
    return json.loads((vec_dir / "manifest.json").read_text())


def test_a_directory_becomes_an_index_with_its_fingerprint(vec_dir, tmp_path):
    from fastdpr.data.vectors import load_vectors

    built = index_from_vectors(vec_dir, "flat", tmp_path / "index.fdpr")
    fingerprint = _manifest(vec_dir)["model_fingerprint"]
    assert fingerprint and built.fingerprint == fingerprint
    assert (built.kind, built.count, built.dim) == ("flat", 400, _manifest(vec_dir)["dim"])
    index = load_index(built.path)
    assert index.model_fingerprint == fingerprint
    # the same index as one built from all the vectors at once (three shards streamed in)
    vectors, _ = load_vectors(vec_dir)
    queries = np.asarray(vectors[::25], dtype=np.float32)
    s, i = index.search(queries, k=7)
    s_ref, i_ref = build_index(vectors, "flat").search(queries, k=7)
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(s, s_ref, rtol=1e-6)


def test_a_fingerprint_other_than_the_vectors_is_refused(vec_dir, tmp_path):
    with pytest.raises(InputError, match="another model") as err:
        index_from_vectors(vec_dir, "flat", tmp_path / "index.fdpr", fingerprint="0123456789abcdef")
    assert str(vec_dir) in str(err.value)
    assert not (tmp_path / "index.fdpr").exists()
    # the vectors' own fingerprint, given, is accepted
    own = _manifest(vec_dir)["model_fingerprint"]
    assert index_from_vectors(vec_dir, "flat", tmp_path / "same.fdpr", fingerprint=own).fingerprint == own


def test_an_array_with_ids_and_a_fingerprint(tmp_path):
    x = np.random.default_rng(3).standard_normal((300, 16)).astype(np.float16)
    ids = np.arange(1000, 1300)
    built = index_from_vectors(x, "ivfpq,nlist=4,m=4,store=fp16", str(tmp_path / "dir") + "/", ids=ids,
                               fingerprint="feedfacecafebeef", train_size=280)
    assert built.path == tmp_path / "dir" / "index.fdpr"
    index = load_index(built.path)
    assert index.model_fingerprint == "feedfacecafebeef" and len(index) == 300
    _, found = index.search(x[5].astype(np.float32), k=1, nprobe=4, rerank=50)
    assert found[0, 0] == 1005


def test_tuning_and_on_disk(vec_dir, tmp_path):
    built = index_from_vectors(vec_dir, "ivfpq,nbits=4,nlist=8,store=fp16", tmp_path / "tuned.fdpr",
                               tune_queries=40, target_recall=0.9, tune_k=10)
    assert built.tuned is not None and built.tuned.queries == 40
    assert load_index(built.path).tuned["k"] == 10
    disk = index_from_vectors(vec_dir, "ivfpq,nlist=4,m=4,store=fp16", tmp_path / "disk.fdpr", on_disk=True)
    assert disk.index is None and load_index(disk.path, mmap=True).model_fingerprint == disk.fingerprint


@pytest.mark.parametrize("call, message", [
    (lambda d, t: index_from_vectors(np.zeros((0, 8), np.float32), "flat", t), "no vectors"),
    (lambda d, t: index_from_vectors(d, "flat", t, ids=[1, 2]), "ids"),
    (lambda d, t: index_from_vectors(d, "flat", t, train_size=0), "train_size"),
    (lambda d, t: index_from_vectors(d, "flat", t, fingerprint=""), "fingerprint"),
    (lambda d, t: index_from_vectors(d, "hnsw,M=8", t, tune_queries=5), "not tuned"),
    (lambda d, t: index_from_vectors(d, "ivfpq,nlist=4", t, tune_queries=np.zeros((3, 5))), "tune_queries"),
    (lambda d, t: index_from_vectors(d, "ivfpq,store=fp16", t, tune_queries=5, on_disk=True), "on_disk"),
    (lambda d, t: index_from_vectors(d.parent / "missing", "flat", t), "manifest"),
])
def test_bad_input_is_named(vec_dir, tmp_path, call, message):
    with pytest.raises(InputError, match=message):
        call(vec_dir, tmp_path / "bad.fdpr")
    assert not (tmp_path / "bad.fdpr").exists()


# torch made unimportable: a finder first on sys.meta_path that refuses it (and what would pull it in)
_NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "triton"):
            raise ImportError(f"{name} is blocked here")

sys.meta_path.insert(0, NoTorch())
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("the blocker let torch in")
from fastdpr.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "triton"))
print("loaded:", loaded)
raise SystemExit(code if not loaded else 3)
"""


def test_fastdpr_index_runs_without_torch(vec_dir, tmp_path):
    out = tmp_path / "index.fdpr"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in sys.path if p])}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, "index", str(vec_dir), "-o", str(out), "--spec",
                           "auto", "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "loaded: []" in proc.stdout and "written to" in proc.stdout
    assert load_index(out).model_fingerprint == _manifest(vec_dir)["model_fingerprint"]
