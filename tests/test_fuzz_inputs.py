"""Hostile input to the readers around the indexes: damaged vector directories and BM25 indexes, TSV headers that
cannot be followed, JSON arrays with trailing data, training records without positives, empty inputs to the
commands, and the temporary files killed writers leave behind. Each case is an ``InputError`` (or a warning) that
names the file, never a traceback from deep inside, a read outside the directory, or a silently wrong result."""
from __future__ import annotations

import hashlib
import json
import os
import warnings

import numpy as np
import pytest
from processes import age, dead_pid

from fastdpr import cli
from fastdpr.errors import InputError


# ---------------------------------------------------------------------------------------------------------------
# temporary files of killed writers


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    from fastdpr.atomic import write_json

    dead, alive = dead_pid(), os.getpid()
    stale = [tmp_path / f".out.json.{dead}.abc123.tmp", tmp_path / f"out.json.tmp-{dead}"]  # Python, C++ writers
    live = tmp_path / f".out.json.{alive}.xyz789.tmp"
    fresh = tmp_path / f".out.json.{dead}.fresh1.tmp"  # a writer on another machine may still be writing it
    other = tmp_path / f".other.json.{dead}.abc123.tmp"
    for p in stale + [live, other]:
        p.write_text("half")
        age(p)
    fresh.write_text("half")
    write_json(tmp_path / "out.json", {"a": 1})
    assert not any(p.exists() for p in stale)
    assert live.exists() and fresh.exists() and other.exists()
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}


def test_index_save_removes_the_compiled_writers_stale_temp_files(tmp_path):
    from fastdpr.index import build_index

    dead = dead_pid()
    stale = tmp_path / f"i.fdpr.tmp-{dead}"
    stale.write_bytes(b"\0" * 64)
    age(stale)
    build_index(np.eye(4, dtype=np.float32), "flat").save(tmp_path / "i.fdpr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.fdpr"]


def test_temp_file_names_carry_the_writer_pid(tmp_path):
    from fastdpr.atomic import atomic_open

    with atomic_open(tmp_path / "x.txt") as fh:
        fh.write("x")
        names = [p.name for p in tmp_path.iterdir() if p.name != "x.txt"]
    assert len(names) == 1 and names[0].startswith(f".x.txt.{os.getpid()}.") and names[0].endswith(".tmp")


# ---------------------------------------------------------------------------------------------------------------
# JSON arrays


@pytest.mark.parametrize("tail", [b"x", b"]", b",", b"[1]", b"{}", b"\n\n  garbage\n"])
def test_trailing_data_after_a_json_array_is_an_error(tmp_path, tail):
    from fastdpr.data import read_training

    rec = {"question": "q", "answers": ["a"], "positive_ctxs": [{"title": "t", "text": "x"}]}
    path = tmp_path / "train.json"
    path.write_bytes(json.dumps([rec, rec]).encode() + b"\n" + tail)
    with pytest.raises(InputError, match=r"train.json:\d+: unexpected .* after the end of the JSON array"):
        list(read_training(path))
    path.write_bytes(json.dumps([rec, rec]).encode() + b" \n\t\n")
    assert len(list(read_training(path))) == 2


# ---------------------------------------------------------------------------------------------------------------
# vector directories (fastdpr encode output)


def _vectors_dir(path, sizes=(5, 3), dim=4, dtype="float16"):
    path.mkdir()
    rng = np.random.default_rng(0)
    shards, row = [], 0
    for i, n in enumerate(sizes):
        vec, ids = f"shard-{i:05d}.npy", f"shard-{i:05d}.ids.json"
        np.save(path / vec, rng.standard_normal((n, dim)).astype(dtype))
        (path / ids).write_text(json.dumps([f"p{row + j}" for j in range(n)]))
        shards.append({"index": i, "vectors": vec, "ids": ids, "row_start": row, "count": n,
                       "sha256": hashlib.sha256((path / vec).read_bytes()).hexdigest(),
                       "ids_sha256": hashlib.sha256((path / ids).read_bytes()).hexdigest()})
        row += n
    manifest = {"format": "fastdpr-vectors", "version": 1, "dim": dim, "dtype": dtype, "rows": [0, row],
                "count": row, "complete": True, "shards": shards}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def _rewrite(path, manifest):
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_vector_shards_are_verified_by_default(tmp_path):
    from fastdpr.encode import load_vectors

    d = tmp_path / "v"
    _vectors_dir(d)
    vectors, ids = load_vectors(d)
    assert vectors.shape == (8, 4) and ids[-1] == "p7"
    blob = bytearray((d / "shard-00001.npy").read_bytes())
    blob[-1] ^= 0xFF  # a flipped bit in a vector: the file still loads, only the checksum tells
    (d / "shard-00001.npy").write_bytes(bytes(blob))
    with pytest.raises(InputError, match="shard-00001.npy.*checksum"):
        load_vectors(d)
    assert load_vectors(d, verify=False)[0].shape == (8, 4)  # the fast path, asked for


@pytest.mark.parametrize("damage,message", [
    (lambda m: m.pop("dim"), "'dim'"),
    (lambda m: m.update(dim="4"), "'dim'"),
    (lambda m: m.update(dtype="int8"), "'dtype'"),
    (lambda m: m.update(rows=[0]), "'rows'"),
    (lambda m: m.update(shards={"0": {}}), "'shards'"),
    (lambda m: m["shards"][1].update(vectors="../outside.npy"), "file name in this directory"),
    (lambda m: m["shards"][0].update(ids="/etc/passwd"), "file name in this directory"),
    (lambda m: m["shards"][1].update(row_start=4), "shard entry 1 covers rows 4"),
    (lambda m: m["shards"][0].update(count=-1), "shard entry 0"),
    (lambda m: m["shards"].pop(), "cover rows"),
    (lambda m: m["shards"].__setitem__(0, "shard-00000.npy"), "not an object"),
])
def test_damaged_manifests_are_named(tmp_path, damage, message):
    from fastdpr.encode import iter_vector_shards, read_manifest

    d = tmp_path / "v"
    manifest = _vectors_dir(d)
    (tmp_path / "outside.npy").write_bytes((d / "shard-00001.npy").read_bytes())
    damage(manifest)
    _rewrite(d, manifest)
    with pytest.raises(InputError, match=message) as err:
        list(iter_vector_shards(d, verify=False))
    assert "manifest.json" in str(err.value)
    with pytest.raises(InputError):
        read_manifest(d)


def test_damaged_shard_files_are_named(tmp_path):
    from fastdpr.encode import iter_vector_shards

    d = tmp_path / "v"
    manifest = _vectors_dir(d)
    (d / "shard-00000.ids.json").write_text("[\"p0\", ")  # cut off
    with pytest.raises(InputError, match="shard-00000.ids.json.*ids"):
        list(iter_vector_shards(d, verify=False))
    (d / "shard-00000.ids.json").write_text(json.dumps([0, 1, 2, 3, 4]))
    with pytest.raises(InputError, match="list of strings"):
        list(iter_vector_shards(d, verify=False))
    _vectors_dir(tmp_path / "w", dtype="float32")
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    manifest["dtype"] = "float16"
    _rewrite(tmp_path / "w", manifest)
    with pytest.raises(InputError, match="float32 vectors; the manifest says float16"):
        list(iter_vector_shards(tmp_path / "w", verify=False))


# ---------------------------------------------------------------------------------------------------------------
# BM25 indexes


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory):
    from fastdpr.sparse import BM25

    path = tmp_path_factory.mktemp("bm25") / "index"
    BM25.from_corpus([{"id": "p1", "title": "Cats", "text": "Cats purr."},
                      {"id": "p2", "title": "Dogs", "text": "Dogs bark."},
                      {"id": "p3", "title": "Birds", "text": "Birds sing."}], show_progress=False).save(path)
    return path


def _damaged_copy(src, dst, edit):
    import shutil

    shutil.copytree(src, dst)
    edit(dst)
    return dst


def _edit_manifest(**changes):
    def edit(path):
        m = json.loads((path / "fastdpr_bm25.json").read_text())
        for key, value in changes.items():
            if value is None:
                m.pop(key)
            elif key == "params":
                m["params"].update(value)
            else:
                m[key] = value
        (path / "fastdpr_bm25.json").write_text(json.dumps(m))
    return edit


@pytest.mark.parametrize("name,edit,message", [
    ("params", _edit_manifest(params={"k3": 1.0}), "'params'"),
    ("params-type", _edit_manifest(params={"k1": "high"}), "params"),
    ("num_docs", _edit_manifest(num_docs="3"), "'num_docs'"),
    ("no-ids", lambda p: (p / "ids.npy").unlink(), "damaged BM25 index"),
    ("ids-type", lambda p: np.save(p / "ids.npy", np.arange(3)), "one string id per passage"),
    ("no-vocab", lambda p: (p / "vocab.tokenizer.json").unlink(), "damaged BM25 index"),
    ("not-object", lambda p: (p / "fastdpr_bm25.json").write_text("[1, 2]"), "not a JSON object"),
    ("scores", lambda p: [f.write_bytes(b"garbage") for f in p.glob("*.npy") if f.name != "ids.npy"],
     "damaged BM25 index"),
])
def test_damaged_bm25_indexes_are_named(tmp_path, bm25_dir, name, edit, message):
    from fastdpr.sparse import BM25

    damaged = _damaged_copy(bm25_dir, tmp_path / name, edit)
    with pytest.raises(InputError, match=message) as err:
        BM25.load(damaged)
    assert name in str(err.value)


def test_bm25_path_that_is_a_file(tmp_path, bm25_dir):
    from fastdpr.sparse import BM25

    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        BM25.load(tmp_path / "file")
    assert len(BM25.load(bm25_dir)) == 3


# ---------------------------------------------------------------------------------------------------------------
# TSV headers


@pytest.mark.parametrize("header,message", [
    ("id\tbody\ttitle", "no text column"),
    ("text\ttitle", "no id column"),
    ("id\tid\ttext", "names an id column twice"),
    ("docid\ttext\ttitle\ttitle", "names a title column twice"),
])
def test_tsv_headers_that_cannot_be_followed(tmp_path, header, message):
    from fastdpr.data import iter_passages

    path = tmp_path / "p.tsv"
    path.write_text(header + "\n1\tsome text\tA title\n")
    with pytest.raises(InputError, match=f"p.tsv:1: .*{message}"):
        list(iter_passages(path))
    with pytest.raises(InputError, match=message):  # even when bad rows are skipped: nothing after it reads right
        list(iter_passages(path, skip_bad=True))


def test_good_tsv_headers_still_read(tmp_path):
    from fastdpr.data import iter_passages

    path = tmp_path / "p.tsv"
    path.write_text("title\tdocid\tcontents\nA\t7\tsome text\n")
    assert list(iter_passages(path)) == [{"id": "7", "title": "A", "text": "some text"}]
    path.write_text("1\tsome text\tA title\n2\tpassage\ttitle\n")  # no header: DPR's column order
    assert [p["id"] for p in iter_passages(path)] == ["1", "2"]


# ---------------------------------------------------------------------------------------------------------------
# training records without positives


def test_records_without_positives_are_skipped_with_a_count():
    from fastdpr.train.data import NoPositiveWarning, examples_from_records

    ok = {"question": "q", "positive_ctxs": [{"title": "t", "text": "x", "passage_id": "1"}]}
    records = [ok, {"question": "q2", "positive_ctxs": []}, {"question": "q3"},
               {"question": "q4", "positive_ctxs": [{"title": "t", "text": "  "}]}, ok]
    with pytest.warns(NoPositiveWarning, match="skipped 3 of 5 training questions.*the first is record 1"):
        examples = examples_from_records(records, path="train.json")
    assert len(examples) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(examples_from_records([ok])) == 1  # nothing skipped: no warning
    with pytest.raises(InputError, match="record 0: 'positive_ctxs' must be a list"):
        examples_from_records([{"question": "q", "positive_ctxs": "passage text"}])
    with pytest.raises(InputError, match="record 1: expected an object"):
        examples_from_records([ok, ["q", "a"]])
    with pytest.raises(InputError, match="must be strings"):
        examples_from_records([{"question": "q", "positive_ctxs": [{"text": 5}]}])


def test_a_file_without_any_positive_is_an_error(tmp_path):
    from fastdpr.train.data import NoPositiveWarning, load_examples

    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "q", "answers": ["a"], "positive_ctxs": []}]))
    with pytest.warns(NoPositiveWarning), pytest.raises(InputError, match="no training question has a positive"):
        load_examples(str(path))


# ---------------------------------------------------------------------------------------------------------------
# empty inputs to the commands


def test_commands_refuse_empty_inputs(tmp_path, bm25_dir, capsys):
    empty_qa = tmp_path / "qa.jsonl"
    empty_qa.write_text("")
    corpus = tmp_path / "passages.tsv"
    corpus.write_text("id\ttext\ttitle\np1\tCats purr.\tCats\np2\tDogs bark.\tDogs\np3\tBirds sing.\tBirds\n")
    empty_docs = tmp_path / "docs.jsonl"
    empty_docs.write_text("\n\n")
    empty_results = tmp_path / "results.json"
    empty_results.write_text("[]")
    cases = {
        "search": ["search", str(empty_qa), "--mode", "bm25", "--bm25", str(bm25_dir), "--corpus", str(corpus),
                   "-o", str(tmp_path / "run.json")],
        "mine": ["mine", str(empty_qa), "--corpus", str(corpus), "--bm25", str(bm25_dir),
                 "-o", str(tmp_path / "train.json")],
        "split": ["split", str(empty_docs), "-o", str(tmp_path / "out.tsv")],
        "read": ["read", str(empty_results), "--reader", str(tmp_path / "no-reader"), "-o", str(tmp_path / "a.json")],
    }
    for name, argv in cases.items():
        capsys.readouterr()
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err
        assert f"fastdpr {name}: error:" in err and "nothing to" in err, (name, err)
    # nothing was written in their place
    assert not any((tmp_path / f).exists() for f in ("run.json", "train.json", "out.tsv", "a.json"))
