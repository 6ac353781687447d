"""Index files written before the list store was split out of IVFPQ (tests/data/ivfpq/*.fdpr, written by the code
of that time with ``python tests/test_ivfpq_file_compat.py write tests/data/ivfpq``) still load, byte for byte the
same state, and answer the same searches: the file format did not change.

The expected answers were saved beside the files by the same code, at SIMD level avx2 (the re-rank's sums differ
by level)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from compiled_extension import extension

import fastdpr
from fastdpr.index import fileformat
from fastdpr.index import load_index
from fastdpr.index.ivfpq import IVFPQIndex

_C = extension("IVFPQ")
pytestmark = pytest.mark.skipif(_C is None, reason="compiled extension not built")

DATA = Path(__file__).resolve().parent / "data" / "ivfpq"
ROOT = Path(__file__).resolve().parent.parent
LEVEL = "avx2"
# name: index settings; each answers the same queries with rerank 30 (4-bit rows first where it has them)
FILES = {
    "pq8-fp16": dict(nbits=8, store="fp16", exact=0),
    "pq4-sq4-fp32": dict(nbits=4, store="fp32", sq=4, exact=12),
    "pq4-none-sq4": dict(nbits=4, store="none", sq=4, exact=0),
}


def data(seed: int = 7, n: int = 400, d: int = 16):
    rng = np.random.default_rng(seed)
    centres = 2 * rng.standard_normal((6, d)).astype(np.float32)
    x = centres[rng.integers(0, 6, n)] + rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((25, d)).astype(np.float32)
    return x, q


def answers(index, q, exact):
    params = dict(nprobe=3, rerank=30, threads=1, spread=0.5)
    if exact:
        params["exact"] = exact
    return index.search(q, 8, **params)


def write(out: Path) -> None:
    """The files and their answers (run with the code whose format is to be kept)."""
    x, q = data()
    with at_level(LEVEL):
        write_at_level(out, x, q)


def write_at_level(out: Path, x, q) -> None:
    for name, p in FILES.items():
        index = IVFPQIndex(16, nlist=6, m=4, nbits=p["nbits"], store=p["store"], sq=p.get("sq", 0), niter=4,
                           pq_niter=4, backend="compiled")
        index.train(x)
        index.add(x[:250], ids=np.arange(250) * 3)
        index.add(x[250:], ids=np.arange(250, len(x)) * 3)  # two adds: the lists were laid out twice
        index.save(out / f"{name}.fdpr")
        scores, ids = answers(index, q, p["exact"])
        np.savez(out / f"{name}.answers.npz", scores=scores, ids=ids)


def at_level(level: str):
    """scripts/ivfpq_search_snapshot.py's switch of the kernels' CPU level."""
    spec = importlib.util.spec_from_file_location("ivfpq_search_snapshot", ROOT / "scripts" / "ivfpq_search_snapshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.at_level(level)


@pytest.fixture(autouse=True)
def at_snapshot_level():
    if not fastdpr.cpu_features().get(LEVEL):
        pytest.skip(f"{LEVEL}: this CPU cannot run it")
    with at_level(LEVEL):
        yield


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("mmap", [False, True])
def test_old_files_load_and_answer_as_before(name, mmap):
    index = load_index(DATA / f"{name}.fdpr", mmap=mmap)
    want = np.load(DATA / f"{name}.answers.npz")
    scores, ids = answers(index, data()[1], FILES[name]["exact"])
    np.testing.assert_array_equal(ids, want["ids"])
    assert scores.tobytes() == want["scores"].tobytes()


@pytest.mark.parametrize("name", FILES)
def test_old_files_are_written_back_byte_for_byte(name, tmp_path):
    """Loading and saving again gives the same sections: the list store writes what it read."""
    index = load_index(DATA / f"{name}.fdpr")
    path = index.save(tmp_path / "again.fdpr")
    old, new = fileformat.PyReader(DATA / f"{name}.fdpr"), fileformat.PyReader(path)
    assert new.names() == old.names() and new.meta_items() == old.meta_items()
    for section in old.names():
        assert new.section(section).tobytes() == old.section(section).tobytes(), section


if __name__ == "__main__" and sys.argv[1:2] == ["write"]:
    write(Path(sys.argv[2]))
