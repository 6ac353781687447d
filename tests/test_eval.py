"""Top-k accuracy (DPR counting), ir-measures metrics on a hand-computed example, QA EM/F1, the evaluate CLI."""
import json
import math

import pytest

from fastdpr.cli import main
from fastdpr.data import write_dpr_results, write_passages, write_qa, write_qrels, write_trec
from fastdpr.eval import evaluate_answers, evaluate_retrieval, first_hit_ranks, ir_metrics, topk_accuracy


def test_topk_accuracy_dpr_counting():
    hits = [[False, True, False], [False, False, False], [True], []]
    # first hits at ranks 1, none, 0, none: a question without a hit stays in the denominator
    assert first_hit_ranks(hits) == [1, None, 0, None]
    assert topk_accuracy(hits, ks=(1, 2, 3, 100)) == {"top1": 0.25, "top2": 0.5, "top3": 0.5, "top100": 0.5}
    # later hits do not count twice
    assert topk_accuracy([[True, True, True]], ks=(1, 3)) == {"top1": 1.0, "top3": 1.0}
    with pytest.raises(ValueError):
        topk_accuracy([], ks=(1,))
    with pytest.raises(ValueError):
        topk_accuracy([[True]], ks=(0,))


def test_topk_accuracy_matches_bruteforce():
    import random

    rng = random.Random(7)
    hits = [[rng.random() < 0.1 for _ in range(rng.randint(0, 30))] for _ in range(200)]
    for k in (1, 5, 20, 25):
        expected = sum(any(h[:k]) for h in hits) / len(hits)
        assert topk_accuracy(hits, ks=(k,))[f"top{k}"] == pytest.approx(expected)


QRELS = {"q1": {"d1": 1, "d2": 2, "d8": 0}, "q2": {"d5": 1}, "q3": {"d9": 1}}
RUN = {"q1": [("d3", 3.0), ("d1", 2.0), ("d2", 1.0)], "q2": [("d5", 9.0), ("d6", 8.0)]}


def test_ir_metrics_hand_computed():
    m = ir_metrics(RUN, QRELS, ks=(1, 3))
    # q3 is judged but absent from the run: it scores 0 everywhere
    assert m["mrr@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["mrr@3"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["recall@3"] == pytest.approx((1 + 1 + 0) / 3)
    # nDCG with trec_eval's linear gains: q1 ranks d3 (0), d1 (1), d2 (2)
    dcg = 1 / math.log2(3) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@3"] == pytest.approx((dcg / idcg + 1 + 0) / 3)
    assert m["ndcg@1"] == pytest.approx(1 / 3)


def test_ir_metrics_follow_list_order_on_ties():
    tied = {"q1": [("d1", 1.0), ("d3", 1.0), ("d2", 1.0)]}  # trec_eval alone would re-sort ties by doc id
    m = ir_metrics(tied, {"q1": QRELS["q1"]}, ks=(1,))
    assert m["mrr@1"] == 1.0 and m["recall@1"] == pytest.approx(0.5)


def test_evaluate_retrieval_checks_text_not_title():
    results = [
        {"qid": "a", "answers": ["Paris"], "ctxs": [
            {"id": "1", "title": "Paris", "text": "It is the capital of France."},
            {"id": "2", "title": "", "text": "Lyon is not Paris."}]},
        {"qid": "b", "answers": ["Rome"], "ctxs": [{"id": "3", "title": "Rome", "text": "An old city."}]},
    ]
    assert evaluate_retrieval(results, ks=(1, 2)) == {"questions": 2, "top1": 0.0, "top2": 0.5}
    # stored flags are trusted unless recompute is asked for
    results[1]["ctxs"][0]["has_answer"] = True
    results[0]["ctxs"][0]["has_answer"] = False
    results[0]["ctxs"][1]["has_answer"] = True
    assert evaluate_retrieval(results, ks=(1,))["top1"] == 0.5
    assert evaluate_retrieval(results, ks=(1,), recompute=True)["top1"] == 0.0


def test_evaluate_retrieval_regex_and_qrels():
    results = [{"qid": "q1", "answers": [r"\b2,?[4567][0-9][0-9]\b", "[bad"], "ctxs": [
        {"id": "d3", "text": "Jerusalem is 754 m high"}, {"id": "d1", "text": "about 2,582 feet above sea level"}]}]
    out = evaluate_retrieval(results, ks=(1, 2), qrels={"q1": {"d1": 1}}, mode="regex")
    assert out["top1"] == 0.0 and out["top2"] == 1.0
    assert out["mrr@2"] == pytest.approx(0.5) and out["recall@1"] == 0.0
    # a bare run with qrels
    assert evaluate_retrieval(RUN, ks=(3,), qrels=QRELS)["mrr@3"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        evaluate_retrieval(RUN, ks=(3,))


def test_evaluate_answers():
    out = evaluate_answers(["Denver Broncos", "the cat sat", "x"], [["Denver Broncos"], ["a cat sat on mat"], []])
    assert out["n"] == 3
    assert out["em"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    with pytest.raises(ValueError):
        evaluate_answers(["a"], [])


# ---- the CLI ---------------------------------------------------------------------------------------------------


def test_evaluate_cli_dpr_results(tmp_path, capsys):
    path = tmp_path / "run.json"
    write_dpr_results(path, [
        {"question": "q0", "answers": ["a"], "ctxs": [{"id": "1", "text": "b", "score": 2.0, "has_answer": False},
                                                       {"id": "2", "text": "a", "score": 1.0, "has_answer": True}]},
        {"question": "q1", "answers": ["z"], "ctxs": [{"id": "3", "text": "z", "score": 5.0, "has_answer": True}]},
    ])
    assert main(["evaluate", str(path), "--ks", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "top1" in out and "0.5000" in out and "1.0000" in out
    assert main(["evaluate", str(path), "--ks", "1,2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 2, "top1": 0.5, "top2": 1.0}


def test_evaluate_cli_trec_with_answers_corpus_and_qrels(tmp_path, capsys):
    write_passages(tmp_path / "p.tsv", [
        {"id": "d1", "title": "Paris", "text": "The capital of France."},
        {"id": "d2", "title": "", "text": "Paris is large."},
        {"id": "d3", "title": "", "text": "Rome is old."},
    ])
    write_qa(tmp_path / "qa.tsv", [{"qid": "0", "question": "capital of france?", "answers": ["Paris"]},
                                   {"qid": "1", "question": "old city?", "answers": ["Rome"]}])
    write_trec(tmp_path / "run.trec", {"0": [("d1", 2.0), ("d2", 1.0)], "1": [("d3", 1.0)]})
    write_qrels(tmp_path / "qrels.tsv", {"0": {"d2": 1}, "1": {"d3": 1}})

    args = ["evaluate", str(tmp_path / "run.trec"), "--answers", str(tmp_path / "qa.tsv"), "--ks", "1,2", "--json"]
    assert main(args) == 2
    assert "--corpus" in capsys.readouterr().err  # TREC runs carry no text
    assert main(args + ["--corpus", str(tmp_path / "p.tsv"), "--qrels", str(tmp_path / "qrels.tsv")]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["top1"] == 0.5 and m["top2"] == 1.0  # d1 has "Paris" only in its title: a miss
    assert m["mrr@2"] == pytest.approx((0.5 + 1) / 2) and m["recall@1"] == pytest.approx(0.5)

    assert main(["evaluate", str(tmp_path / "run.trec"), "--qrels", str(tmp_path / "qrels.tsv"), "--ks", "x"]) == 2
    assert main(["evaluate", str(tmp_path / "run.trec")]) == 2
    assert "nothing to evaluate" in capsys.readouterr().err


def test_evaluate_cli_rejects_mismatched_qa_file(tmp_path, capsys):
    write_dpr_results(tmp_path / "run.json", [{"question": "who?", "answers": ["a"], "ctxs": []}])
    write_qa(tmp_path / "qa.tsv", [{"question": "what?", "answers": ["a"]}])
    assert main(["evaluate", str(tmp_path / "run.json"), "--answers", str(tmp_path / "qa.tsv")]) == 2
    assert "differs" in capsys.readouterr().err


def test_evaluate_cli_matches_qa_by_position_when_ids_differ(tmp_path, capsys):
    # DPR results carry no ids (position 0, 1, ...); SQuAD-style QA files have their own
    write_dpr_results(tmp_path / "run.json", [
        {"question": "who?", "answers": [], "ctxs": [{"id": "1", "text": "Ada wrote it", "score": 1.0}]},
        {"question": "what?", "answers": [], "ctxs": [{"id": "2", "text": "nothing", "score": 1.0}]},
    ])
    write_qa(tmp_path / "qa.jsonl", [{"qid": "x9", "question": "who?", "answers": ["Ada"]},
                                     {"qid": "x7", "question": "what?", "answers": ["thing"]}])
    assert main(["evaluate", str(tmp_path / "run.json"), "--answers", str(tmp_path / "qa.jsonl"), "--ks", "1",
                 "--recompute", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == 0.5
    write_qa(tmp_path / "qa3.jsonl", [{"qid": "x9", "question": "who?", "answers": ["Ada"]}])
    assert main(["evaluate", str(tmp_path / "run.json"), "--answers", str(tmp_path / "qa3.jsonl")]) == 2
    assert "different numbers of questions" in capsys.readouterr().err
