"""fastdpr's BM25 against Lucene (Anserini), the optional peer. Skipped where Lucene cannot run."""
import json
from pathlib import Path

import numpy as np
import pytest

from fastdpr.errors import MissingDependency

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def lucene_world(tmp_path_factory):
    from fastdpr.sparse.lucene import LuceneBM25, lucene_available

    if not lucene_available():
        pytest.skip("Lucene peer not installed (pyjnius, Java >= 11, Anserini jar)")
    passages = [json.loads(line) for line in open(DATA / "sparse_squad_passages.jsonl", encoding="utf-8")]
    questions = [json.loads(line)["question"] for line in open(DATA / "sparse_squad_questions.jsonl",
                                                                 encoding="utf-8")]
    lucene = LuceneBM25.from_corpus(passages, tmp_path_factory.mktemp("lucene") / "index", threads=1)
    return passages, questions, lucene


@pytest.mark.peers
def test_top10_overlaps_lucene(lucene_world):
    from fastdpr.sparse import BM25

    passages, questions, lucene = lucene_world
    assert len(lucene) == len(passages)
    ours = BM25.from_corpus(passages, show_progress=False).search(questions, k=10, threads=1)[1]
    theirs = lucene.search(questions, k=10)[1]
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ours, theirs)])
    assert overlap >= 0.9
    assert np.mean(ours[:, 0] == theirs[:, 0]) >= 0.9


@pytest.mark.peers
def test_lucene_threads_agree(lucene_world):
    _, questions, lucene = lucene_world
    s1, i1 = lucene.search(questions[:50], k=5)
    s2, i2 = lucene.search(questions[:50], k=5, threads=2)
    np.testing.assert_array_equal(s1, s2)
    assert (i1 == i2).all()


def test_missing_jar_is_a_clear_error(monkeypatch, tmp_path):
    from fastdpr.sparse.lucene import anserini_jar

    monkeypatch.setenv("FASTDPR_ANSERINI_JAR", str(tmp_path / "none.jar"))
    with pytest.raises(MissingDependency, match="not a file"):
        anserini_jar()
