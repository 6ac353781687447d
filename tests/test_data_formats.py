"""Readers and writers of every format: round trips, real samples, bad input named by file:line."""
import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdpr.data import (
    BadRowWarning,
    ReadStats,
    iter_passages,
    iter_qa,
    read_dpr_results,
    read_qrels,
    read_run,
    read_training,
    read_trec,
    results_to_run,
    write_beir_queries,
    write_dpr_biencoder,
    write_dpr_results,
    write_passages,
    write_qa,
    write_qrels,
    write_tevatron,
    write_trec,
)
from fastdpr.data.passages import detect_passage_format
from fastdpr.errors import InputError

PASSAGES = [
    {"id": "1", "title": "Aaron", "text": 'Aaron ( or ; "Ahärôn") is a prophet, high priest'},
    {"id": "2", "title": "Zürich \"city\"", "text": "Zürich is the largest city in Switzerland."},
    {"id": "doc#3", "title": "", "text": "A passage\twith a tab and\na newline."},
    {"id": "4", "title": "Никола Тесла", "text": "Nikola Tesla (10 July 1856 – 7 January 1943) was an inventor."},
]


def _expected(p):
    # TSV records are one line: tabs and newlines inside a field become single spaces
    return {k: " ".join(v.split()) if k != "id" else v for k, v in p.items()}


@pytest.mark.parametrize("name", ["psgs.tsv", "psgs.jsonl", "psgs.tsv.gz", "psgs.jsonl.gz"])
def test_passages_round_trip(tmp_path, name):
    path = tmp_path / name
    assert write_passages(path, PASSAGES) == len(PASSAGES)
    got = list(iter_passages(path))
    if ".tsv" in name:
        assert got == [_expected(p) for p in PASSAGES]
        assert (gzip.open(path, "rt") if name.endswith(".gz") else open(path)).readline() == "id\ttext\ttitle\n"
    else:
        assert got == PASSAGES


def test_dpr_tsv_as_psgs_w100(tmp_path):
    # psgs_w100.tsv style: header, CSV-quoted text with doubled quotes, quoted title
    path = tmp_path / "psgs_w100.tsv"
    path.write_text(
        'id\ttext\ttitle\n'
        '1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
        '2\tplain text here\t"Quoted Title"\n',
        encoding="utf-8",
    )
    got = list(iter_passages(path))
    assert got[0] == {"id": "1", "title": "Aaron", "text": 'Aaron Aaron ( or ; "Ahärôn") is a prophet'}
    assert got[1] == {"id": "2", "title": "Quoted Title", "text": "plain text here"}


def test_dpr_tsv_without_header_and_wiki_prefix(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("wiki:1\tfirst text\tT1\nwiki:22\tsecond text\tT2\n", encoding="utf-8")
    assert [p["id"] for p in iter_passages(path)] == ["1", "22"]


def test_tsv_header_in_other_column_order(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("title\tid\ttext\nT\tx1\tsome text\n", encoding="utf-8")
    assert list(iter_passages(path)) == [{"id": "x1", "title": "T", "text": "some text"}]


def test_beir_corpus_jsonl_and_directory(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"_id": "d1", "title": "T", "text": "hello", "metadata": {}}) + "\n"
        + json.dumps({"_id": 7, "text": "no title"}) + "\n",
        encoding="utf-8",
    )
    expected = [{"id": "d1", "title": "T", "text": "hello"}, {"id": "7", "title": "", "text": "no title"}]
    assert list(iter_passages(tmp_path / "corpus.jsonl")) == expected
    assert list(iter_passages(tmp_path)) == expected  # a BEIR dataset directory


def test_format_detection_by_content(tmp_path):
    a = tmp_path / "passages.data"
    a.write_text('{"id": "1", "text": "x"}\n', encoding="utf-8")
    b = tmp_path / "passages.other"
    b.write_text("1\tx\tt\n", encoding="utf-8")
    assert detect_passage_format(a) == "jsonl" and detect_passage_format(b) == "tsv"
    assert next(iter_passages(a))["text"] == "x" and next(iter_passages(b))["title"] == "t"


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b"id\ttext\ttitle\n1\tgood\tT\n2\tmissing title column\n", 3, r"2 column\(s\), expected 3"),
        (b"id\ttext\ttitle\n1\tgood\tT\n2\t \tT\n", 3, "empty text"),
        (b"id\ttext\ttitle\n\t text\tT\n", 2, "empty passage id"),
        (b"id\ttext\ttitle\n1\tgood\tT\n2\tbad \xff\xfe byte\tT\n", 3, "not valid UTF-8"),
        (b"id\ttext\ttitle\n1\t\"unterminated quote\tT\n", 2, "malformed quoting"),
        (b"1\tgood\tT\n2\tgood\tT\t\textra\n", 2, r"5 column\(s\)"),
    ],
)
def test_bad_tsv_rows_name_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as info:
        list(iter_passages(path))
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert info.value.line == line


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "1", "title": "T"', "not valid JSON"),
        ('["a", "b"]', "expected a JSON object"),
        ('{"title": "T", "text": "x"}', "missing field 'id'"),
        ('{"id": "1", "title": "T"}', "missing field 'text'"),
        ('{"id": "1", "text": ""}', "empty text"),
    ],
)
def test_bad_jsonl_rows(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "text": "fine"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message) as info:
        list(iter_passages(path))
    assert f"{path}:3: " in str(info.value)


def test_skip_bad_warns_and_counts(tmp_path):
    path = tmp_path / "mixed.tsv"
    path.write_bytes(b"id\ttext\ttitle\n1\tok\tA\n2\t\tB\n3\tbad \xff\tC\n4\tok too\tD\n5\tshort\n")
    stats = ReadStats()
    with pytest.warns(BadRowWarning) as record:
        got = list(iter_passages(path, skip_bad=True, stats=stats))
    assert [p["id"] for p in got] == ["1", "4"]
    assert stats.bad == 3 and stats.rows == 2
    messages = [str(w.message) for w in record]
    assert any(f"{path}:3:" in m for m in messages) and any(f"{path}:6:" in m for m in messages)
    assert any("skipped 3 bad row(s) of 5" in m for m in messages)


def test_missing_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        list(iter_passages(tmp_path / "nope.tsv"))


# ---- QA files -------------------------------------------------------------------------------------------------


def test_real_dpr_qa_files(data_dir):
    nq = list(iter_qa(data_dir / "dpr_nq_test_sample.qa.tsv"))
    assert nq[0] == {"qid": "0", "question": "who got the first nobel prize in physics",
                     "answers": ["Wilhelm Conrad Röntgen"]}
    assert nq[2]["answers"] == ["Olivia", "MFSK"]
    trivia = list(iter_qa(data_dir / "dpr_trivia_dev_sample.qa.tsv"))
    # a CSV-quoted row: doubled quotes inside both the question and the answer list
    assert trivia[2]["question"].startswith('"""She has a lovely face')
    assert "'LANCELOT'" in trivia[2]["answers"] and "Lancelot" in trivia[2]["answers"]
    curated = list(iter_qa(data_dir / "dpr_curated_sample.jsonl"))  # Pyserini topics: "answer" key
    assert curated[1]["answers"] == ["After the Fall|Finishing the Play"]
    assert [q["qid"] for q in curated] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("name", ["qa.csv", "qa.tsv", "qa.jsonl"])
def test_qa_round_trip(tmp_path, name):
    questions = [
        {"qid": "0", "question": "who wrote \"Hamlet\"?", "answers": ["William Shakespeare", "Shakespeare's"]},
        {"qid": "q-17", "question": "tab\tin question", "answers": []},
        {"qid": "2", "question": "1 + 1", "answers": ["2", "two, in words"]},
    ]
    write_qa(tmp_path / name, questions)
    got = list(iter_qa(tmp_path / name))
    assert got == [{**q, "question": " ".join(q["question"].split())} for q in questions]


def test_qa_answers_are_literals_not_code(tmp_path):
    path = tmp_path / "evil.csv"
    path.write_text("q1\t['fine']\nq2\t__import__('os').system('echo pwned')\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a list literal") as info:
        list(iter_qa(path))
    assert f"{path}:2:" in str(info.value)


@pytest.mark.parametrize(
    "line, message",
    [("question only", "missing the answers column"), ("q\t[1, 2]", "list of strings"), ("\t['a']", "empty question")],
)
def test_bad_qa_rows(tmp_path, line, message):
    path = tmp_path / "bad.tsv"
    path.write_text("q0\t['a']\n" + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message):
        list(iter_qa(path))


def test_beir_queries_and_qrels_round_trip(tmp_path):
    write_beir_queries(tmp_path / "queries.jsonl", [{"qid": "q1", "question": "what is x"}])
    assert list(iter_qa(tmp_path)) == [{"qid": "q1", "question": "what is x", "answers": []}]
    qrels = {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 0}}
    write_qrels(tmp_path / "test.tsv", qrels)
    assert (tmp_path / "test.tsv").read_text().startswith("query-id\tcorpus-id\tscore\n")
    assert read_qrels(tmp_path / "test.tsv") == qrels
    write_qrels(tmp_path / "qrels.trec", qrels, fmt="trec")
    assert read_qrels(tmp_path / "qrels.trec") == qrels


def test_bad_qrels_line(tmp_path):
    path = tmp_path / "q.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\tlots\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a number") as info:
        read_qrels(path)
    assert f"{path}:3:" in str(info.value)


# ---- training files --------------------------------------------------------------------------------------------

RECORDS = [
    {
        "question": "who is the prophet?",
        "answers": ["Aaron"],
        "positive_ctxs": [{"title": "Aaron", "text": "Aaron is a prophet.", "passage_id": "1"}],
        "negative_ctxs": [{"title": "N", "text": "random text", "passage_id": "9"}],
        "hard_negative_ctxs": [
            {"title": "Moses", "text": "Moses is a prophet too.", "passage_id": "2"},
            {"title": "", "text": "no id here", "passage_id": None},
        ],
    },
    {"question": "empty lists?", "answers": [], "positive_ctxs": [], "negative_ctxs": [], "hard_negative_ctxs": []},
]


def test_dpr_biencoder_round_trip(tmp_path):
    path = tmp_path / "train.json"
    assert write_dpr_biencoder(path, iter(RECORDS)) == 2
    assert isinstance(json.loads(path.read_text()), list)  # a real JSON array DPR can load
    assert list(read_training(path)) == RECORDS


def test_real_dpr_training_sample(data_dir):
    recs = list(read_training(data_dir / "squad_dev_train_sample.json"))
    raw = json.loads((data_dir / "squad_dev_train_sample.json").read_text())
    assert len(recs) == len(raw) == 64
    assert recs[5]["question"] == raw[5]["question"]
    assert recs[5]["positive_ctxs"][0]["text"] == raw[5]["positive_ctxs"][0]["text"]


def test_tevatron_round_trip(tmp_path):
    path = tmp_path / "train.jsonl"
    write_tevatron(path, RECORDS)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) >= {"query_id", "query", "positive_passages", "negative_passages"}
    assert first["positive_passages"][0] == {"docid": "1", "title": "Aaron", "text": "Aaron is a prophet."}
    got = list(read_training(path))
    # Tevatron keeps one negative list (the hard negatives) and a query id
    expected = [{**r, "negative_ctxs": [], "qid": str(i)} for i, r in enumerate(RECORDS)]
    assert got == expected


def test_training_wiki_prefix_and_dpr_extras(tmp_path):
    path = tmp_path / "t.json"
    rec = {"dataset": "nq", "question": "q", "answers": ["a"],
           "positive_ctxs": [{"title": "T", "text": "x", "score": 1000, "title_score": 1, "passage_id": "wiki:42"}],
           "negative_ctxs": [], "hard_negative_ctxs": []}
    path.write_text(json.dumps([rec]))
    assert next(read_training(path))["positive_ctxs"] == [{"title": "T", "text": "x", "passage_id": "42"}]


def test_streaming_json_array_with_small_chunks(tmp_path):
    # force records to straddle read chunks; line numbers must stay right
    from fastdpr.data._jsonstream import iter_json_array

    path = tmp_path / "big.json"
    items = [{"i": i, "s": "é" * (i * 7), "n": 12345.5} for i in range(50)]
    path.write_text("[\n" + ",\n".join(json.dumps(x, ensure_ascii=False) for x in items) + "\n]\n")
    with open(path, "rb") as fh:
        got = list(iter_json_array(fh, str(path), chunk=16))
    assert [x for _, x in got] == items
    assert [line for line, _ in got] == list(range(2, 52))


@pytest.mark.parametrize(
    "text, line, message",
    [
        ('[\n{"question": "q"},\n{"question": "r"\n', 3, "cut off"),
        ('[\n{"question": "q", "positive_ctxs": []}\n{"question": "r"}]', 3, "expected ','"),
        ('{"question": "q"}\n{"question": 5}\n', 2, "missing or empty 'question'"),
        ('[{"question": "q", "positive_ctxs": [{"title": "t"}]}]', 1, r"positive_ctxs\[0\]: missing or empty 'text'"),
    ],
)
def test_bad_training_files(tmp_path, text, line, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as info:
        list(read_training(path))
    assert f"{path}:{line}:" in str(info.value)


def test_training_skip_bad_records(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "good"}, {"question": ""}, {"question": "also good"}]))
    stats = ReadStats()
    with pytest.warns(BadRowWarning):
        got = list(read_training(path, skip_bad=True, stats=stats))
    assert [r["question"] for r in got] == ["good", "also good"] and stats.bad == 1


# ---- runs ------------------------------------------------------------------------------------------------------


def test_dpr_results_round_trip(tmp_path):
    import numpy as np

    results = [
        {"question": "q0", "answers": ["a"], "ctxs": [
            {"id": "3", "title": "T", "text": "has a", "score": np.float32(12.5), "has_answer": True},
            {"id": "wiki:4", "title": "U", "text": "no", "score": 11.0, "has_answer": False}]},
        {"question": "q1", "answers": [], "ctxs": []},
    ]
    path = tmp_path / "run.json"
    write_dpr_results(path, results)
    got = list(read_dpr_results(path))
    assert got[0]["qid"] == "0" and got[1]["qid"] == "1"
    assert got[0]["ctxs"][0] == {"id": "3", "title": "T", "text": "has a", "score": 12.5, "has_answer": True}
    assert got[0]["ctxs"][1]["id"] == "4"  # wiki: prefix stripped on read
    assert read_run(path) == got


def test_trec_round_trip(tmp_path):
    run = {"q1": [("d2", 3.5), ("d1", 7.25), ("d3", 3.5)], "q0": [("x", -1.0)]}
    path = tmp_path / "run.trec"
    assert write_trec(path, run, tag="bm25") == 4
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d1 1 7.25 bm25"
    assert lines[1].split()[2:4] == ["d2", "2"] and lines[2].split()[2:4] == ["d3", "3"]  # ties keep order
    assert read_trec(path) == {"q1": [("d1", 7.25), ("d2", 3.5), ("d3", 3.5)], "q0": [("x", -1.0)]}
    results = read_run(path)
    assert results[0]["qid"] == "q1" and results[0]["answers"] is None
    assert results_to_run(results) == read_trec(path)


def test_bad_trec_lines(tmp_path):
    path = tmp_path / "run.trec"
    path.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 two 1.0 t\n")
    with pytest.raises(InputError, match="not numbers") as info:
        read_trec(path)
    assert f"{path}:2:" in str(info.value)
    path.write_text("q1 Q0 d1 1 2.0\n")
    with pytest.raises(InputError, match="5 fields"):
        read_trec(path)
    with pytest.raises(InputError, match="spaces"):
        write_trec(tmp_path / "x.trec", {"q 1": [("d", 1.0)]})


def test_writers_are_atomic(tmp_path):
    path = tmp_path / "psgs.tsv"
    write_passages(path, PASSAGES[:1])

    def exploding():
        yield PASSAGES[1]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_passages(path, exploding())
    assert [p["id"] for p in iter_passages(path)] == ["1"]  # the old file survives whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["psgs.tsv"]  # no temp file left behind


_field = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_field, _field), min_size=1, max_size=8), fmt=st.sampled_from(["tsv", "jsonl"]))
def test_passages_round_trip_property(tmp_path, rows, fmt):
    # any text with quotes, tabs, line breaks or odd unicode comes back the same (TSV: whitespace folded, as
    # documented; both: stripped); rows whose text is blank are not valid passages, so none are generated
    passages = [{"id": f"id{i}", "title": title, "text": text + " x"} for i, (title, text) in enumerate(rows)]
    path = tmp_path / f"prop.{fmt}"
    write_passages(path, passages)

    def norm(s):
        return " ".join(s.split()) if fmt == "tsv" and any(c in s for c in "\t\r\n") else s

    # reading splits records only on "\n" and strips fields, exactly what these expectations model
    expected = [{"id": p["id"], "title": norm(p["title"]).strip(), "text": norm(p["text"]).strip()} for p in passages]
    assert list(iter_passages(path)) == expected


def test_qa_jsonl_keeps_gold_passage_fields(tmp_path):
    from fastdpr.data import iter_qa

    path = tmp_path / "qa.jsonl"
    path.write_text('{"qid": "7", "question": "q?", "answers": ["a"], "gold_ids": ["p3"]}\n'
                    '{"question": "r?", "answers": ["b"]}\n', encoding="utf-8")
    records = list(iter_qa(path))
    assert records[0]["gold_ids"] == ["p3"]
    assert "gold_ids" not in records[1]
