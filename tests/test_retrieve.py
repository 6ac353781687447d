import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from fastdpr.data import Corpus
from fastdpr.retrieve import (
    DenseRetriever,
    HybridRetriever,
    SparseRetriever,
    dpr_results,
    fuse,
    hits,
    trec_run,
)
from fastdpr.sparse import BM25
from fastdpr.text.answers import has_answer

DATA = Path(__file__).parent / "data"
DIM = 24


def _read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _embed(text: str) -> np.ndarray:
    """Bag of hashed random word vectors: deterministic, and similar texts get similar vectors."""
    v = np.zeros(DIM)
    for word in text.lower().split():
        v += np.random.default_rng(zlib.crc32(word.strip(".,?!;:'\"()").encode())).standard_normal(DIM)
    return v


class FakeModel:
    """Stands in for a BiEncoder: only ``encode_questions`` is used by DenseRetriever."""

    def __init__(self):
        self.calls = []

    def encode_questions(self, questions, batch_size=64, device=None, show_progress=False):
        self.calls.append(len(questions))
        return np.stack([_embed(q) for q in questions]).astype(np.float32) if questions else np.zeros((0, DIM),
                                                                                                        np.float32)


class BruteForceIndex:
    """Exact inner-product search with numpy; ids are rows, -1 where fewer than k vectors exist."""

    def __init__(self, vectors):
        self.vectors = np.asarray(vectors, dtype=np.float32)

    def search(self, queries, k):
        scores = queries @ self.vectors.T
        n = self.vectors.shape[0]
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(scores, order, axis=1)
        if k > n:
            pad = k - n
            order = np.pad(order, ((0, 0), (0, pad)), constant_values=-1)
            top = np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf)
        return top.astype(np.float32), order.astype(np.int64)


@pytest.fixture(scope="module")
def world():
    passages = _read_jsonl(DATA / "sparse_squad_passages.jsonl")[:60]
    questions = [q for q in _read_jsonl(DATA / "sparse_squad_questions.jsonl")
                 if int(q["gold_passage_id"].split("-")[1]) in (0, 5, 10, 15, 20)][:50]
    corpus = Corpus.from_passages(passages)
    vectors = np.stack([_embed(p["title"] + " " + p["text"]) for p in passages]).astype(np.float32)
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    return corpus, vectors, bm25, questions


# ---------------------------------------------------------------------------------------------- dense / sparse
def test_dense_retriever_equals_brute_force(world):
    corpus, vectors, _, questions = world
    texts = [q["question"] for q in questions]
    model = FakeModel()
    retriever = DenseRetriever(model, BruteForceIndex(vectors), corpus, chunk_size=7)
    got = retriever.retrieve(texts, k=10)
    assert model.calls == [7] * 7 + [1]  # chunked encoding
    q = np.stack([_embed(t) for t in texts]).astype(np.float32)
    expected_scores = q @ vectors.T
    for i, ranking in enumerate(got):
        expected = np.argsort(-expected_scores[i], kind="stable")[:10]
        assert [p["id"] for p in ranking] == [corpus[int(r)]["id"] for r in expected]
        np.testing.assert_allclose([p["score"] for p in ranking], expected_scores[i, expected], rtol=1e-5)
        for p in ranking:
            assert p["text"] == corpus.get(p["id"])["text"] and p["title"] == corpus.get(p["id"])["title"]


def test_dense_retriever_skips_missing_rows_and_handles_empty_input(world):
    corpus, vectors, _, _ = world
    small = DenseRetriever(FakeModel(), BruteForceIndex(vectors[:3]), corpus)
    got = small.retrieve(["what is it"], k=5)
    assert len(got[0]) == 3  # the index padded with -1
    assert small.retrieve([], k=5) == []
    with pytest.raises(TypeError):
        small.retrieve("one string", k=5)
    with pytest.raises(ValueError):
        small.retrieve(["q"], k=0)


def test_sparse_retriever_maps_bm25_ids_to_passages(world):
    corpus, _, bm25, questions = world
    texts = [q["question"] for q in questions[:10]]
    got = SparseRetriever(bm25, corpus, n_threads=1).retrieve(texts, k=5)
    scores, ids = bm25.search(texts, k=5, n_threads=1)
    for ranking, srow, irow in zip(got, scores, ids):
        assert [p["id"] for p in ranking] == list(irow)
        np.testing.assert_allclose([p["score"] for p in ranking], srow)
        assert all(p["text"] == corpus.get(p["id"])["text"] for p in ranking)


# ---------------------------------------------------------------------------------------------- fusion arithmetic
def test_linear_fusion_by_hand():
    dense = [("a", 10.0), ("b", 8.0), ("c", 5.0)]
    sparse = [("c", 20.0), ("d", 12.0), ("b", 4.0)]
    # a: 10 + 0.5*4 (sparse min fills)   = 12
    # b: 8 + 0.5*4                        = 10
    # c: 5 + 0.5*20                       = 15
    # d: 5 (dense min fills) + 0.5*12     = 11
    assert fuse(dense, sparse, alpha=0.5) == [("c", 15.0), ("a", 12.0), ("d", 11.0), ("b", 10.0)]
    assert fuse(dense, sparse, alpha=0.5, k=2) == [("c", 15.0), ("a", 12.0)]
    # alpha = 0: dense order, sparse-only passages tie at the dense minimum after the dense-listed one
    assert [pid for pid, _ in fuse(dense, sparse, alpha=0.0)] == ["a", "b", "c", "d"]


def test_linear_fusion_edge_cases():
    # one side empty: the other side's order and scores (the empty side contributes its fill, 0)
    assert fuse([("a", 2.0), ("b", 1.0)], [], alpha=3.0) == [("a", 2.0), ("b", 1.0)]
    assert fuse([], [("x", 1.0), ("y", 3.0)], alpha=2.0) == [("y", 6.0), ("x", 2.0)]
    # negative scores: the fill is the list minimum, not zero
    assert fuse([("a", -1.0), ("b", -3.0)], [("b", 2.0)], alpha=1.0) == [("a", 1.0), ("b", -1.0)]
    # a passage listed twice on a side keeps its first (best) score
    assert fuse([("a", 5.0), ("a", 1.0)], [("a", 1.0)], alpha=1.0) == [("a", 6.0)]
    with pytest.raises(ValueError):
        fuse([], [], method="max")


def test_reciprocal_rank_fusion_by_hand():
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    sparse = [("c", 30.0), ("a", 20.0), ("d", 1.0)]
    got = dict(fuse(dense, sparse, method="rrf", rrf_k=60))
    assert got["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert got["b"] == pytest.approx(1 / 62)
    assert got["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert got["d"] == pytest.approx(1 / 63)
    assert [pid for pid, _ in fuse(dense, sparse, method="rrf", rrf_k=60)] == ["a", "c", "b", "d"]
    # with rrf_k = 0, ranks dominate: first-ranked on one side beats second-ranked on both
    assert dict(fuse([("a", 1.0)], [("b", 1.0)], method="rrf", rrf_k=0)) == {"a": 1.0, "b": 1.0}


# ---------------------------------------------------------------------------------------------- hybrid retriever
class ListRetriever:
    """A retriever serving fixed rankings (for hybrid tests independent of any model)."""

    def __init__(self, rankings, corpus):
        self.rankings = rankings
        self.corpus = corpus
        self.asked = []

    def ranked_ids(self, questions, k):
        self.asked.append(k)
        return [self.rankings[q][:k] for q in questions]


def test_hybrid_retriever_fuses_each_sides_top_k_union(world):
    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:12]]
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    sparse = SparseRetriever(bm25, corpus, n_threads=1)
    for method in ("linear", "rrf"):
        hybrid = HybridRetriever(dense, sparse, alpha=0.3, k_union=25, method=method)
        got = hybrid.retrieve(texts, k=8)
        d, s = dense.ranked_ids(texts, 25), sparse.ranked_ids(texts, 25)
        for ranking, dl, sl in zip(got, d, s):
            expected = fuse(dl, sl, alpha=0.3, method=method, k=8)
            assert [(p["id"], pytest.approx(p["score"])) for p in ranking] == [(i, sc) for i, sc in expected]
            assert all(p["text"] == corpus.get(p["id"])["text"] for p in ranking)


def test_tune_alpha_picks_the_weight_that_finds_answers(world):
    corpus, _, _, _ = world
    ids = [corpus.id_at(r) for r in range(6)]
    answer_word = corpus.get(ids[5])["text"].split()[2]
    # dense ranks the answer passage last; sparse ranks it first: only a large enough alpha brings it to the top
    passages_with_answer = {pid for pid in ids if has_answer(corpus.get(pid)["text"], [answer_word])}
    q = "question"
    dense_rank = [(pid, 10.0 - i) for i, pid in enumerate(p for p in ids if p not in passages_with_answer)]
    dense_rank += [(pid, 1.0) for pid in sorted(passages_with_answer)]
    sparse_rank = [(pid, 5.0) for pid in sorted(passages_with_answer)] + [(dense_rank[0][0], 1.0)]
    dense = ListRetriever({q: dense_rank}, corpus)
    sparse = ListRetriever({q: sparse_rank}, corpus)
    hybrid = HybridRetriever(dense, sparse, k_union=50)
    best = hybrid.tune_alpha([q], [[answer_word]], grid=[0.0, 0.5, 1.0, 3.0, 10.0], k=1)
    # top-1 needs 1 + 5a > 10 + 1a  <=>  a > 2.25: the smallest such grid value wins the tie with 10.0
    assert best == 3.0
    assert [row["top1"] for row in hybrid.tuning_table] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert dense.asked == [50] and sparse.asked == [50]  # each side searched once for the whole grid
    with pytest.raises(ValueError):
        HybridRetriever(dense, sparse, method="rrf").tune_alpha([q], [[answer_word]])
    with pytest.raises(ValueError):
        hybrid.tune_alpha([q], [])


def test_tune_alpha_table_matches_direct_evaluation(world):
    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:20]]
    answers = [q["answers"] for q in questions[:20]]
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    sparse = SparseRetriever(bm25, corpus, n_threads=1)
    hybrid = HybridRetriever(dense, sparse, k_union=30)
    grid = [0.0, 0.05, 0.5, 5.0]
    best = hybrid.tune_alpha(texts, answers, grid=grid, k=5)
    for row in hybrid.tuning_table:
        hybrid.alpha = row["alpha"]
        results = dpr_results(texts, answers, hybrid.retrieve(texts, k=5))
        assert row["top5"] == pytest.approx(np.mean([any(h) for h in hits(results)]))
    assert best == max(hybrid.tuning_table, key=lambda r: (r["top5"], -r["alpha"]))["alpha"]


# ---------------------------------------------------------------------------------------------- run records
def test_dpr_results_and_trec_run():
    retrieved = [[{"id": "1", "title": "Paris", "text": "The Eiffel Tower is in Paris.", "score": 3.5},
                  {"id": "2", "title": "Eiffel Tower", "text": "A tower in Lyon.", "score": 1.0}]]
    results = dpr_results(["where is the eiffel tower"], [["Paris"]], retrieved)
    assert results == [{"question": "where is the eiffel tower", "answers": ["Paris"], "ctxs": [
        {"id": "1", "title": "Paris", "text": "The Eiffel Tower is in Paris.", "score": 3.5, "has_answer": True},
        {"id": "2", "title": "Eiffel Tower", "text": "A tower in Lyon.", "score": 1.0, "has_answer": False}]}]
    # regex answers (CuratedTREC) and a title-only match that must not count
    regex = dpr_results(["q"], [[r"Par\w+"]], retrieved, match="regex")
    assert hits(regex) == [[True, False]]
    assert hits(dpr_results(["q"], [["Eiffel Tower"]], [retrieved[0][1:]])) == [[False]]
    assert trec_run(["q1"], retrieved) == {"q1": [("1", 3.5), ("2", 1.0)]}
    assert trec_run(["q1"], [[("7", 2.0)]]) == {"q1": [("7", 2.0)]}
    with pytest.raises(ValueError):
        trec_run(["q", "q"], [[], []])
    with pytest.raises(ValueError):
        dpr_results(["a", "b"], [["x"]], retrieved)


# ---------------------------------------------------------------------------------------------- real index
def test_dense_retriever_with_the_real_flat_index(world):
    from fastdpr.index import build_index

    corpus, vectors, _, questions = world
    texts = [q["question"] for q in questions[:15]]
    index = build_index(vectors, "flat")
    real = DenseRetriever(FakeModel(), index, corpus).retrieve(texts, k=10)
    exact = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus).retrieve(texts, k=10)
    for a, b in zip(real, exact):
        np.testing.assert_allclose([p["score"] for p in a], [p["score"] for p in b], rtol=1e-4, atol=1e-4)
        # ids agree except possibly among exactly tied scores
        assert {p["id"] for p in a} == {p["id"] for p in b} or np.isclose(a[-1]["score"], a[-2]["score"])
