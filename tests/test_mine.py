import json
from pathlib import Path

import pytest

from fastdpr.data import Corpus
from fastdpr.sparse import BM25, mine_hard_negatives
from fastdpr.text.answers import has_answer

DATA = Path(__file__).parent / "data"


def _read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def setup():
    passages = _read_jsonl(DATA / "sparse_squad_passages.jsonl")
    questions = _read_jsonl(DATA / "sparse_squad_questions.jsonl")
    corpus = Corpus.from_passages(passages)
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    return corpus, bm25, questions


def _without_gold(questions):
    return [{k: v for k, v in q.items() if k != "gold_passage_id"} for q in questions]


def test_bm25_positives_contain_answers_and_negatives_never_do(setup):
    corpus, bm25, questions = setup
    mined = mine_hard_negatives(_without_gold(questions), bm25, corpus, n_hard=5, depth=30, batch_size=64,
                                threads=1, show_progress=False)
    records = list(mined)
    stats = mined.stats
    assert stats.questions == len(questions)
    assert stats.kept == len(records) and stats.kept + stats.dropped_no_positive == stats.questions
    assert stats.positives_bm25 == stats.kept and stats.positives_gold == 0
    assert stats.kept > 0.8 * len(questions)  # SQuAD questions are lexical: BM25 finds most answers in its top 30
    assert stats.hard_negatives == sum(len(r["hard_negative_ctxs"]) for r in records)
    for rec in records:
        assert len(rec["positive_ctxs"]) == 1
        assert all(has_answer(c["text"], rec["answers"]) for c in rec["positive_ctxs"])
        assert not any(has_answer(c["text"], rec["answers"]) for c in rec["hard_negative_ctxs"])
        assert 0 < len(rec["hard_negative_ctxs"]) <= 5
        ids = [c["passage_id"] for c in rec["positive_ctxs"] + rec["hard_negative_ctxs"]]
        assert len(ids) == len(set(ids))
        assert all(c["score"] > 0 for c in rec["hard_negative_ctxs"])


def test_positive_is_the_best_ranked_answer_passage_and_negatives_follow_bm25_order(setup):
    corpus, bm25, questions = setup
    sample = _without_gold(questions[:40])
    records = {r["qid"]: r for r in mine_hard_negatives(sample, bm25, corpus, n_hard=3, depth=50, threads=1,
                                                         show_progress=False)}
    scores, ids = bm25.search([q["question"] for q in sample], k=50, threads=1)
    for q, srow, irow in zip(sample, scores, ids):
        ranked = [(str(pid), s) for pid, s in zip(irow, srow) if s > 0]
        answer_flags = [has_answer(corpus.get(pid)["text"], q["answers"]) for pid, _ in ranked]
        if not any(answer_flags):
            assert q["qid"] not in records
            continue
        rec = records[q["qid"]]
        assert rec["positive_ctxs"][0]["passage_id"] == ranked[answer_flags.index(True)][0]
        expected_negatives = [pid for (pid, _), flag in zip(ranked, answer_flags) if not flag][:3]
        assert [c["passage_id"] for c in rec["hard_negative_ctxs"]] == expected_negatives


def test_gold_passages_are_positives_and_never_negatives(setup):
    corpus, bm25, questions = setup
    mined = mine_hard_negatives(questions[:60], bm25, corpus, n_hard=10, depth=100, threads=1,
                                show_progress=False)
    records = list(mined)
    assert mined.stats.positives_gold == 60 == mined.stats.kept and mined.stats.dropped_no_positive == 0
    for q, rec in zip(questions, records):
        assert [c["passage_id"] for c in rec["positive_ctxs"]] == [q["gold_passage_id"]]
        assert rec["positive_ctxs"][0]["text"] == corpus.get(q["gold_passage_id"])["text"]
        assert q["gold_passage_id"] not in {c["passage_id"] for c in rec["hard_negative_ctxs"]}
        assert not any(has_answer(c["text"], rec["answers"]) for c in rec["hard_negative_ctxs"])


def test_given_positive_ctxs_and_unknown_gold_ids(setup):
    corpus, bm25, questions = setup
    q = dict(questions[0])
    gold = corpus.get(q.pop("gold_passage_id"))
    with_ctx = dict(q, positive_ctxs=[{"title": gold["title"], "text": gold["text"], "passage_id": gold["id"]}])
    unknown = dict(q, qid="unknown", gold_passage_id="no-such-passage")
    mined = mine_hard_negatives([with_ctx, unknown], bm25, corpus, n_hard=2, threads=1, show_progress=False)
    first, second = list(mined)
    assert first["positive_ctxs"][0]["passage_id"] == gold["id"]
    # an id missing from the corpus is counted and the question falls back to a BM25 positive
    assert mined.stats.gold_not_in_corpus == 1 and mined.stats.positives_bm25 == 1
    assert has_answer(second["positive_ctxs"][0]["text"], second["answers"])


def test_shallow_depth_drops_questions_and_counts_them(setup):
    corpus, bm25, questions = setup
    deep = mine_hard_negatives(_without_gold(questions), bm25, corpus, depth=100, threads=1, show_progress=False)
    shallow = mine_hard_negatives(_without_gold(questions), bm25, corpus, depth=1, threads=1, show_progress=False)
    n_deep, n_shallow = len(list(deep)), len(list(shallow))
    assert n_shallow == shallow.stats.kept < n_deep == deep.stats.kept
    assert shallow.stats.dropped_no_positive == len(questions) - n_shallow > 0


def test_random_negatives_hold_no_answer(setup):
    corpus, bm25, questions = setup
    mined = mine_hard_negatives(questions[:30], bm25, corpus, n_hard=2, n_random=4, seed=7, threads=1,
                                show_progress=False)
    records = list(mined)
    assert mined.stats.random_negatives == sum(len(r["negative_ctxs"]) for r in records) > 0
    for rec in records:
        assert len(rec["negative_ctxs"]) <= 4
        assert not any(has_answer(c["text"], rec["answers"]) for c in rec["negative_ctxs"])
        ids = [c["passage_id"] for c in rec["positive_ctxs"] + rec["hard_negative_ctxs"] + rec["negative_ctxs"]]
        assert len(ids) == len(set(ids))
    again = list(mine_hard_negatives(questions[:30], bm25, corpus, n_hard=2, n_random=4, seed=7, threads=1,
                                     show_progress=False))
    assert again == records  # seeded: the same random negatives


def test_regex_answers(setup):
    corpus, bm25, questions = setup
    q = next(q for q in questions if q["answers"] and q["answers"][0].isdigit())
    pattern = {"qid": "r", "question": q["question"], "answers": [q["answers"][0][:2] + r"\d+"]}
    rec = next(iter(mine_hard_negatives([pattern], bm25, corpus, match="regex", threads=1, show_progress=False)))
    assert has_answer(rec["positive_ctxs"][0]["text"], pattern["answers"], mode="regex")
    assert not any(has_answer(c["text"], pattern["answers"], mode="regex") for c in rec["hard_negative_ctxs"])


def test_bad_arguments(setup):
    corpus, bm25, _ = setup
    with pytest.raises(ValueError):
        mine_hard_negatives([], bm25, corpus, depth=0)
    with pytest.raises(ValueError):
        mine_hard_negatives([], bm25, corpus, match="fuzzy")


def test_gold_document_ids_survive_split_then_mine(tmp_path, capsys):
    """QA files name documents; `fastdpr split` renames passages <doc>#k. Mining maps the gold documents to their
    passages that contain an answer through the split's document map, and says loudly when it cannot."""
    from fastdpr.cli import main
    from fastdpr.data import iter_documents, read_training

    docs = list(iter_documents(DATA / "squad_dev_sample.jsonl"))
    questions = []
    for q in (json.loads(x) for x in open(DATA / "squad_dev_sample.qa.jsonl", encoding="utf-8")):
        owners = [d["id"] for d in docs if has_answer(d["text"], q["answers"])]
        if len(owners) == 1:
            questions.append({**q, "gold_ids": owners})
    assert len(questions) >= 10
    with open(tmp_path / "qa.jsonl", "w", encoding="utf-8") as fh:
        for q in questions:
            fh.write(json.dumps(q) + "\n")
    passages = tmp_path / "passages.tsv"
    assert main(["split", str(DATA / "squad_dev_sample.jsonl"), "-o", str(passages), "--words", "60"]) == 0
    assert main(["bm25", "build", str(passages), "-o", str(tmp_path / "bm25")]) == 0
    corpus = Corpus.open(passages)
    capsys.readouterr()

    mine = ["mine", str(tmp_path / "qa.jsonl"), "--corpus", str(passages), "--bm25", str(tmp_path / "bm25"),
            "--n-hard", "2", "--threads", "1"]
    assert main(mine + ["-o", str(tmp_path / "train.json")]) == 0
    assert "WARNING" not in capsys.readouterr().err
    records = list(read_training(tmp_path / "train.json"))
    by_question = {" ".join(r["question"].split()): r for r in records}
    mapped = 0
    for q in questions:
        doc_passages = [p for p in corpus if p["id"].startswith(q["gold_ids"][0] + "#")]
        expected = [p["id"] for p in doc_passages if has_answer(p["text"], q["answers"])]
        if not expected:
            continue  # the answer was cut by a block boundary: a BM25 positive, counted
        mapped += 1
        rec = by_question[" ".join(q["question"].split())]
        assert [c["passage_id"] for c in rec["positive_ctxs"]] == expected
        assert not set(expected) & {c["passage_id"] for c in rec["hard_negative_ctxs"]}
    assert mapped >= 8

    # without the map the gold ids match nothing: counted, and said on stderr, not silently replaced
    (tmp_path / "passages.tsv.docmap.tsv").rename(tmp_path / "elsewhere.tsv")
    assert main(mine + ["-o", str(tmp_path / "train2.json")]) == 0
    err = capsys.readouterr().err
    assert f"WARNING: {len(questions)} gold ids are not passages" in err and "--docmap" in err
    assert main(mine + ["-o", str(tmp_path / "train3.json"), "--docmap", str(tmp_path / "elsewhere.tsv")]) == 0
    assert "WARNING" not in capsys.readouterr().err
    assert list(read_training(tmp_path / "train3.json")) == records


def test_unknown_gold_ids_warn_in_the_library(setup):
    from fastdpr.sparse.mining import GoldIdsNotFound

    corpus, bm25, questions = setup
    q = dict(questions[0], gold_passage_id="no-such-passage")
    with pytest.warns(GoldIdsNotFound, match="1 gold ids"):
        list(mine_hard_negatives([q], bm25, corpus, n_hard=1, threads=1, show_progress=False))
