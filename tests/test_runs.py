"""Run files in every format fastdpr reads and writes (DPR, pyserini, TREC, BEIR, compact): round trips, files
written the way DPR, pyserini and BEIR write them, detection by content, and ranking_hits (has_answer over a
ranking, with its memo)."""
import json

import pytest

from fastdpr.cli import main
from fastdpr.data import (
    RUN_FORMATS,
    Corpus,
    attach_answers,
    attach_texts,
    detect_run_format,
    read_run,
    write_passages,
    write_qa,
    write_run,
)
from fastdpr.errors import InputError
from fastdpr.eval import ranking_hits, topk_accuracy

RESULTS = [
    {"qid": "q1", "question": "where is the eiffel tower", "answers": ["Paris"], "ctxs": [
        {"id": "d2", "title": "Tower", "text": "It stands in Paris.", "score": 7.25, "has_answer": True},
        {"id": "d1", "title": "Lyon", "text": "A city in France.", "score": 3.5, "has_answer": False}]},
    {"qid": "q0", "question": "who wrote hamlet", "answers": ["Shakespeare"], "ctxs": [
        {"id": "d9", "title": "Hamlet", "text": "A play.", "score": -1.0, "has_answer": False}]},
]


def _ids_scores(results):
    return [(r["qid"], [(c["id"], c["score"]) for c in r["ctxs"]]) for r in results]


@pytest.mark.parametrize("fmt", RUN_FORMATS)
def test_every_format_round_trips(tmp_path, fmt):
    path = tmp_path / f"run.{fmt}"  # a neutral name: the format is told by content
    assert write_run(path, RESULTS, fmt, tag="t") == 2
    assert detect_run_format(path) == fmt
    got = read_run(path)
    assert _ids_scores(got) == _ids_scores(RESULTS)
    if fmt in ("dpr", "pyserini"):  # these carry questions, answers, passage texts and has_answer
        for g, r in zip(got, RESULTS):
            assert (g["question"], g["answers"]) == (r["question"], r["answers"])
            assert [(c["title"], c["text"], c["has_answer"]) for c in g["ctxs"]] == \
                [(c["title"], c["text"], c["has_answer"]) for c in r["ctxs"]]
    if fmt == "compact":
        assert [[c["has_answer"] for c in g["ctxs"]] for g in got] == [[True, False], [False]]
    # what a format cannot carry comes back as None, never as a made-up value
    if fmt in ("trec", "beir"):
        assert all(g["answers"] is None and all(c["has_answer"] is None for c in g["ctxs"]) for g in got)


def test_files_written_by_dpr(tmp_path):
    # DPR's dense_retriever.py: no query ids, scores as strings, ids with the "wiki:" prefix
    path = tmp_path / "nq-test.json"
    path.write_text(json.dumps([{"question": "who got the first nobel prize in physics", "answers": ["Röntgen"],
                                 "ctxs": [{"id": "wiki:628725", "title": "Nobel Prize", "text": "Röntgen won it",
                                           "score": "82.69", "has_answer": True}]}]), encoding="utf-8")
    [got] = read_run(path)
    assert got["qid"] == "0" and got["ctxs"][0]["id"] == "628725" and got["ctxs"][0]["score"] == 82.69
    assert got["ctxs"][0]["has_answer"] is True


def test_files_written_by_pyserini(tmp_path):
    # pyserini's convert_trec_run_to_dpr_retrieval_run: integer topic ids as keys, scores as strings, the text
    # (with --store-raw) as "title\ntext"; without --store-raw no text at all
    raw = {"0": {"question": "who got the first nobel prize in physics", "answers": ["Wilhelm Conrad Röntgen"],
                 "contexts": [{"docid": "628725", "score": "82.69", "text": "Nobel Prize\nRöntgen won the first",
                               "has_answer": False},
                              {"docid": "284453", "score": "80.1", "text": "Röntgen\nWilhelm Conrad Röntgen won",
                               "has_answer": True}]},
           "1": {"question": "q", "answers": ["x"], "contexts": [{"docid": "7", "score": "1.5", "has_answer": False}]}}
    path = tmp_path / "run.dpr.json"
    path.write_text(json.dumps(raw, indent=4), encoding="utf-8")
    assert detect_run_format(path) == "pyserini"
    got = read_run(path)
    assert [g["qid"] for g in got] == ["0", "1"]
    first = got[0]["ctxs"][1]
    assert (first["id"], first["score"], first["title"], first["text"], first["has_answer"]) == \
        ("284453", 80.1, "Röntgen", "Wilhelm Conrad Röntgen won", True)
    assert got[1]["ctxs"][0]["text"] is None
    assert main(["evaluate", str(path), "--ks", "1,2", "--json"]) == 0


def test_fastdpr_runs_read_by_pyserini_conventions(tmp_path):
    """pyserini's evaluate_dpr_retrieval reads run[qid]["answers"] and run[qid]["contexts"], and per context
    "has_answer", else the line after the title in "text". Score a written run that way."""
    path = tmp_path / "run.json"
    write_run(path, RESULTS, "pyserini")
    run = json.loads(path.read_text(encoding="utf-8"))
    for qid, r in zip(run, RESULTS):
        assert qid == r["qid"] and run[qid]["answers"] == r["answers"]
        for ctx, c in zip(run[qid]["contexts"], r["ctxs"]):
            assert ctx["docid"] == c["id"] and ctx["has_answer"] == c["has_answer"]
            assert ctx["text"].split("\n")[1] == c["text"]
    first = [next((i for i, c in enumerate(v["contexts"]) if c["has_answer"]), None) for v in run.values()]
    assert first == [0, None]


def test_beir_and_compact_files(tmp_path, capsys):
    beir = tmp_path / "results.json"
    beir.write_text(json.dumps({"q1": {"d1": 0.5, "d2": 0.9, "d3": 0.5}}), encoding="utf-8")
    assert [(c["id"], c["score"]) for c in read_run(beir)[0]["ctxs"]] == [("d2", 0.9), ("d1", 0.5), ("d3", 0.5)]
    # the quickstart's runs/*.json: it was taken for a TREC run ("301000 fields") before formats were detected
    compact = tmp_path / "nq_test.hybrid.json"
    compact.write_text(json.dumps({"nq-5": [["p1", 0.9, False], ["p2", 0.8, True]], "nq-9": [["p3", 0.7, False]]}),
                       encoding="utf-8")
    assert detect_run_format(compact) == "compact"
    assert main(["evaluate", str(compact), "--ks", "1,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 2, "top1": 0.0, "top2": 0.5}


@pytest.mark.parametrize("content, why", [
    ("q1 Q0 d1 1\n", "first line 'q1 Q0 d1 1'"),
    ('{"q1": {"docid": "d1"}}', "none of the shapes"),
    ('{"q1": ', "not one JSON object"),
    ("", "empty file"),
])
def test_unknown_run_names_the_formats_tried(tmp_path, content, why):
    path = tmp_path / "run.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_run(path)
    message = str(info.value)
    assert why in message and str(path) in message
    for name in ("DPR retriever results", "pyserini", "BEIR", "compact", "TREC"):
        assert name in message


def test_cli_format_lists_match_the_library():
    from fastdpr.commands import evaluate, search

    assert evaluate.RUN_FORMATS == search.RUN_FORMATS == RUN_FORMATS


def test_attach_answers_and_texts(tmp_path):
    write_passages(tmp_path / "p.tsv", [{"id": "d1", "title": "T", "text": "Paris is here"}])
    write_qa(tmp_path / "qa.tsv", [{"question": "where?", "answers": ["Paris"]}])
    results = [{"qid": "0", "question": None, "answers": None, "ctxs": [{"id": "d1", "score": 1.0}]}]
    attach_answers(results, tmp_path / "qa.tsv")
    attach_texts(results, tmp_path / "p.tsv")
    assert results[0]["answers"] == ["Paris"] and results[0]["ctxs"][0]["text"] == "Paris is here"
    results[0]["ctxs"].append({"id": "nope", "score": 0.0})
    with pytest.raises(InputError, match="'nope' of query '0' is not in the corpus"):
        attach_texts(results, Corpus.open(tmp_path / "p.tsv"))


# ---- has_answer over a ranking ---------------------------------------------------------------------------------


class CountingCorpus:
    def __init__(self, passages):
        self.corpus = Corpus.from_passages(passages)
        self.reads = 0

    def __getitem__(self, row):
        self.reads += 1
        return self.corpus[row]

    def get(self, pid):
        self.reads += 1
        return self.corpus.get(pid)


def test_ranking_hits_takes_rows_ids_pairs_and_passages():
    passages = [{"id": "a", "title": "Paris", "text": "Lyon"}, {"id": "b", "title": "", "text": "Paris, France"},
                {"id": "c", "title": "", "text": "Rome"}]
    corpus = CountingCorpus(passages)
    answers = [["Paris"], ["Rome"]]
    expected = [[False, True], [False, True]]
    assert ranking_hits([[0, 1], [1, 2]], answers, corpus) == expected
    assert ranking_hits([[0, 1, -1], [1, 2, -1]], answers, corpus) == expected  # -1: no result, skipped
    assert ranking_hits([["a", "b"], ["b", "c"]], answers, corpus) == expected
    assert ranking_hits([[("a", 2.0), ("b", 1.0)], [("b", 3.0), ("c", 1.0)]], answers, corpus) == expected
    assert ranking_hits([[passages[0], passages[1]], [passages[1], passages[2]]], answers) == expected
    assert ranking_hits([["c"]], [[r"R\w+e"]], corpus, mode="regex") == [[True]]
    assert topk_accuracy(ranking_hits([[0, 1], [1, 2]], answers, corpus), ks=(1, 2)) == {"top1": 0.0, "top2": 1.0}
    with pytest.raises(ValueError, match="rankings"):
        ranking_hits([[0]], answers, corpus)
    with pytest.raises(ValueError, match="not in the corpus"):
        ranking_hits([["zz"]], [["x"]], corpus)


def test_ranking_hits_memo_reads_each_passage_once_across_retrievers():
    passages = [{"id": str(i), "title": "", "text": f"word{i} here"} for i in range(10)]
    corpus = CountingCorpus(passages)
    answers = [["word3"], ["word7"]]
    memo = [{}, {}]
    dense = ranking_hits([[1, 2, 3], [7, 8]], answers, corpus, memo=memo)
    reads = corpus.reads
    assert reads == 5
    sparse = ranking_hits([[3, 2, 4], [8, 7]], answers, corpus, memo=memo)
    assert corpus.reads == reads + 1  # only row 4 of question 0 is new
    assert (dense, sparse) == ([[False, False, True], [True, False]], [[True, False, False], [False, True]])
    with pytest.raises(ValueError, match="memo"):
        ranking_hits([[1]], [["x"]], corpus, memo=[{}, {}])
