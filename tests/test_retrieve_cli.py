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
    best = max(r["top3"] for r in tuned["table"])
    at_one = next(r["top3"] for r in tuned["table"] if r["alpha"] == 1.0)
    # the untuned weight of normalised fusion stays unless another does better; else the smallest of the best
    expected = 1.0 if at_one == best else min(r["alpha"] for r in tuned["table"] if r["top3"] == best)
    assert tuned["alpha"] == expected
    assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "hybrid", *_common(tmp), "--alpha-file",
                     str(tmp / "alpha.json"), "-o", str(tmp / "tuned.trec"), "-k", "3", "--k-union", "20"]) == 0
    assert len(read_run(tmp / "tuned.trec")) == 12
    capsys.readouterr()
    assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "hybrid", "--bm25", str(tmp / "bm25"),
                     "--corpus", str(tmp / "passages.jsonl"), "-o", str(tmp / "x.json")]) == 2
    assert "--mode hybrid needs --model, --index" in capsys.readouterr().err


def test_tune_hybrid_keeps_alpha_one_when_the_dev_set_cannot_tell_weights_apart(setup, capsys):
    # top-40 of a 40-passage corpus is every passage whatever the weight: all alphas tie, and the smallest (0,
    # dense alone) used to be chosen
    tmp, *_ = setup
    capsys.readouterr()
    assert cli.main(["tune-hybrid", str(tmp / "dev.jsonl"), *_common(tmp), "--grid", "0,0.1,1,10", "--at", "40",
                     "-o", str(tmp / "alpha_tied.json"), "--k-union", "40"]) == 0
    tuned = json.loads((tmp / "alpha_tied.json").read_text())
    assert len({r["top40"] for r in tuned["table"]}) == 1
    assert tuned["alpha"] == 1.0
    assert "every alpha gives the same top40" in capsys.readouterr().err
    # raw scores have no untuned weight to keep: ties still go to the smallest
    assert cli.main(["tune-hybrid", str(tmp / "dev.jsonl"), *_common(tmp), "--grid", "0,0.1,1,10", "--at", "40",
                     "--fusion", "linear-raw", "-o", str(tmp / "alpha_raw.json"), "--k-union", "40"]) == 0
    assert json.loads((tmp / "alpha_raw.json").read_text())["alpha"] == 0.0


def test_search_writes_every_run_format_and_evaluate_reads_them(setup, capsys):
    tmp, *_ = setup
    # a TSV question file has no ids: questions are numbered 0, 1, ... in file order, in every format
    questions = [json.loads(line) for line in open(tmp / "test.jsonl", encoding="utf-8")]
    from fastdpr.data import write_qa

    write_qa(tmp / "test.tsv", [{"question": q["question"], "answers": q["answers"]} for q in questions])
    metrics = {}
    for fmt in ("dpr", "pyserini", "trec", "beir", "compact"):
        out = tmp / f"run-{fmt}.out"
        assert cli.main(["search", str(tmp / "test.tsv"), "--mode", "bm25", *_common(tmp), "-k", "5",
                         "--format", fmt, "-o", str(out)]) == 0
        results = read_run(out)
        assert [r["qid"] for r in results] == [str(i) for i in range(len(questions))]
        extra = [] if fmt in ("dpr", "pyserini", "compact") else ["--answers", str(tmp / "test.tsv"), "--corpus",
                                                                  str(tmp / "passages.jsonl")]
        capsys.readouterr()
        assert cli.main(["evaluate", str(out), "--ks", "1,5", "--json", *extra]) == 0
        metrics[fmt] = json.loads(capsys.readouterr().out)
    assert all(m == metrics["dpr"] for m in metrics.values()), metrics


def test_hybrid_warns_only_when_raw_scores_go_untuned(setup, capsys):
    tmp, *_ = setup
    base = ["search", str(tmp / "test.jsonl"), "--mode", "hybrid", *_common(tmp), "-k", "3", "--k-union", "20"]
    assert cli.main(base + ["-o", str(tmp / "h1.trec")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert cli.main(base + ["--fusion", "linear-raw", "-o", str(tmp / "h2.trec")]) == 0
    assert "untuned alpha" in capsys.readouterr().err
    assert cli.main(base + ["--fusion", "linear-raw", "--alpha", "0.02", "-o", str(tmp / "h3.trec")]) == 0
    assert "warning" not in capsys.readouterr().err
    # an alpha file from before fusions were named ("method": "linear") was tuned on raw scores
    (tmp / "old-alpha.json").write_text(json.dumps({"alpha": 0.02, "method": "linear"}), encoding="utf-8")
    assert cli.main(base + ["--alpha-file", str(tmp / "old-alpha.json"), "-o", str(tmp / "h4.trec")]) == 0
    assert read_run(tmp / "h4.trec") == read_run(tmp / "h3.trec")
    assert cli.main(base + ["--alpha-file", str(tmp / "old-alpha.json"), "--fusion", "linear",
                            "-o", str(tmp / "h5.trec")]) == 2
    assert "tuned for --fusion linear-raw" in capsys.readouterr().err


def test_dense_search_with_a_mapped_index_gives_the_same_run(setup):
    tmp, *_ = setup
    runs = []
    for extra in ([], ["--mmap"]):
        out = tmp / f"dense{len(extra)}.json"
        assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "dense", *_common(tmp), "-k", "5",
                         "-o", str(out), *extra]) == 0
        runs.append([[c["id"] for c in r["ctxs"]] for r in read_run(out)])
    assert runs[0] == runs[1]


def test_search_refuses_a_model_other_than_the_one_that_encoded_the_index(setup, tmp_path, capsys):
    # a random model of the same dimension used to search a MiniLM index without a word (top-20 .10): the vectors'
    # manifest records the model, `fastdpr index` carries it into the index file, search compares
    from tiny_models import tiny_biencoder

    from fastdpr.index import load_index

    tmp, _, _, _ = setup
    other = tiny_biencoder(tmp_path / "towers", seed=7)
    other.save_pretrained(tmp_path / "other")
    assert cli.main(["encode", str(tmp / "passages.jsonl"), "--model", str(tmp / "model"),
                     "-o", str(tmp_path / "vectors")]) == 0
    assert cli.main(["index", str(tmp_path / "vectors"), "-o", str(tmp_path / "index.fdpr"), "--spec", "flat"]) == 0
    assert load_index(tmp_path / "index.fdpr").model_fingerprint
    capsys.readouterr()
    base = ["search", str(tmp / "test.jsonl"), "--mode", "dense", "--index", str(tmp_path / "index.fdpr"),
            "--corpus", str(tmp / "passages.jsonl"), "-k", "5"]
    assert cli.main([*base, "--model", str(tmp_path / "other"), "-o", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and "--allow-other-model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "other.json").exists()
    assert cli.main([*base, "--model", str(tmp_path / "other"), "--allow-other-model",
                     "-o", str(tmp_path / "other.json")]) == 0
    assert cli.main([*base, "--model", str(tmp / "model"), "-o", str(tmp_path / "same.json")]) == 0
    # tune-hybrid builds its retriever the same way
    assert cli.main(["tune-hybrid", str(tmp / "dev.jsonl"), "--model", str(tmp_path / "other"), "--index",
                     str(tmp_path / "index.fdpr"), "--bm25", str(tmp / "bm25"), "--corpus",
                     str(tmp / "passages.jsonl"), "-o", str(tmp_path / "alpha.json")]) == 2


def test_a_k_beyond_the_corpus_is_capped_and_said(setup, capsys):
    tmp, _, corpus, _ = setup
    out = tmp / "huge_k.json"
    assert cli.main(["search", str(tmp / "test.jsonl"), "--mode", "bm25", *_common(tmp), "-k", "100000000",
                     "-o", str(out)]) == 0
    assert f"-k 100000000 is more than the corpus holds: {len(corpus)} passages" in capsys.readouterr().err
    assert len(read_run(out)) == 12


def test_questions_without_answers_are_said_at_search_and_refused_at_evaluate(setup, capsys):
    tmp, _, _, _ = setup
    bare = tmp / "bare.jsonl"
    with open(tmp / "test.jsonl", encoding="utf-8") as src, open(bare, "w", encoding="utf-8") as dst:
        for line in src:
            q = json.loads(line)
            dst.write(json.dumps({"qid": q["qid"], "question": q["question"]}) + "\n")
    out = tmp / "bare.json"
    assert cli.main(["search", str(bare), "--mode", "bm25", *_common(tmp), "-k", "3", "-o", str(out)]) == 0
    assert "no question has answers" in capsys.readouterr().err
    assert cli.main(["evaluate", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no question of this run has an answer" in err and "top-1" not in err


def test_an_index_output_ending_in_a_slash_becomes_a_directory(setup, tmp_path, capsys):
    tmp, model, corpus, _ = setup
    vectors = tmp_path / "vectors"
    assert cli.main(["encode", "--model", str(tmp / "model"), str(tmp / "passages.jsonl"), "-o", str(vectors),
                     "--no-progress"]) == 0
    assert cli.main(["index", str(vectors), "-o", str(tmp_path / "newdir") + "/", "--no-progress"]) == 0
    assert (tmp_path / "newdir" / "index.fdpr").is_file()
    assert "auto: flat" in capsys.readouterr().out  # 40 passages: exact search
