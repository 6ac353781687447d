"""The disk builder (fastdpr/index/disk_build.py): its file equals an in-memory index built from the same trained
state, every stage resumes, and bad input is refused with a message that names it."""
import json

import numpy as np
import pytest

from fastdpr.errors import InputError
from fastdpr.index import fileformat, load_index
from fastdpr.index.disk_build import ADDED, PARTIAL, STATE, TRAINED, IVFPQDiskBuilder

pytest.importorskip("fastdpr._C")  # 4-bit codes and rows are built by the compiled core

SPEC = "ivfpq,nlist=8,nbits=4,m=6,sq=4,niter=4"


def data(seed, n=1500, d=24):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * rng.uniform(0.5, 2.0, (n, 1))).astype(np.float32)


def build(tmp_path, x, spec=SPEC, pieces=(0.3, 0.5), checkpoint_every=10_000, stop_before_finish=False):
    b = IVFPQDiskBuilder(tmp_path / "x.fdpr", x.shape[1], spec)
    cuts = [0, *(int(p * len(x)) for p in pieces), len(x)]
    for lo, hi in zip(cuts, cuts[1:]):
        b.append(x[lo:hi])
    b.train(show_progress=False)
    b.add(chunk=257, checkpoint_every=checkpoint_every, show_progress=False)
    return b if stop_before_finish else b.finish()


def reference(b, x):
    """The in-memory index the builder's checkpoint stands for: its trained state plus every row."""
    ref = load_index(b.dir / TRAINED)
    ref.add(x.astype(np.float16))
    return ref


@pytest.mark.parametrize("seed", [0, 1])
def test_the_file_is_the_in_memory_index_plus_the_fp16_rows(tmp_path, seed):
    x = data(seed)
    b = build(tmp_path, x, stop_before_finish=True)
    ref = reference(b, x)
    ref_path = ref.save(tmp_path / "ref.fdpr")
    path = b.finish()
    assert not b.dir.exists()
    got, want = fileformat.PyReader(path), fileformat.PyReader(ref_path)
    assert sorted(got.names()) == sorted(want.names() + ["vectors"])
    for name in want.names():
        if name != "meta":
            assert bytes(got.section(name)) == bytes(want.section(name)), name
    index = load_index(path, mmap=True)
    assert index.store == "fp16" and len(index) == len(x)
    np.testing.assert_array_equal(index.stored_vectors(), x.astype(np.float16))
    q = data(seed + 10, n=13)
    rows = x.astype(np.float16).astype(np.float32)
    for nprobe in (1, 3, 8):
        # the same candidates by their codes; the file's index then scores the best 40 of them on its fp16 rows
        _, cand = ref.search(q, 40, nprobe=nprobe, rerank=0, exact=0)
        exact = np.einsum("qd,qkd->qk", q, rows[cand])
        order = np.argsort(-exact, axis=1, kind="stable")[:, :10]
        scores, ids = index.search(q, 10, nprobe=nprobe, rerank=40, exact=0)
        np.testing.assert_array_equal(ids, np.take_along_axis(cand, order, 1))
        np.testing.assert_allclose(scores, np.take_along_axis(exact, order, 1), rtol=1e-5, atol=1e-5)

def test_a_build_interrupted_at_every_stage_gives_the_same_file(tmp_path):
    x = data(2)
    whole = build(tmp_path / "a", x).read_bytes()

    path = tmp_path / "b" / "x.fdpr"
    b = IVFPQDiskBuilder(path, x.shape[1], SPEC)
    b.append(x[:600])
    with open(b.dir / PARTIAL, "ab") as fh:  # a killed append: bytes past the last recorded row
        fh.write(b"\x7f" * 1000)
    b = IVFPQDiskBuilder(path, x.shape[1], SPEC)
    assert b.rows == 600
    b.append(x[600:])
    b.train(show_progress=False)
    b = IVFPQDiskBuilder(path, x.shape[1], SPEC)
    assert b.is_trained
    b.add(chunk=257, checkpoint_every=500, show_progress=False)
    # a kill after a checkpoint was saved but before the state said so: the checkpoint counts
    state = json.loads((b.dir / STATE).read_text())
    state["added"] = 514
    (b.dir / STATE).write_text(json.dumps(state))
    b = IVFPQDiskBuilder(path, x.shape[1], SPEC)
    b.add(chunk=257, checkpoint_every=500, show_progress=False)
    assert len(load_index(b.dir / ADDED)) == len(x)
    assert b.finish().read_bytes() == whole


def test_rows_come_before_adding(tmp_path):
    x = data(3)
    b = build(tmp_path, x[:900], pieces=(), stop_before_finish=True)
    with pytest.raises(InputError, match="rows come before add"):
        b.append(x[900:])
    assert b.added == 900


def test_bad_input_is_refused_with_what_is_wrong(tmp_path):
    b = IVFPQDiskBuilder(tmp_path / "x.fdpr", 8, SPEC.replace("m=6", "m=4"))
    with pytest.raises(InputError, match=r"shape \(n, 8\)"):
        b.append(np.zeros((3, 7), np.float32))
    bad = np.ones((4, 8), np.float32)
    bad[2, 5] = np.nan
    with pytest.raises(InputError, match="row 2 .*NaN"):
        b.append(bad)
    big = np.ones((4, 8), np.float32)
    big[3, 0] = 1e6
    with pytest.raises(InputError, match="row 3 .*float16"):
        b.append(big)
    with pytest.raises(InputError, match="floating point"):
        b.append(np.ones((2, 8), np.int32))
    assert b.rows == 0
    with pytest.raises(InputError, match="no rows"):
        b.train()
    b.append(np.ones((300, 8), np.float32))
    with pytest.raises(InputError, match="train first"):
        b.add()
    with pytest.raises(InputError, match="call add"):
        b.finish()
    with pytest.raises(InputError, match="not dim=16"):
        IVFPQDiskBuilder(tmp_path / "x.fdpr", 16, SPEC.replace("m=6", "m=4"))
    with pytest.raises(InputError, match="ivfpq indexes, not 'flat'"):
        IVFPQDiskBuilder(tmp_path / "y.fdpr", 8, "flat")
    with pytest.raises(InputError, match="fp16"):
        IVFPQDiskBuilder(tmp_path / "y.fdpr", 8, "ivfpq,store=fp32")
    with pytest.raises(InputError, match="dim must be"):
        IVFPQDiskBuilder(tmp_path / "y.fdpr", 0)


def test_fastdpr_index_on_disk_streams_the_shards_and_resumes(tmp_path, capsys):
    from fastdpr.cli import main
    from fastdpr.encode import iter_vector_shards, load_vectors, read_manifest
    from tiny_models import tiny_vector_shards

    vec_dir = tiny_vector_shards(tmp_path)
    vectors, _ = load_vectors(vec_dir)
    spec = "ivfpq,nbits=4,nlist=8,sq=4"
    whole = tmp_path / "whole.fdpr"
    assert main(["index", str(vec_dir), "-o", str(whole), "--spec", spec, "--on-disk", "--no-progress"]) == 0
    assert "fp16 rows on disk" in capsys.readouterr().out
    index = load_index(whole, mmap=True)
    np.testing.assert_array_equal(index.stored_vectors(), np.asarray(vectors, np.float16))
    assert index.model_fingerprint == read_manifest(vec_dir)["model_fingerprint"]

    # an earlier run that stopped after its first shard: the command goes on from there, to the same file
    part = tmp_path / "part.fdpr"
    b = IVFPQDiskBuilder(part, vectors.shape[1], spec)
    b.append(next(iter(iter_vector_shards(vec_dir))).vectors)
    assert main(["index", str(vec_dir), "-o", str(part), "--spec", spec, "--on-disk", "--no-progress"]) == 0
    assert part.read_bytes() == whole.read_bytes()

    assert main(["index", str(vec_dir), "-o", str(tmp_path / "f.fdpr"), "--spec", "flat", "--on-disk"]) == 2
    assert "ivfpq indexes, not 'flat'" in capsys.readouterr().err
