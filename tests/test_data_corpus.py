"""Corpus: random access by row and id through the on-disk sidecar index, rebuilt when the source changes."""
import os
import pickle
import random

import numpy as np
import pytest

from fastdpr.data import BadRowWarning, Corpus, iter_passages, write_passages
from fastdpr.data import corpus as corpus_mod
from fastdpr.errors import InputError


def _passages(n, seed=0):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "Zürich", 'say "hi"', "delta", "ε", "1,000"]
    return [{"id": f"p{i}" if i % 3 else str(i), "title": f"Title {i % 7}",
             "text": " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))} for i in range(n)]


@pytest.fixture(params=["tsv", "jsonl"])
def corpus_file(request, tmp_path):
    path = tmp_path / f"passages.{request.param}"
    write_passages(path, _passages(300))
    return path


def test_in_memory_corpus():
    c = Corpus.from_passages([{"id": "a", "title": "T", "text": "first"}, {"id": 7, "text": "second"}])
    assert len(c) == 2 and c.ids == ["a", "7"]
    assert c[1] == {"id": "7", "title": "", "text": "second"} and c[-1]["id"] == "7"
    assert c.get("a")["text"] == "first" and c.row_of("7") == 1 and c.id_at(0) == "a"
    assert "a" in c and "b" not in c
    assert c.get("b", None) is None
    with pytest.raises(KeyError, match="'b'"):
        c.row_of("b")
    with pytest.raises(IndexError):
        c[2]
    with pytest.raises(InputError, match="duplicate passage id 'a'"):
        Corpus.from_passages([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])


def test_open_matches_stream_and_random_access(corpus_file):
    expected = list(iter_passages(corpus_file))
    with Corpus.open(corpus_file) as c:
        assert len(c) == len(expected) == 300
        assert list(c) == expected
        assert c.ids == [p["id"] for p in expected]
        order = list(range(len(c)))
        random.Random(1).shuffle(order)
        for row in order:
            assert c[row] == expected[row]
            assert c.id_at(row) == expected[row]["id"]
            assert c.row_of(expected[row]["id"]) == row
            assert c.get(expected[row]["id"]) == expected[row]
        assert "nope" not in c
        assert c.ids_at(np.array([[2, -1]])) == [expected[2]["id"], None]
        rows = np.random.default_rng(3).integers(-1, len(c), size=(7, 11))
        assert c.ids_at(rows) == [None if r < 0 else expected[r]["id"] for r in rows.ravel().tolist()]
        with pytest.raises(IndexError):
            c.ids_at([len(c)])
        assert c[np.int64(5)] == expected[5]
        with pytest.raises(TypeError):
            c["p1"]
    assert corpus_file.with_name(corpus_file.name + ".fdpridx").exists()


def test_sidecar_is_reused_then_rebuilt_when_source_changes(tmp_path, monkeypatch):
    path = tmp_path / "p.tsv"
    write_passages(path, _passages(20))
    builds = []
    real_build = corpus_mod._build_index
    monkeypatch.setattr(corpus_mod, "_build_index", lambda *a, **k: builds.append(1) or real_build(*a, **k))

    assert len(Corpus.open(path)) == 20 and len(builds) == 1
    assert len(Corpus.open(path)) == 20 and len(builds) == 1  # reused

    write_passages(path, _passages(21))  # new size
    c = Corpus.open(path)
    assert len(c) == 21 and len(builds) == 2 and c[20] == _passages(21)[20]

    # same size, different content and mtime: still rebuilt
    changed = [dict(p, text=p["text"].upper()) for p in _passages(21)]
    write_passages(path, changed)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    c = Corpus.open(path)
    assert len(builds) == 3 and c[3]["text"] == changed[3]["text"]

    # a corrupt sidecar is rebuilt, not trusted
    side = path.with_name(path.name + ".fdpridx")
    side.write_bytes(side.read_bytes()[:100])
    assert Corpus.open(path)[4] == changed[4] and len(builds) == 4


def test_unwritable_sidecar_falls_back_to_cache(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    write_passages(path, _passages(10))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real_write = corpus_mod._write_index

    def refuse_next_to_source(target, meta, arrays):
        if target.parent == tmp_path:
            raise PermissionError("read-only directory")
        real_write(target, meta, arrays)

    monkeypatch.setattr(corpus_mod, "_write_index", refuse_next_to_source)
    c = Corpus.open(path)
    assert c.index_path.is_relative_to(tmp_path / "cache")
    assert c.get("p4") == _passages(10)[4]


def test_hash_collisions_are_resolved(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_mod, "id_hash", lambda pid: 42)  # every id collides
    path = tmp_path / "p.tsv"
    write_passages(path, _passages(30))
    c = Corpus.open(path)
    for row, p in enumerate(_passages(30)):
        assert c.row_of(p["id"]) == row
    assert "missing" not in c


def test_duplicate_ids_name_both_lines(tmp_path):
    path = tmp_path / "dup.tsv"
    path.write_text("id\ttext\ttitle\n1\ta\tA\n2\tb\tB\n1\tc\tC\n3\td\tD\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"duplicate passage id '1' \(first at line 2\)") as info:
        Corpus.open(path)
    assert f"{path}:4:" in str(info.value)
    with pytest.warns(BadRowWarning):
        c = Corpus.open(path, skip_bad=True)
    assert c.ids == ["1", "2", "3"] and c.bad_rows == 1
    assert c.get("1")["text"] == "a" and c[2]["text"] == "d"


def test_bad_rows_in_corpus(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"id\ttext\ttitle\n1\tok\tA\n2\t\tB\n3\tfine\tC\n")
    with pytest.raises(InputError, match="empty text") as info:
        Corpus.open(path)
    assert f"{path}:3:" in str(info.value)
    with pytest.warns(BadRowWarning):
        c = Corpus.open(path, skip_bad=True)
    assert len(c) == 2 and c[1] == {"id": "3", "title": "C", "text": "fine"} and c.bad_rows == 1
    # an index built while skipping does not serve a strict open
    with pytest.raises(InputError):
        Corpus.open(path)


def test_corpus_pickles(corpus_file):
    c = Corpus.open(corpus_file)
    c2 = pickle.loads(pickle.dumps(c))
    assert c2[17] == c[17] and c2.row_of(c[17]["id"]) == 17


def test_gzip_and_missing_sources(tmp_path):
    write_passages(tmp_path / "p.tsv.gz", _passages(3))
    with pytest.raises(InputError, match="decompress"):
        Corpus.open(tmp_path / "p.tsv.gz")
    with pytest.raises(InputError, match="no such file"):
        Corpus.open(tmp_path / "nothing.tsv")


def test_psgs_w100_quoting_survives_random_access(tmp_path):
    path = tmp_path / "psgs_w100.tsv"
    path.write_text('id\ttext\ttitle\n1\t"Aaron ( or ; ""Ahärôn"") is"\tAaron\n2\tx\t"T"\n', encoding="utf-8")
    c = Corpus.open(path)
    assert c.get("1")["text"] == 'Aaron ( or ; "Ahärôn") is' and c[1]["title"] == "T"


def test_empty_corpus_and_bom(tmp_path):
    path = tmp_path / "empty.tsv"
    path.write_text("id\ttext\ttitle\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="no passages"):
        Corpus.open(path)
    bom = tmp_path / "bom.tsv"
    bom.write_bytes("\ufeffid\ttext\ttitle\n1\tfirst\tT\n".encode("utf-8"))
    c = Corpus.open(bom)
    assert c[0] == {"id": "1", "title": "T", "text": "first"} and list(iter_passages(bom)) == [c[0]]
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes('\ufeff{"id": "1", "text": "x"}\n'.encode("utf-8"))
    assert Corpus.open(bom_jsonl)[0]["text"] == "x"
