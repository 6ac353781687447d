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

    def __len__(self):
        return self.vectors.shape[0]

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
    got = SparseRetriever(bm25, corpus, threads=1).retrieve(texts, k=5)
    scores, ids = bm25.search(texts, k=5, threads=1)
    for ranking, srow, irow in zip(got, scores, ids):
        assert [p["id"] for p in ranking] == list(irow)
        np.testing.assert_allclose([p["score"] for p in ranking], srow)
        assert all(p["text"] == corpus.get(p["id"])["text"] for p in ranking)


def test_sparse_dense_and_hybrid_pad_the_same_way(world):
    # 60 passages, k = 100: every retriever gives (n, 100), rows -1 past the last passage found; BM25 lists only
    # the passages sharing a term with the question, none for a question of unknown words
    corpus, vectors, bm25, questions = world
    texts = [questions[0]["question"], "zzzz qqqq"]
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    for order in (bm25, BM25.from_corpus([corpus[r] for r in range(len(corpus) - 1, -1, -1)], show_progress=False)):
        sparse = SparseRetriever(order, corpus, threads=1)
        for retriever in (dense, sparse, HybridRetriever(dense, sparse)):
            scores, rows = retriever.search(texts, 100)
            assert scores.shape == rows.shape == (2, 100), type(retriever).__name__
            assert (rows[:, len(corpus):] == -1).all()
        scores, rows = sparse.search(texts, 100)
        found = rows[0] >= 0
        assert 0 < found.sum() < len(corpus) and found[: found.sum()].all() and (scores[0, found] > 0).all()
        assert (rows[1] == -1).all() and np.isneginf(scores[1]).all()
        ranked = sparse.ranked_ids(texts, 100)
        assert len(ranked[0]) == found.sum() and ranked[1] == []
        assert [len(r) for r in sparse.retrieve(texts, 100)] == [found.sum(), 0]


# ---------------------------------------------------------------------------------------------- fusion arithmetic
def test_raw_linear_fusion_by_hand():
    dense = [("a", 10.0), ("b", 8.0), ("c", 5.0)]
    sparse = [("c", 20.0), ("d", 12.0), ("b", 4.0)]
    # a: 10 + 0.5*4 (sparse min fills)   = 12
    # b: 8 + 0.5*4                        = 10
    # c: 5 + 0.5*20                       = 15
    # d: 5 (dense min fills) + 0.5*12     = 11
    raw = "linear-raw"
    assert fuse(dense, sparse, alpha=0.5, method=raw) == [("c", 15.0), ("a", 12.0), ("d", 11.0), ("b", 10.0)]
    assert fuse(dense, sparse, alpha=0.5, method=raw, k=2) == [("c", 15.0), ("a", 12.0)]
    # alpha = 0: dense order, sparse-only passages tie at the dense minimum after the dense-listed one
    assert [pid for pid, _ in fuse(dense, sparse, alpha=0.0, method=raw)] == ["a", "b", "c", "d"]


def test_normalised_linear_fusion_by_hand():
    dense = [("a", 0.9), ("b", 0.7), ("c", 0.4)]
    sparse = [("c", 30.0), ("d", 20.0), ("b", 10.0)]
    # min-max per side: dense a 1, b 0.6, c 0 (d missing: 0); sparse c 1, d 0.5, b 0 (a missing: 0)
    got = fuse(dense, sparse)  # the defaults: normalised linear, alpha 1
    assert [pid for pid, _ in got] == ["a", "c", "b", "d"]  # a and c tie at 1.0: the dense list's order first
    assert [s for _, s in got] == pytest.approx([1.0, 1.0, 0.6, 0.5])
    assert dict(fuse(dense, sparse, alpha=2.0)) == pytest.approx({"a": 1.0, "b": 0.6, "c": 2.0, "d": 1.0})
    # rescaling one side changes nothing (the point of normalising); it does change raw fusion
    scaled = [(p, 1000 * s) for p, s in sparse]
    a, b = fuse(dense, scaled, alpha=0.7), fuse(dense, sparse, alpha=0.7)
    assert [p for p, _ in a] == [p for p, _ in b] and [s for _, s in a] == pytest.approx([s for _, s in b])
    assert fuse(dense, scaled, alpha=0.7, method="linear-raw")[0][0] == "c"
    assert fuse(dense, sparse, alpha=0.001, method="linear-raw")[0][0] == "a"
    # a side whose scores are all equal carries no order: it adds 0 everywhere
    assert fuse([("a", 1.0), ("b", 1.0)], [("b", 5.0)]) == [("a", 0.0), ("b", 0.0)]


def test_linear_fusion_edge_cases():
    raw = "linear-raw"
    # one side empty: the other side's order and scores (the empty side contributes its fill, 0)
    assert fuse([("a", 2.0), ("b", 1.0)], [], alpha=3.0, method=raw) == [("a", 2.0), ("b", 1.0)]
    assert fuse([], [("x", 1.0), ("y", 3.0)], alpha=2.0, method=raw) == [("y", 6.0), ("x", 2.0)]
    assert fuse([], []) == []
    # negative scores: the fill is the list minimum, not zero
    assert fuse([("a", -1.0), ("b", -3.0)], [("b", 2.0)], alpha=1.0, method=raw) == [("a", 1.0), ("b", -1.0)]
    # a passage listed twice on a side keeps its first (best) score
    assert fuse([("a", 5.0), ("a", 1.0)], [("a", 1.0)], alpha=1.0, method=raw) == [("a", 6.0)]
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


def _reference_fuse(dense, sparse, alpha, method, rrf_k=60.0):
    """Fusion written the plain way, one passage at a time, to check the vectorised one against."""
    def side(ranked):
        scores, ranks = {}, {}
        for rank, (pid, s) in enumerate(ranked, 1):
            if pid >= 0 and pid not in scores:
                scores[pid], ranks[pid] = s, rank
        return scores, ranks

    (ds, dr), (ss, sr) = side(dense), side(sparse)
    union = list(dict.fromkeys([p for p, _ in dense if p >= 0] + [p for p, _ in sparse if p >= 0]))

    def value(scores, pid):
        low, high = (min(scores.values()), max(scores.values())) if scores else (0.0, 0.0)
        v = scores.get(pid, low)
        if method == "linear-raw":
            return v
        return (v - low) / (high - low) if high > low else 0.0

    def fused(pid):
        if method == "rrf":
            return sum(1 / (rrf_k + r[pid]) for r in (dr, sr) if pid in r)
        return value(ds, pid) + alpha * value(ss, pid)

    order = sorted(range(len(union)), key=lambda j: (-fused(union[j]), j))
    return [(union[j], fused(union[j])) for j in order]


@pytest.mark.parametrize("method", ["linear", "linear-raw", "rrf"])
def test_vectorised_fusion_equals_the_plain_rule(method):
    from fastdpr.retrieve.hybrid import _Union

    rng = np.random.default_rng(3)
    n, kd, ks = 40, 12, 9
    d_rows = rng.integers(0, 30, size=(n, kd))
    s_rows = rng.integers(0, 30, size=(n, ks))  # duplicates within a list happen: the first listing counts
    d_rows[::7, -3:] = -1  # an index found fewer than k
    d_scores = -np.sort(-rng.standard_normal((n, kd)), axis=1)
    s_scores = -np.sort(-rng.gamma(2.0, 5.0, size=(n, ks)), axis=1)
    s_scores[::5] = 3.0  # ties everywhere
    union = _Union(d_scores, d_rows, s_scores, s_rows)
    scores, rows = union.top(union.fused(0.37, method, 60.0), 25)
    for i in range(n):
        expected = _reference_fuse(list(zip(d_rows[i].tolist(), d_scores[i].tolist())),
                                   list(zip(s_rows[i].tolist(), s_scores[i].tolist())), 0.37, method)[:25]
        got = [(r, s) for r, s in zip(rows[i].tolist(), scores[i].tolist()) if r >= 0]
        assert [r for r, _ in got] == [r for r, _ in expected]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected])
        assert (rows[i, len(got):] == -1).all()


# ---------------------------------------------------------------------------------------------- hybrid retriever
class ListRetriever:
    """A retriever serving fixed rankings of passage ids (for hybrid tests independent of any model)."""

    def __init__(self, rankings, corpus):
        self.rankings = rankings
        self.corpus = corpus
        self.asked = []

    def search(self, questions, k):
        self.asked.append(k)
        scores = np.full((len(questions), k), -np.inf)
        rows = np.full((len(questions), k), -1, dtype=np.int64)
        for i, q in enumerate(questions):
            for j, (pid, s) in enumerate(self.rankings[q][:k]):
                scores[i, j], rows[i, j] = s, self.corpus.row_of(pid)
        return scores, rows


def test_hybrid_retriever_fuses_each_sides_top_k_union(world):
    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:12]]
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    sparse = SparseRetriever(bm25, corpus, threads=1)
    for method in ("linear", "linear-raw", "rrf"):
        hybrid = HybridRetriever(dense, sparse, alpha=0.3, k_union=25, method=method, chunk_size=5)
        got = hybrid.retrieve(texts, k=8)
        d, s = dense.ranked_ids(texts, 25), sparse.ranked_ids(texts, 25)
        for ranking, dl, sl in zip(got, d, s):
            expected = fuse(dl, sl, alpha=0.3, method=method, k=8)
            assert [(p["id"], pytest.approx(p["score"])) for p in ranking] == [(i, sc) for i, sc in expected]
            assert all(p["text"] == corpus.get(p["id"])["text"] for p in ranking)
        assert hybrid.ranked_ids(texts, 8) == [[(p["id"], pytest.approx(p["score"])) for p in r] for r in got]


def test_default_hybrid_does_not_depend_on_the_score_scales(world):
    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:12]]

    class Scaled(SparseRetriever):
        def search(self, questions, k):
            scores, rows = super().search(questions, k)
            return scores * 1000.0, rows

    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    plain = HybridRetriever(dense, SparseRetriever(bm25, corpus, threads=1), k_union=20)
    scaled = HybridRetriever(dense, Scaled(bm25, corpus, threads=1), k_union=20)
    assert scaled.search(texts, 10)[1].tolist() == plain.search(texts, 10)[1].tolist()
    raw = [HybridRetriever(dense, side, k_union=20, method="linear-raw") for side in (plain.sparse, scaled.sparse)]
    assert raw[0].search(texts, 10)[1].tolist() != raw[1].search(texts, 10)[1].tolist()


def test_sparse_retriever_maps_bm25_rows_to_corpus_rows(world):
    corpus, _, _, questions = world
    texts = [q["question"] for q in questions[:6]]
    shuffled = [corpus[r] for r in np.random.default_rng(0).permutation(len(corpus))]
    other_order = BM25.from_corpus(shuffled, show_progress=False)
    retriever = SparseRetriever(other_order, corpus, threads=1)
    scores, rows = retriever.search(texts, 5)
    by_id = retriever.ranked_ids(texts, 5)
    for srow, rrow, ranking in zip(scores, rows, by_id):
        assert [corpus.id_at(int(r)) for r in rrow] == [pid for pid, _ in ranking]
        np.testing.assert_allclose(srow, [s for _, s in ranking])


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
    hybrid = HybridRetriever(dense, sparse, k_union=50, method="linear-raw")
    best = hybrid.tune_alpha([q], [[answer_word]], grid=[0.0, 0.5, 1.0, 3.0, 10.0], k=1)
    # top-1 needs 1 + 5a > 10 + 1a  <=>  a > 2.25: the smallest such grid value wins the tie with 10.0
    assert best == 3.0
    assert [row["top1"] for row in hybrid.tuning_table] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert dense.asked == [50] and sparse.asked == [50]  # each side searched once for the whole grid
    # normalised: dense gives the answer passage 0 and the top one 1; sparse gives it 1 and that one 0: alpha > 1
    normalised = HybridRetriever(dense, sparse, k_union=50)
    assert normalised.tune_alpha([q], [[answer_word]], grid=[0.5, 1.0, 1.5, 3.0], k=1) == 1.5
    with pytest.raises(ValueError):
        HybridRetriever(dense, sparse, method="rrf").tune_alpha([q], [[answer_word]])
    with pytest.raises(ValueError):
        hybrid.tune_alpha([q], [])


@pytest.mark.parametrize("method", ["linear", "linear-raw"])
def test_tune_alpha_table_matches_direct_evaluation(world, method):
    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:20]]
    answers = [q["answers"] for q in questions[:20]]
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    sparse = SparseRetriever(bm25, corpus, threads=1)
    hybrid = HybridRetriever(dense, sparse, k_union=30, method=method)
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


def test_a_k_far_beyond_the_corpus_is_refused_by_every_retriever_before_allocating(world):
    from fastdpr.errors import InputError

    corpus, vectors, bm25, questions = world
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    sparse = SparseRetriever(bm25, corpus, threads=1)
    for retriever in (sparse, HybridRetriever(dense, sparse, k_union=20)):
        with pytest.raises(InputError, match=f"ask for k <= {len(corpus)}"):
            retriever.search(["who"] * 8, 100_000_000)


@pytest.mark.parametrize("bad", [{"alpha": float("nan")}, {"alpha": float("inf")}, {"alpha": -float("inf")},
                                 {"rrf_k": float("inf")}, {"rrf_k": float("nan")}])
def test_hybrid_weights_must_be_finite(world, bad):
    corpus, vectors, bm25, _ = world
    dense = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    with pytest.raises(ValueError, match="must be a finite number"):
        HybridRetriever(dense, SparseRetriever(bm25, corpus), **bad)


def test_an_index_larger_than_the_corpus_is_a_clear_error(world):
    from fastdpr.errors import InputError

    corpus, vectors, _, _ = world
    bigger = BruteForceIndex(np.concatenate([vectors, vectors[:5]]))
    with pytest.raises(InputError, match=f"the index has {len(vectors) + 5} vectors but the corpus {len(corpus)}"):
        DenseRetriever(FakeModel(), bigger, corpus)


# ---------------------------------------------------------------------------------------------- search by vectors
def test_dense_encode_gives_the_vectors_search_uses_and_searching_them_gives_the_same(world):
    corpus, vectors, _, questions = world
    texts = [q["question"] for q in questions[:20]]
    model = FakeModel()
    dense = DenseRetriever(model, BruteForceIndex(vectors), corpus, chunk_size=6)
    encoded = dense.encode(texts)
    assert model.calls == [6, 6, 6, 2]  # the rounds search encodes in
    assert encoded.dtype == np.float32 and encoded.shape == (20, DIM) and encoded.flags.c_contiguous
    np.testing.assert_array_equal(encoded, np.stack([_embed(t) for t in texts]).astype(np.float32))
    by_text, by_vector = dense.search(texts, 7), dense.search(encoded, 7)
    np.testing.assert_array_equal(by_vector[0], by_text[0])
    np.testing.assert_array_equal(by_vector[1], by_text[1])
    assert dense.retrieve(encoded, 7) == dense.retrieve(texts, 7)
    assert dense.ranked_ids(encoded, 7) == dense.ranked_ids(texts, 7)
    assert len(model.calls) == 4 * 4  # encode and the three searches of texts; searching vectors encodes nothing


def test_dense_search_by_vectors_with_the_real_model_and_index(world, tmp_path):
    """A BiEncoder and a flat index, fp32 and bf16: searching ``encode(texts)`` is searching the texts, bit for bit;
    one 1-D vector is one question; float16 and float64 vectors are searched as float32."""
    from tiny_models import tiny_biencoder

    from fastdpr.index import build_index

    corpus, _, _, questions = world
    texts = [q["question"] for q in questions[:9]]
    model = tiny_biencoder(tmp_path)
    model.eval()
    index = build_index(model.encode_passages([corpus[r] for r in range(len(corpus))], batch_size=16), "flat")
    for precision in ("auto", "bf16"):
        dense = DenseRetriever(model, index, corpus, batch_size=4, chunk_size=5, precision=precision)
        encoded = dense.encode(texts)
        assert encoded.shape == (9, dense.dim) == (9, model.dim)
        by_text, by_vector = dense.search(texts, 6), dense.search(encoded, 6)
        np.testing.assert_array_equal(by_vector[1], by_text[1])
        np.testing.assert_array_equal(by_vector[0], by_text[0])
        one = dense.search(encoded[3], 6)
        assert one[0].shape == one[1].shape == (1, 6)
        np.testing.assert_array_equal(one[1][0], by_text[1][3])
    for dtype in (np.float16, np.float64):
        scores, rows = dense.search(encoded.astype(dtype), 6)
        as_float32 = dense.search(encoded.astype(dtype).astype(np.float32), 6)
        np.testing.assert_array_equal(scores, as_float32[0])
        np.testing.assert_array_equal(rows, as_float32[1])
        assert scores.dtype == np.float32 and rows.dtype == np.int64
    empty = dense.search(np.zeros((0, model.dim), np.float32), 6)
    assert empty[0].shape == empty[1].shape == (0, 6)
    assert dense.encode([]).shape == (0, model.dim) and dense.retrieve(np.zeros((0, model.dim)), 3) == []


def test_bad_question_vectors_are_clear_errors_before_the_index_sees_them(world):
    from fastdpr.errors import InputError
    from fastdpr.index import build_index

    corpus, vectors, _, _ = world
    dense = DenseRetriever(FakeModel(), build_index(vectors, "flat"), corpus)
    good = np.ones((3, DIM), np.float32)
    with pytest.raises(InputError, match=f"question vectors have d={DIM + 1} but the index holds vectors of d={DIM}"):
        dense.search(np.ones((3, DIM + 1), np.float32), 5)
    with pytest.raises(InputError, match=f"d=5 but the index holds vectors of d={DIM}"):
        dense.search(np.ones(5, np.float32), 5)
    with pytest.raises(InputError, match=r"shape \(n, d\), or \(d,\) for one question; got \(2, 3, 24\)"):
        dense.search(np.ones((2, 3, DIM), np.float32), 5)
    with pytest.raises(InputError, match=r"shape \(n, d\), or \(d,\) for one question; got \(\)"):
        dense.search(np.ones((), np.float32), 5)
    for dtype in (np.int64, np.int32, np.bool_, np.complex64, object):
        with pytest.raises(InputError, match=f"floating point \\(float32\\), got dtype {np.dtype(dtype)}"):
            dense.search(good.astype(dtype), 5)
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = good.copy()
        poisoned[2, 7] = bad
        with pytest.raises(InputError, match="question vector 2 holds NaN or infinity"):
            dense.search(poisoned, 5)
    with pytest.raises(InputError, match="question vector 1 holds NaN or infinity"):  # past float32's range
        dense.search(np.array([[1.0] * DIM, [1e39] * DIM]), 5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        dense.search(good, 0)
    with pytest.raises(TypeError, match="question #0 is list"):  # vectors go as an array, not nested lists
        dense.search(good.tolist(), 5)


def test_the_index_dimension_is_read_from_fastdpr_and_faiss_indexes_else_from_the_model(world):
    corpus, vectors, _, _ = world

    class FaissLike(BruteForceIndex):
        d = DIM

    class ModelWithDim(FakeModel):
        dim = DIM

    assert DenseRetriever(FakeModel(), FaissLike(vectors), corpus).dim == DIM
    assert DenseRetriever(ModelWithDim(), BruteForceIndex(vectors), corpus).dim == DIM
    unknown = DenseRetriever(FakeModel(), BruteForceIndex(vectors), corpus)
    assert unknown.dim is None
    assert unknown.search(np.ones(DIM, np.float32), 3)[1].shape == (1, 3)  # the index is left to judge the size
    with pytest.raises(Exception, match="d=3 but the index holds vectors of d=24"):
        DenseRetriever(FakeModel(), FaissLike(vectors), corpus).search(np.ones((1, 3), np.float32), 3)


def test_sparse_search_by_vectors_is_a_clear_error(world):
    corpus, _, bm25, _ = world
    with pytest.raises(TypeError, match="only dense search takes question vectors"):
        SparseRetriever(bm25, corpus, threads=1).search(np.ones((2, DIM), np.float32), 3)


def test_hybrid_takes_the_dense_sides_vectors_beside_the_texts(world):
    from fastdpr.errors import InputError

    corpus, vectors, bm25, questions = world
    texts = [q["question"] for q in questions[:11]]
    model = FakeModel()
    dense = DenseRetriever(model, BruteForceIndex(vectors), corpus)
    hybrid = HybridRetriever(dense, SparseRetriever(bm25, corpus, threads=1), k_union=15, chunk_size=4)
    encoded = dense.encode(texts)
    calls = len(model.calls)
    by_text = hybrid.search(texts, 8)
    assert len(model.calls) == calls + 3
    by_vector = hybrid.search(texts, 8, vectors=encoded)
    assert len(model.calls) == calls + 3  # the dense side searched the vectors given, and encoded nothing
    np.testing.assert_array_equal(by_vector[0], by_text[0])
    np.testing.assert_array_equal(by_vector[1], by_text[1])
    assert hybrid.retrieve(texts, 8, vectors=encoded) == hybrid.retrieve(texts, 8)
    assert hybrid.ranked_ids(texts, 8, vectors=encoded) == hybrid.ranked_ids(texts, 8)
    # the vectors are what the dense side searches: other vectors, another ranking
    assert hybrid.search(texts, 8, vectors=encoded[::-1].copy())[1].tolist() != by_text[1].tolist()
    with pytest.raises(InputError, match="hybrid search needs the question texts"):
        hybrid.search(encoded, 8)
    with pytest.raises(InputError, match="10 question vectors for 11 questions"):
        hybrid.search(texts, 8, vectors=encoded[:10])
    with pytest.raises(InputError, match="question vector 0 holds NaN"):
        hybrid.search(texts[:1], 8, vectors=np.full(DIM, np.nan))
    with pytest.raises(InputError, match="got dtype int64"):
        hybrid.search(texts[:1], 8, vectors=np.ones((1, DIM), np.int64))
