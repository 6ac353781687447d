"""encode_corpus: shards, manifest, resume after interruption (in-process and a real SIGKILL), worker split + merge."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tiny_models import tiny_biencoder

import fastdpr.encode as enc
import fastdpr.data.vectors as vector_files
from fastdpr.data import Corpus
from fastdpr.encode import encode_corpus, iter_vector_shards, load_vectors, merge_shards
from fastdpr.errors import InputError

WORDS = "the of and to in a is was for on that with as by at from city river king france paris war".split()


def make_passages(n=57, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        title = "" if i % 5 == 0 else " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(0, 60))))
        out.append({"id": f"p{i}", "title": title, "text": text})
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_biencoder(tmp_path_factory.mktemp("m"), pooling="mean", similarity="cosine",
                          max_passage_length=48)


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_passages(make_passages())


@pytest.fixture(scope="module")
def reference(model, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    encode_corpus(model, corpus, out, batch_size=8, dtype="float32", shard_size=10, show_progress=False)
    return load_vectors(out)


def test_vectors_ids_and_manifest(model, corpus, reference, tmp_path):
    vectors, ids = reference
    assert ids == corpus.ids
    expected = model.encode_passages(list(corpus), batch_size=3)
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-5)
    manifest = encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float16", shard_size=10,
                             show_progress=False)
    assert manifest["complete"] and manifest["count"] == len(corpus) == 57
    assert [s["count"] for s in manifest["shards"]] == [10] * 5 + [7]
    assert manifest["dim"] == 32 and manifest["dtype"] == "float16"
    assert manifest["pooling"] == "mean" and manifest["similarity"] == "cosine"
    assert manifest["empty_passages"] == sum(1 for p in corpus if not p["title"] and not p["text"].strip())
    # longer than the limit, not merely at it
    assert manifest["truncated"] == sum(model.tokenize_passage_lists([p]).truncated for p in corpus) > 0
    half, ids16 = load_vectors(tmp_path)
    assert half.dtype == np.float16 and ids16 == ids
    np.testing.assert_allclose(half.astype(np.float32), vectors, atol=2e-3)
    starts = [s.row_start for s in iter_vector_shards(tmp_path, verify=True)]
    assert starts == [0, 10, 20, 30, 40, 50]
    # a finished directory reruns as a no-op
    again = encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float16", shard_size=10, show_progress=False)
    assert again["encoded_now"] == 0 and again["count"] == 57


def test_single_shard_is_memory_mapped(model, corpus, tmp_path):
    encode_corpus(model, corpus, tmp_path, shard_size=1000, dtype="float32", show_progress=False)
    vectors, _ = load_vectors(tmp_path)
    assert isinstance(vectors, np.memmap)


def _interrupt_after(monkeypatch, k):
    real = vector_files.write_shard
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        if calls["n"] == k:
            raise KeyboardInterrupt("simulated kill")
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(vector_files, "write_shard", flaky)


def test_resume_after_interruption_equals_uninterrupted_run(model, corpus, reference, tmp_path, monkeypatch):
    _interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float32", shard_size=10, show_progress=False)
    monkeypatch.undo()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["count"] == 20 and not manifest["complete"]
    with pytest.raises(InputError, match="incomplete encoding .20 of 57"):
        load_vectors(tmp_path)
    # what a kill -9 can leave: a half-written temp file (of a writer that is gone, idle for an hour), and a
    # finished shard whose manifest entry never came
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    half = tmp_path / f".shard-00002.npy.{dead.pid}.abc123.tmp"
    half.write_bytes(b"\x93NUMPY half")
    os.utime(half, (time.time() - 3600, time.time() - 3600))
    (tmp_path / "shard-00002.npy").write_bytes(b"garbage from an unrecorded write")
    resumed = encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float32", shard_size=10,
                            show_progress=False)
    assert resumed["encoded_now"] == 37
    vectors, ids = load_vectors(tmp_path, verify=True)
    np.testing.assert_array_equal(vectors, reference[0])
    assert ids == reference[1]
    assert not list(tmp_path.glob(".*.tmp"))


def test_corrupted_recorded_shard_is_encoded_again(model, corpus, reference, tmp_path):
    encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float32", shard_size=10, show_progress=False)
    data = bytearray((tmp_path / "shard-00001.npy").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "shard-00001.npy").write_bytes(bytes(data))
    with pytest.raises(InputError, match="checksum"):
        load_vectors(tmp_path, verify=True)
    again = encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float32", shard_size=10, show_progress=False)
    assert again["encoded_now"] == 10
    np.testing.assert_array_equal(load_vectors(tmp_path, verify=True)[0], reference[0])


def test_a_directory_of_another_run_is_refused(model, corpus, tmp_path):
    encode_corpus(model, corpus, tmp_path, dtype="float32", shard_size=10, show_progress=False)
    with pytest.raises(InputError, match="different run .*dtype"):
        encode_corpus(model, corpus, tmp_path, dtype="float16", shard_size=10, show_progress=False)
    other = tiny_biencoder(tmp_path / "other", pooling="mean", similarity="cosine", max_passage_length=48, seed=5)
    with pytest.raises(InputError, match="model_fingerprint"):
        encode_corpus(other, corpus, tmp_path, dtype="float32", shard_size=10, show_progress=False)
    with pytest.raises(InputError, match="corpus_rows"):
        encode_corpus(model, Corpus.from_passages(make_passages(30)), tmp_path, dtype="float32", shard_size=10,
                      show_progress=False)
    with pytest.raises(InputError, match="precision: 'fp32' there vs 'bf16' now"):
        encode_corpus(model, corpus, tmp_path, dtype="float32", shard_size=10, show_progress=False,
                      precision="bfloat16")


def test_default_shard_size_lets_a_5000_passage_run_resume():
    import inspect

    from fastdpr import cli

    default = inspect.signature(encode_corpus).parameters["shard_size"].default
    assert cli.build_parser().parse_args(["encode", "x"]).shard_size == default
    assert len(enc.worker_shards(5000, default, 0, 1)) >= 2


def test_encode_corpus_reports_progress_in_a_log(model, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FASTDPR_PROGRESS", raising=False)
    encode_corpus(model, corpus, tmp_path, shard_size=20)
    assert "encode passages: 57/57 (100%)" in capsys.readouterr().err


def test_changed_corpus_with_same_size_redoes_mismatching_shards(model, tmp_path):
    passages = make_passages(25)
    encode_corpus(model, Corpus.from_passages(passages), tmp_path, dtype="float32", shard_size=10,
                  show_progress=False)
    passages[12] = {**passages[12], "id": "renamed"}
    out = encode_corpus(model, Corpus.from_passages(passages), tmp_path, dtype="float32", shard_size=10,
                        show_progress=False)
    assert out["encoded_now"] == 10
    assert load_vectors(tmp_path)[1][12] == "renamed"


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_worker_split_and_merge_cover_every_passage_once(model, corpus, reference, tmp_path, workers):
    for i in range(workers):
        encode_corpus(model, corpus, tmp_path, batch_size=8, dtype="float32", shard_size=10, shard=f"{i}/{workers}",
                      show_progress=False)
    with pytest.raises(InputError, match="merge them first"):
        load_vectors(tmp_path)
    merged = merge_shards([tmp_path])
    assert merged["count"] == 57 and merged["complete"]
    vectors, ids = load_vectors(tmp_path)
    np.testing.assert_array_equal(vectors, reference[0])
    assert ids == reference[1]


def test_merge_from_separate_directories_and_its_checks(model, corpus, reference, tmp_path):
    dirs = [tmp_path / f"w{i}" for i in range(3)]
    for i, d in enumerate(dirs):
        encode_corpus(model, corpus, d, batch_size=8, dtype="float32", shard_size=10, shard=(i, 3),
                      show_progress=False)
    with pytest.raises(InputError, match="missing"):
        merge_shards(dirs[:2], tmp_path / "out")
    merge_shards(dirs, tmp_path / "out")
    np.testing.assert_array_equal(load_vectors(tmp_path / "out")[0], reference[0])
    # the same shards seen twice (a worker's directory given twice under another name) are refused
    twin = tmp_path / "twin"
    twin.mkdir()
    for f in dirs[1].iterdir():
        (twin / f.name).write_bytes(f.read_bytes())
    with pytest.raises(InputError, match="encoded twice"):
        merge_shards(dirs + [twin], tmp_path / "out2")
    # an unfinished worker
    part = dirs[2] / "manifest.part-2-of-3.json"
    data = json.loads(part.read_text())
    data["complete"] = False
    part.write_text(json.dumps(data))
    with pytest.raises(InputError, match="incomplete"):
        merge_shards(dirs, tmp_path / "out3")


def test_bad_arguments_and_bad_rows(model, corpus, tmp_path):
    with pytest.raises(InputError, match="dtype"):
        encode_corpus(model, corpus, tmp_path, dtype="bfloat16")
    with pytest.raises(InputError, match="shard_size"):
        encode_corpus(model, corpus, tmp_path, shard_size=0)
    with pytest.raises(InputError, match="i/n"):
        encode_corpus(model, corpus, tmp_path, shard="2")
    with pytest.raises(InputError, match="0 <= i < n"):
        encode_corpus(model, corpus, tmp_path, shard="3/3")
    bad = [{"id": "a", "title": "", "text": "fine"}, {"id": "b", "title": "t"}]
    with pytest.raises(InputError, match="corpus row 1 .id 'b'. has no 'text'"):
        encode_corpus(model, bad, tmp_path / "bad", show_progress=False)
    with pytest.raises(InputError, match="no manifest"):
        load_vectors(tmp_path / "nothing")


def test_max_length_override_is_recorded_and_not_kept(model, corpus, tmp_path):
    before = model.config
    manifest = encode_corpus(model, corpus, tmp_path, shard_size=100, max_length=16, show_progress=False)
    assert manifest["max_length"] == 16 and manifest["truncated"] > 0
    assert model.config == before


def test_torchrun_environment_picks_the_worker(model, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    manifest = encode_corpus(model, corpus, tmp_path, shard_size=10, show_progress=False)
    assert manifest["worker"] == [1, 2] and manifest["rows"] == [30, 57]
    assert (tmp_path / "manifest.part-1-of-2.json").exists()


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import fastdpr.data.vectors as files
    import fastdpr.encode.writer as enc
    from fastdpr.models import BiEncoder
    from fastdpr.data import Corpus
    import json
    real = files._write_bytes
    state = {{"n": 0}}
    def dying(path, data):
        state["n"] += 1
        if state["n"] == {kill_at}:
            # a real kill -9 in the middle of a write: half the bytes in the temp file, then SIGKILL
            tmp = path.with_name(f".{{path.name}}.{{os.getpid()}}.killed.tmp")  # atomic_open's naming
            with open(tmp, "wb") as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, data)
    files._write_bytes = dying
    model = BiEncoder.from_pretrained({model!r})
    passages = json.load(open({passages!r}))
    enc.encode_corpus(model, Corpus.from_passages(passages), {out!r}, batch_size=8, dtype="float32",
                      shard_size=10, show_progress=False)
""")


@pytest.mark.slow
def test_real_sigkill_mid_write_then_resume(model, corpus, reference, tmp_path):
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    passages = tmp_path / "passages.json"
    passages.write_text(json.dumps(list(corpus)))
    out = tmp_path / "vectors"
    # write number 5 is the vectors of shard 2 (each shard writes vectors then ids)
    script = _KILLER.format(tests=str(tmp_path), kill_at=5, model=str(model_dir), passages=str(passages),
                            out=str(out))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert json.loads((out / "manifest.json").read_text())["count"] == 20
    left = list(out.glob(".*.tmp"))
    assert left  # the half-written file is there ...
    # ... and goes once its writer is dead and it has been idle for atomic.STALE_AFTER (a rerun a while later)
    for tmp in left:
        os.utime(tmp, (time.time() - 3600, time.time() - 3600))
    reloaded = type(model).from_pretrained(model_dir)
    resumed = encode_corpus(reloaded, Corpus.from_passages(json.loads(passages.read_text())), out, batch_size=8,
                            dtype="float32", shard_size=10, show_progress=False)
    assert resumed["encoded_now"] == 37 and not list(out.glob(".*.tmp"))  # never taken for a shard
    vectors, ids = load_vectors(out, verify=True)
    np.testing.assert_array_equal(vectors, reference[0])
    assert ids == reference[1]


def test_cli_encode_and_merge(model, corpus, reference, tmp_path):
    from fastdpr import cli

    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    jsonl = tmp_path / "passages.jsonl"
    jsonl.write_text("".join(json.dumps(p) + "\n" for p in corpus))
    out = tmp_path / "vectors"
    for i in range(2):
        code = cli.main(["encode", "--model", str(model_dir), str(jsonl), "-o", str(out), "--shard-size", "10",
                         "--dtype", "float32", "--batch-size", "8", "--shard", f"{i}/2", "--no-progress",
                         "--precision", "fp32" if i == 0 else "float32"])
        assert code == 0
    assert cli.main(["encode", "--merge", str(out)]) == 0
    vectors, ids = load_vectors(out)
    np.testing.assert_array_equal(vectors, reference[0])
    assert ids == reference[1]
    assert cli.main(["encode", "--model", str(model_dir), str(jsonl)]) == 2  # no -o: a one-line error


def test_a_worker_removes_only_dead_writers_temporary_files(model, corpus, tmp_path):
    """Workers of one folder run side by side: one starting must not delete the files another is writing."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {f".shard-00001.npy.{os.getpid()}.abc_12.tmp": True,
             f".manifest.part-1.json.{os.getpid()}.xyz_9.tmp": True,
             f".shard-00003.npy.{dead.pid}.abc_12.tmp": False,
             f".manifest.part-1.json.{dead.pid}.xyz_9.tmp": False}
    old = time.time() - 3600
    for name in names:
        (tmp_path / name).write_bytes(b"half")
        os.utime(tmp_path / name, (old, old))
    encode_corpus(model, corpus, tmp_path, batch_size=8, shard_size=10, shard=(0, 2), show_progress=False)
    left = {p.name for p in tmp_path.glob(".*.tmp")}
    assert left == {name for name, keep in names.items() if keep}


def test_the_model_fingerprint_is_the_passage_towers_and_independent_of_threads(tmp_path):
    import torch

    from fastdpr.encode import model_fingerprint

    # wide enough that torch reduces a weight's sum over several threads
    model = tiny_biencoder(tmp_path, pooling="mean", similarity="cosine", shared=True, dropout=0.0, hidden=384,
                           layers=1)
    threads = torch.get_num_threads()
    try:
        prints = set()
        for n in (1, 2, 3):  # a float sum reduced by n threads changes with n; the fingerprint must not
            torch.set_num_threads(n)
            prints.add(model_fingerprint(model))
    finally:
        torch.set_num_threads(threads)
    assert len(prints) == 1
    before = prints.pop()
    model.untie()  # a passage tower of the same weights, now separate: its vectors are the same
    assert model_fingerprint(model) == before
    with torch.no_grad():
        next(model.question_encoder.parameters()).add_(1.0)  # the question side does not shape passage vectors
    assert model_fingerprint(model) == before
    with torch.no_grad():
        next(model.passage_encoder.parameters()).view(-1)[7] += 1e-3  # one passage weight does
    assert model_fingerprint(model) != before
