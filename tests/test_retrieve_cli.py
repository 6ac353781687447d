import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fastdpr import cli
from fastdpr.data import Corpus, read_run
from fastdpr.text.answers import has_answer

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tiny_models import tiny_biencoder

    from fastdpr.index import build_index

    tmp = tmp_path_factory.mktemp("retrieve_cli")
    passages = [json.loads(line) for line in open(DATA / "sparse_squad_passages.jsonl", encoding="utf-8")][:40]
    with open(tmp / "passages.jsonl", "w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps(p) + "\n")
    ids = {p["id"] for p in passages}
    questions = [json.loads(line) for line in open(DATA / "sparse_squad_questions.jsonl", encoding="utf-8")]
    questions = [q for q in questions if q["gold_passage_id"] in ids][:24]
    for name, part in (("dev", questions[:12]), ("test", questions[12:])):
        with open(tmp / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for q in part:
                fh.write(json.dumps({"qid": q["qid"], "question": q["question"], "answers": q["answers"]}) + "\n")
    model = tiny_biencoder(tmp / "towers")
    model.save_pretrained(tmp / "model")
    corpus = Corpus.open(tmp / "passages.jsonl")
    vectors = model.encode_passages([corpus[i] for i in range(len(corpus))], batch_size=16)
    build_index(vectors, "flat").save(tmp / "index")
    assert cli.main(["bm25", "build", str(tmp / "passages.jsonl"), "-o", str(tmp / "bm25")]) == 0
    return tmp, model, corpus, vectors


def _common(tmp):
    return ["--model", str(tmp / "model"), "--index", str(tmp / "index"), "--bm25", str(tmp / "bm25"),
            "--corpus", str(tmp / "passages.jsonl"), "--threads", "1"]


def test_search_modes(setup):
    tmp, model, corpus, vectors = setup
    for mode in ("dense", "bm25", "hybrid"):
        out = tmp / f"{mode}.json"
        assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", mode, *_common(tmp), "-k", "5",
                         "-o", str(out), "--alpha", "0.5", "--k-union", "20"]) == 0
        results = read_run(out)
        assert len(results) == 12 and all(len(r["ctxs"]) == 5 for r in results)
        for r in results:
            assert all(c["has_answer"] == has_answer(c["text"], r["answers"]) for c in r["ctxs"])
    # dense scores are inner products of the saved model's question vectors with the passage vectors
    dense = read_run(tmp / "dense.json")
    q = model.encode_questions([r["question"] for r in dense])
    for qv, r in zip(q, dense):
        exact = vectors @ qv
        top = np.argsort(-exact)[:5]
        assert [c["id"] for c in r["ctxs"]] == [corpus.id_at(int(i)) for i in top]
        np.testing.assert_allclose([c["score"] for c in r["ctxs"]], exact[top], rtol=1e-3, atol=1e-3)


def test_tune_hybrid_then_search_with_the_tuned_alpha(setup, capsys):
    tmp, *_ = setup
    assert cli.main(["tune-hybrid", str(tmp / "dev.jsonl"), *_common(tmp), "--grid", "0,0.1,1,10", "--at", "3",
                     "-o", str(tmp / "alpha.json"), "--k-union", "20"]) == 0
    tuned = json.loads((tmp / "alpha.json").read_text())
    assert tuned["alpha"] in (0.0, 0.1, 1.0, 10.0) and len(tuned["table"]) == 4 and tuned["metric"] == "top3"
    best = max(tuned["table"], key=lambda r: (r["top3"], -r["alpha"]))
    assert tuned["alpha"] == best["alpha"]
    assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "hybrid", *_common(tmp), "--alpha-file",
                     str(tmp / "alpha.json"), "-o", str(tmp / "tuned.trec"), "-k", "3", "--k-union", "20"]) == 0
    assert len(read_run(tmp / "tuned.trec")) == 12
    capsys.readouterr()
    assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "hybrid", "--bm25", str(tmp / "bm25"),
                     "--corpus", str(tmp / "passages.jsonl"), "-o", str(tmp / "x.json")]) == 2
    assert "--mode hybrid needs --model, --index" in capsys.readouterr().err
