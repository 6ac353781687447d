"""The FAISS adapter against exact search, and ``fastdpr index`` building from encoder shards."""
from __future__ import annotations

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index import build_index, load_index
from fastdpr.index.flat import exact_search
from fastdpr.index.synthetic import gaussian_mixture, recall_at


@pytest.fixture(scope="module")
def data():
    x, q = gaussian_mixture(3000, 32, n_queries=30, seed=13)
    return x, q, exact_search(x, q, 50)


def test_faiss_flat_equals_flat(data):
    pytest.importorskip("faiss")
    x, q, (ref_s, ref_i) = data
    s, i = build_index(x, "faiss:Flat").search(q, 50)
    np.testing.assert_allclose(s, ref_s, rtol=1e-4, atol=1e-4)
    assert (i == ref_i).mean() > 0.99


def test_faiss_hnsw_and_ivf_params_and_round_trip(data, tmp_path):
    pytest.importorskip("faiss")
    x, q, (_, ref_i) = data
    hnsw = build_index(x, "faiss:HNSW16,Flat")
    assert recall_at(hnsw.search(q, 50, ef=256)[1], ref_i, 50) > 0.8
    ivf = build_index(x, "faiss:IVF16,Flat")  # trained by build_index
    assert recall_at(ivf.search(q, 50, nprobe=16)[1], ref_i, 50) > 0.99
    path = ivf.save(tmp_path / "f.fdpr")
    again = load_index(path)
    assert again.kind == "faiss" and len(again) == len(x)
    np.testing.assert_array_equal(again.search(q, 10, nprobe=4)[1], ivf.search(q, 10, nprobe=4)[1])
    s, i = build_index(x[:3], "faiss:Flat").search(q[:1], 5)
    assert (i[0, 3:] == -1).all() and np.isneginf(s[0, 3:]).all()
    with pytest.raises(InputError):
        build_index(x, "faiss:NoSuchThing")


def test_fastdpr_index_command(tmp_path):
    from fastdpr.cli import main
    from fastdpr.data import Corpus
    from fastdpr.encode import encode_corpus, load_vectors
    from tiny_models import tiny_biencoder

    passages = [{"id": f"p{i}", "title": f"t{i % 7}", "text": " ".join(["river", "king", "city", "war"][j % 4]
                 for j in range(i % 13 + 1))} for i in range(45)]
    model = tiny_biencoder(tmp_path / "m", pooling="mean", similarity="dot", max_passage_length=32)
    vec_dir = tmp_path / "vectors"
    encode_corpus(model, Corpus.from_passages(passages), vec_dir, batch_size=8, dtype="float16", shard_size=10,
                  show_progress=False)
    vectors, ids = load_vectors(vec_dir)
    q = np.asarray(vectors[:5], dtype=np.float32)
    for spec in ("flat", "hnsw,M=8,efc=32"):
        out = tmp_path / f"index-{spec.split(',')[0]}"
        assert main(["index", str(vec_dir), "-o", str(out), "--spec", spec, "--no-progress"]) == 0
        index = load_index(out)
        assert len(index) == 45 and index.dim == vectors.shape[1]
        k = 10 if spec.startswith("hnsw") else 45  # a graph need not reach every node; its top 10 must be right
        s, i = index.search(q, k)
        ref_s, ref_i = exact_search(np.asarray(vectors, np.float32), q, k)
        np.testing.assert_allclose(s, ref_s, rtol=1e-3, atol=1e-3)
        assert recall_at(i, ref_i, k) == 1.0
    assert main(["index", str(tmp_path / "missing"), "-o", str(tmp_path / "x"), "--spec", "flat"]) != 0
    assert main(["index", str(vec_dir), "-o", str(tmp_path / "x"), "--spec", "hnsw,bogus=1"]) != 0
