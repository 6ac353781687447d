import json
import shutil
from pathlib import Path

import pytest

from fastdpr import cli
from fastdpr.data import read_run, read_training
from fastdpr.text.answers import has_answer

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sparse_cli")
    shutil.copy(DATA / "sparse_squad_passages.jsonl", tmp / "passages.jsonl")
    questions = [json.loads(line) for line in open(DATA / "sparse_squad_questions.jsonl", encoding="utf-8")][:40]
    with open(tmp / "qa.jsonl", "w", encoding="utf-8") as fh:
        for q in questions:
            fh.write(json.dumps({"qid": q["qid"], "question": q["question"], "answers": q["answers"]}) + "\n")
    assert cli.main(["bm25", "build", str(tmp / "passages.jsonl"), "-o", str(tmp / "bm25")]) == 0
    return tmp, questions


def test_bm25_search_writes_dpr_results_and_trec(files):
    tmp, questions = files
    assert cli.main(["bm25", "search", str(tmp / "bm25"), str(tmp / "qa.jsonl"), "-o", str(tmp / "run.json"),
                     "-k", "7", "--threads", "1"]) == 0
    results = read_run(tmp / "run.json")
    assert [r["qid"] for r in results] == [q["qid"] for q in questions]
    for r in results:
        assert len(r["ctxs"]) == 7
        assert all(c["has_answer"] == has_answer(c["text"], r["answers"]) for c in r["ctxs"])
        assert [c["score"] for c in r["ctxs"]] == sorted((c["score"] for c in r["ctxs"]), reverse=True)
    # SQuAD questions are lexical: the gold paragraph is usually BM25's first hit
    top1 = sum(r["ctxs"][0]["id"] == q["gold_passage_id"] for r, q in zip(results, questions)) / len(questions)
    assert top1 > 0.6
    assert cli.main(["bm25", "search", str(tmp / "bm25"), str(tmp / "qa.jsonl"), "-o", str(tmp / "run.trec"),
                     "-k", "7", "--threads", "1"]) == 0
    trec = read_run(tmp / "run.trec")
    assert [[c["id"] for c in r["ctxs"]] for r in trec] == [[c["id"] for c in r["ctxs"]] for r in results]


def test_bm25_search_errors_are_one_line(files, capsys):
    tmp, _ = files
    assert cli.main(["bm25", "search", str(tmp / "bm25"), str(tmp / "qa.jsonl"), "-o", str(tmp / "x.out")]) == 2
    assert "cannot tell the run format" in capsys.readouterr().err
    assert cli.main(["bm25", "search", str(tmp / "nope"), str(tmp / "qa.jsonl"), "-o", str(tmp / "x.json")]) == 2
    assert "not a fastdpr BM25 index" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["dpr", "tevatron"])
def test_mine_command(files, fmt, capsys):
    tmp, _ = files
    out = tmp / ("train.json" if fmt == "dpr" else "train.jsonl")
    assert cli.main(["mine", str(tmp / "qa.jsonl"), "--corpus", str(tmp / "passages.jsonl"), "--bm25",
                     str(tmp / "bm25"), "-o", str(out), "--n-hard", "4", "--format", fmt, "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    records = list(read_training(out))
    assert f"40 questions: {len(records)} kept" in printed
    assert len(records) > 30
    for rec in records:
        assert rec["positive_ctxs"] and all(has_answer(c["text"], rec["answers"]) for c in rec["positive_ctxs"])
        assert 0 < len(rec["hard_negative_ctxs"]) <= 4
        assert not any(has_answer(c["text"], rec["answers"]) for c in rec["hard_negative_ctxs"])


def test_mine_keeps_gold_positives_of_training_input(files, capsys):
    tmp, questions = files
    corpus = {json.loads(line)["id"]: json.loads(line) for line in open(tmp / "passages.jsonl", encoding="utf-8")}
    gold_input = tmp / "gold.jsonl"
    with open(gold_input, "w", encoding="utf-8") as fh:
        for q in questions[:10]:
            p = corpus[q["gold_passage_id"]]
            fh.write(json.dumps({"question": q["question"], "answers": q["answers"], "positive_ctxs": [
                {"title": p["title"], "text": p["text"], "passage_id": p["id"]}]}) + "\n")
    out = tmp / "gold.train.json"
    assert cli.main(["mine", str(gold_input), "--corpus", str(tmp / "passages.jsonl"), "--bm25", str(tmp / "bm25"),
                     "-o", str(out), "--n-hard", "2", "--threads", "1"]) == 0
    assert "10 gold" in capsys.readouterr().out
    records = list(read_training(out))
    assert [r["positive_ctxs"][0]["passage_id"] for r in records] == [q["gold_passage_id"] for q in questions[:10]]
    for r in records:
        assert r["positive_ctxs"][0]["passage_id"] not in {c["passage_id"] for c in r["hard_negative_ctxs"]}
