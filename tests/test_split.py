"""The passage splitter on real text (SQuAD v1.1 dev paragraphs) and its CLI."""
import json

import pytest

from fastdpr.cli import main
from fastdpr.data import Corpus, iter_documents, iter_passages, iter_qa, split_documents, split_text
from fastdpr.errors import InputError
from fastdpr.text.answers import has_answer


def test_split_text_blocks_and_stride():
    words = [f"w{i}" for i in range(10)]
    text = " ".join(words)
    assert split_text(text, words=4) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert split_text(text, words=10) == [text]
    assert split_text(text, words=4, stride=3) == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert split_text(text, words=4, stride=2) == ["w0 w1 w2 w3", "w2 w3 w4 w5", "w4 w5 w6 w7", "w6 w7 w8 w9"]
    assert split_text("  a\n\nb\tc  ", words=2) == ["a b", "c"]
    with pytest.raises(ValueError):
        split_text(text, words=0)
    with pytest.raises(ValueError):
        split_text(text, words=4, stride=5)


def test_split_real_squad_documents(data_dir):
    docs = list(iter_documents(data_dir / "squad_dev_sample.jsonl"))
    assert [d["id"] for d in docs] == ["Super_Bowl_50", "Normans", "Nikola_Tesla"]
    passages = list(split_documents(docs, words=100))
    for doc in docs:
        mine = [p for p in passages if p["id"].startswith(doc["id"] + "#")]
        # disjoint blocks that put the document's words back together, in order, title kept apart
        assert " ".join(p["text"] for p in mine).split() == doc["text"].split()
        assert all(len(p["text"].split()) == 100 for p in mine[:-1]) and 0 < len(mine[-1]["text"].split()) <= 100
        assert all(p["title"] == doc["title"] for p in mine)
        assert [p["id"] for p in mine] == [f"{doc['id']}#{k}" for k in range(len(mine))]
    assert len({p["id"] for p in passages}) == len(passages)
    # SQuAD answers are spans of the paragraphs: each one is in some passage, unless a block boundary cut it, in
    # which case it is in the join of two neighbouring passages -- and overlapping blocks recover it
    questions = list(iter_qa(data_dir / "squad_dev_sample.qa.jsonl"))
    overlapping = list(split_documents(docs, words=100, stride=50))
    for q in questions:
        assert any(has_answer(d["text"], q["answers"]) for d in docs)
        if not any(has_answer(p["text"], q["answers"]) for p in passages):
            assert any(has_answer(a["text"] + " " + b["text"], q["answers"]) for a, b in zip(passages, passages[1:]))
        assert any(has_answer(p["text"], q["answers"]) for p in overlapping)
    assert sum(any(has_answer(p["text"], q["answers"]) for p in passages) for q in questions) > len(questions) // 2


def test_stride_overlap_on_real_text(data_dir):
    docs = list(iter_documents(data_dir / "squad_dev_sample.jsonl"))
    tesla = docs[2]
    blocks = split_text(tesla["text"], words=100, stride=50)
    all_words = tesla["text"].split()
    for k, block in enumerate(blocks):
        assert block.split() == all_words[50 * k:50 * k + 100]
    assert blocks[-1].split()[-1] == all_words[-1]


def test_numeric_ids_and_duplicate_documents():
    docs = [{"id": "a", "title": "A", "text": "x " * 150}, {"id": "b", "title": "B", "text": "y"}]
    assert [p["id"] for p in split_documents(docs, numeric_ids=True)] == ["1", "2", "3"]
    with pytest.raises(InputError, match="duplicate document id 'a'"):
        list(split_documents(docs + [docs[0]]))


def test_plain_text_files_and_directories(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "Alan_Turing.txt").write_text("Alan Turing was a mathematician.\n\nHe was born in 1912.", encoding="utf-8")
    (d / "sub").mkdir()
    (d / "sub" / "Ada.txt").write_text("Ada Lovelace wrote programs.", encoding="utf-8")
    (d / "ignored.bin").write_bytes(b"\x00\x01")
    docs = list(iter_documents(d))
    assert [(x["id"], x["title"]) for x in docs] == [("Alan_Turing", "Alan Turing"), ("Ada", "Ada")]
    (d / "empty.txt").write_text("  \n", encoding="utf-8")
    with pytest.raises(InputError, match="empty document") as info:
        list(iter_documents(d))
    assert "empty.txt:1:" in str(info.value)


def test_bad_documents(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "title": "T"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="missing field 'text'") as info:
        list(iter_documents(path))
    assert f"{path}:2:" in str(info.value)


def test_split_cli_round_trip(tmp_path, data_dir, capsys):
    out = tmp_path / "passages.tsv"
    assert main(["split", str(data_dir / "squad_dev_sample.jsonl"), "-o", str(out), "--words", "50"]) == 0
    assert "passages from 3 documents" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8").startswith("id\ttext\ttitle\n")
    passages = list(iter_passages(out))
    c = Corpus.open(out)
    assert len(c) == len(passages) and c.get("Normans#1") == passages[[p["id"] for p in passages].index("Normans#1")]

    out2 = tmp_path / "passages.jsonl"
    assert main(["split", str(data_dir / "squad_dev_sample.jsonl"), "-o", str(out2), "--words", "50",
                 "--stride", "25", "--numeric-ids"]) == 0
    recs = [json.loads(x) for x in out2.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in recs] == [str(i) for i in range(1, len(recs) + 1)] and len(recs) > len(passages)

    assert main(["split", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["split", str(data_dir / "squad_dev_sample.jsonl"), "-o", str(out), "--stride", "200"]) == 2


# ---- the document map: gold document ids survive the split ------------------------------------------------------


def test_document_map_of_split_documents_and_files(tmp_path, data_dir):
    from fastdpr.data.split import docmap_path, read_docmap, split_files

    docs = list(iter_documents(data_dir / "squad_dev_sample.jsonl"))
    doc_map = {}
    passages = list(split_documents(docs, words=60, doc_map=doc_map))
    assert list(doc_map) == [d["id"] for d in docs]
    assert [pid for d in docs for pid in doc_map[d["id"]]] == [p["id"] for p in passages]

    out = tmp_path / "passages.tsv"
    assert split_files(data_dir / "squad_dev_sample.jsonl", out, words=60) == len(passages)
    assert docmap_path(out) == tmp_path / "passages.tsv.docmap.tsv"
    assert read_docmap(docmap_path(out)) == doc_map
    assert read_docmap(docmap_path(out), only={"Normans", "nope"}) == {"Normans": doc_map["Normans"]}
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind

    # numbered passages: a document id that repeats (ids from line numbers, two files) keeps all its passages
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"text": "w1 w2 w3"}\n', encoding="utf-8")
    b.write_text('{"text": "w4 w5"}\n', encoding="utf-8")
    split_files([a, b], tmp_path / "n.jsonl", words=2, numeric_ids=True)
    assert read_docmap(docmap_path(tmp_path / "n.jsonl")) == {"1": ["1", "2", "3"]}
    merged = {}
    list(split_documents([{"id": "1", "text": "w1 w2 w3"}, {"id": "1", "text": "w4"}], words=2, numeric_ids=True,
                         doc_map=merged))
    assert merged == {"1": ["1", "2", "3"]}

    bad = tmp_path / "bad.docmap.tsv"
    bad.write_text("something else\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a document map"):
        read_docmap(bad)


def test_gold_passages_are_the_documents_passages_with_an_answer():
    from fastdpr.data.split import gold_passages

    doc_map = {"d1": ["d1#0", "d1#1", "d1#2"], "d2": ["d2#0"]}
    passages = {"d1#0": {"text": "Denver won the game"}, "d1#1": {"text": "the Broncos of Denver"},
                "d1#2": {"text": "a halftime show"}, "d2#0": {"text": "nothing here"}}
    assert gold_passages(["d1"], ["Denver"], doc_map, passages) == ["d1#0", "d1#1"]
    assert gold_passages(["d1"], ["Broncos of"], doc_map, passages) == ["d1#1"]
    # the title never counts, only the text (DPR's rule); regex answers too
    assert gold_passages(["d2"], ["Denver"], doc_map, passages) == []
    assert gold_passages(["d1"], [r"half\w+"], doc_map, passages, mode="regex") == ["d1#2"]
    # ids that are not documents pass through (they may name passages); no answers: the whole document
    assert gold_passages(["p9", "d1", "d1#1"], "Denver", doc_map, passages) == ["p9", "d1#0", "d1#1"]
    assert gold_passages(["d1"], [], doc_map, passages) == ["d1#0", "d1#1", "d1#2"]


def test_documents_without_ids_are_warned_about(tmp_path):
    import warnings

    from fastdpr.data.split import iter_documents

    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "one two"}\n{"text": "three four"}\n{"title": "t", "text": "five"}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        docs = list(iter_documents(path))
    assert [d["id"] for d in docs] == ["a", "2", "3"]
    messages = [str(w.message) for w in caught]
    assert any("2 documents have no id" in m and "line 2" in m for m in messages), messages


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_split_names_the_encoding_error_not_nothing_to_split(tmp_path, capsys, encoding):
    docs = tmp_path / "docs.jsonl"
    docs.write_bytes('{"id": "d1", "title": "Café", "text": "Crème brûlée à la carte"}\n'.encode(encoding))
    assert main(["split", str(docs), "-o", str(tmp_path / "p.tsv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fastdpr split: error: {docs}:1: not valid UTF-8 (byte "), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "p.tsv").exists()


def test_split_names_the_field_it_expects(tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "d1", "content": "one two three"}\n', encoding="utf-8")
    assert main(["split", str(docs), "-o", str(tmp_path / "p.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{docs}:1: missing field 'text'" in err and "'content'" in err, err


def test_plain_text_encoding_errors_read_as_every_other_reader(tmp_path):
    (tmp_path / "a.txt").write_bytes("first line\nsecond caf\xe9\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"a\.txt:2: not valid UTF-8 \(byte 10: b'\\xe9'\)"):
        list(iter_documents(tmp_path / "a.txt"))


def test_json_errors_say_at_once():
    from fastdpr.data._jsonstream import parse_json_object

    for line in ('{"a": "b', '{"a": "b\x01"}'):
        with pytest.raises(ValueError) as err:
            parse_json_object(line)
        assert " at at " not in str(err.value) and "at column" in str(err.value)
