import json
import math
import re
from pathlib import Path

import bm25s
import numpy as np
import pytest
import Stemmer

from fastdpr.errors import InputError
from fastdpr.sparse import BM25
from fastdpr.sparse.bm25 import LUCENE_LIKE_SPLITTER, passage_text


def _read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def squad():
    return _read_jsonl(DATA / "sparse_squad_passages.jsonl"), _read_jsonl(DATA / "sparse_squad_questions.jsonl")


@pytest.fixture(scope="module")
def bm25(squad):
    passages, _ = squad
    # a generator: the index must be built from a stream, not a list
    return BM25.from_corpus((p for p in passages), show_progress=False)


def _ids_agree(ids_a, ids_b, scores):
    """Rankings agree up to the order of passages with equal scores (including ties with passages just past
    the cut-off, i.e. with the last listed score)."""
    for row_a, row_b, row_s in zip(ids_a, ids_b, scores):
        for j, s in enumerate(row_s):
            tied = np.sum(np.isclose(row_s, s, rtol=0, atol=1e-6)) > 1 or np.isclose(s, row_s[-1], atol=1e-6)
            if not tied:
                assert row_a[j] == row_b[j]


def test_matches_bm25s_used_directly(squad, bm25):
    passages, questions = squad
    queries = [q["question"] for q in questions]
    tokenizer = bm25s.tokenization.Tokenizer(splitter=LUCENE_LIKE_SPLITTER, stopwords="english",
                                             stemmer=Stemmer.Stemmer("porter"))
    corpus_tokens = tokenizer.tokenize([passage_text(p) for p in passages], return_as="tuple", show_progress=False)
    reference = bm25s.BM25(k1=0.9, b=0.4, method="lucene", backend="numba")
    reference.index(corpus_tokens, show_progress=False)
    query_tokens = tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
    ref_rows, ref_scores = reference.retrieve(query_tokens, k=10, show_progress=False, n_threads=1)
    ref_ids = np.array([p["id"] for p in passages])[ref_rows]

    scores, ids = bm25.search(queries, k=10, threads=1)
    assert scores.dtype == np.float32 and scores.shape == (len(queries), 10) and ids.shape == (len(queries), 10)
    # bm25s fills a short list with passages of score 0 (no term in common): fastdpr leaves them out
    matched = ref_scores > 0
    assert (~matched).any()  # the sample holds questions with fewer than 10 matching passages
    np.testing.assert_allclose(scores[matched], ref_scores[matched], rtol=1e-6, atol=1e-6)
    assert np.isneginf(scores[~matched]).all() and (ids[~matched] == "").all()
    _ids_agree(np.where(matched, ids, ""), np.where(matched, ref_ids, ""), np.where(matched, scores, 0))
    assert (scores[:, 0] > 0).all()
    assert np.all(np.diff(np.where(matched, scores, 0), axis=1) <= 1e-6)  # best first


def test_scores_follow_lucene_bm25_formula():
    # hand-computed Lucene BM25 (k1=0.9, b=0.4, idf = ln(1 + (N - df + .5)/(df + .5))) on a 3-passage corpus
    docs = [{"id": "a", "title": "", "text": "apple banana apple"},
            {"id": "b", "title": "", "text": "banana cherry"},
            {"id": "c", "title": "", "text": "cherry cherry cherry durian"}]
    index = BM25.from_corpus(docs, stemmer=None, show_progress=False)
    k1, b, n = 0.9, 0.4, 3
    lengths = {"a": 3, "b": 2, "c": 4}
    avgdl = sum(lengths.values()) / n

    def term(tf, df, dl):
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))

    expected = {"a": term(2, 1, 3) + term(1, 2, 3), "b": term(1, 2, 2) + term(1, 2, 2), "c": term(3, 2, 4)}
    scores, ids = index.search(["apple banana cherry"], k=3, threads=1)
    got = dict(zip(ids[0], scores[0]))
    for pid, value in expected.items():
        assert got[pid] == pytest.approx(value, rel=1e-5)


def test_all_threads_equal_one_thread(squad, bm25):
    queries = [q["question"] for q in squad[1]]
    s1, i1 = bm25.search(queries, k=20, threads=1)
    s2, i2 = bm25.search(queries, k=20, threads=None, batch_size=37)  # odd batches across the boundary
    np.testing.assert_array_equal(s1, s2)
    _ids_agree(i1, i2, s1)


def test_save_load_round_trip(tmp_path, squad, bm25):
    queries = [q["question"] for q in squad[1]][:50]
    before = bm25.search(queries, k=15, threads=1)
    bm25.save(tmp_path / "idx")
    for mmap in (False, True):
        loaded = BM25.load(tmp_path / "idx", mmap=mmap)
        assert len(loaded) == len(bm25)
        assert loaded.params == bm25.params
        after = loaded.search(queries, k=15, threads=1)
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[1], after[1])
    # saving again over an existing index replaces it, leaving no temporary directories behind
    small = BM25.from_corpus([{"id": "x", "title": "", "text": "lonely passage"}], show_progress=False)
    small.save(tmp_path / "idx")
    assert len(BM25.load(tmp_path / "idx")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def test_save_refuses_to_overwrite_other_directories(tmp_path, bm25):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="refusing to overwrite"):
        bm25.save(target)
    assert (target / "notes.txt").read_text() == "keep me"


def test_load_rejects_non_index_directories(tmp_path):
    with pytest.raises(InputError, match="not a fastdpr BM25 index"):
        BM25.load(tmp_path)
    (tmp_path / "fastdpr_bm25.json").write_text("{broken")
    with pytest.raises(InputError, match="unreadable"):
        BM25.load(tmp_path)


def test_bad_corpora_are_reported():
    with pytest.raises(InputError, match="empty corpus"):
        BM25.from_corpus([], show_progress=False)
    with pytest.raises(InputError, match="'p1' occurs 2 times"):
        BM25.from_corpus([{"id": "p1", "text": "a b"}, {"id": "p1", "text": "c d"}], show_progress=False)
    with pytest.raises(InputError, match="passage #1"):
        BM25.from_corpus([{"id": "p1", "text": "a b"}, {"title": "no id"}], show_progress=False)
    with pytest.raises(ValueError, match="k1"):
        BM25(k1=-1.0)


def test_analysis_stems_drops_stopwords_and_possessives():
    docs = [{"id": "run", "title": "", "text": "She runs every morning."},
            {"id": "obama", "title": "Barack Obama", "text": "Obama's presidency began in 2009."},
            {"id": "stop", "title": "", "text": "the of and"}]
    index = BM25.from_corpus(docs, show_progress=False)
    _, ids = index.search(["running", "obama"], k=1, threads=1)
    assert list(ids[:, 0]) == ["run", "obama"]
    # a query of stopwords or unknown words matches nothing (and the term-less passage is not a match for it)
    scores, ids = index.search(["the", "zzzz qqqq", ""], k=3, threads=1)
    assert np.isneginf(scores).all() and (ids == "").all()
    assert re.compile(LUCENE_LIKE_SPLITTER).findall("obama's u.s.a 1,000 don't") == ["obama", "u.s.a", "1,000", "don't"]


def test_only_matching_passages_are_results_and_the_tail_is_padded(bm25):
    # k beyond the corpus and beyond the passages sharing a term: (n, k) as asked, padded as dense search pads
    scores, ids = bm25.search(["who won the super bowl", "zzzz qqqq"], k=10_000, threads=1)
    rows = bm25.search_rows(["who won the super bowl", "zzzz qqqq"], k=10_000, threads=1)[1]
    assert scores.shape == ids.shape == rows.shape == (2, 10_000)
    found = scores[0] > 0
    assert 0 < found.sum() < len(bm25)  # the question matches some passages, not all
    assert found[: found.sum()].all()  # matches first, best first
    assert len(set(ids[0, found])) == found.sum()
    assert np.isneginf(scores[0, ~found]).all() and (ids[0, ~found] == "").all() and (rows[0, ~found] == -1).all()
    assert np.isneginf(scores[1]).all() and (rows[1] == -1).all()


def test_k_is_validated(bm25):
    with pytest.raises(ValueError):
        bm25.search(["x"], k=0)
    with pytest.raises(TypeError):
        bm25.search("a single string", k=1)


def test_title_is_indexed():
    docs = [{"id": "t", "title": "Zanzibar", "text": "An island."}, {"id": "u", "title": "Other", "text": "Land."}]
    _, ids = BM25.from_corpus(docs, show_progress=False).search(["zanzibar"], k=1, threads=1)
    assert ids[0, 0] == "t"


def test_numpy_backend_gives_the_same_results(squad, bm25):
    passages, questions = squad
    queries = [q["question"] for q in questions[:60]]
    plain = BM25.from_corpus(passages, backend="numpy", show_progress=False)
    assert plain.backend == "numpy" and bm25.backend == "numba"
    s_np, i_np = plain.search(queries, k=10, threads=1)
    s_nb, i_nb = bm25.search(queries, k=10, threads=1)
    np.testing.assert_allclose(s_np, s_nb, rtol=1e-6, atol=1e-6)
    _ids_agree(i_np, i_nb, s_nb)


def test_n_threads_is_the_deprecated_name_of_threads():
    bm25 = BM25.from_corpus([{"id": "a", "title": "", "text": "apple pie"}, {"id": "b", "title": "", "text": "pear"}],
                            show_progress=False)
    with pytest.warns(DeprecationWarning, match="threads"):
        _, ids = bm25.search(["apple"], k=1, n_threads=1)
    assert ids[0, 0] == "a"
    with pytest.raises(TypeError, match="not both"):
        bm25.search(["apple"], k=1, threads=2, n_threads=1)


def test_a_second_process_loads_the_compiled_search_instead_of_compiling(tmp_path):
    # every BM25 process used to pay numba's compilation first (seconds, all of a one-question search); the kernels
    # are cached on disk (here in NUMBA_CACHE_DIR, as where site-packages is read-only), so only the first compiles
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json\n"
        "from fastdpr.sparse import BM25, _topk\n"
        "bm25 = BM25.from_corpus([{'id': 'a', 'title': '', 'text': 'cats purr'},"
        " {'id': 'b', 'title': '', 'text': 'dogs bark'}], show_progress=False)\n"
        "scores, ids = bm25.search(['do cats purr'], k=2, threads=1)\n"
        "stats = _topk._search_serial.stats\n"
        "print(json.dumps({'ids': ids.tolist(), 'hits': sum(stats.cache_hits.values()),"
        " 'misses': sum(stats.cache_misses.values())}))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0]["ids"] == runs[1]["ids"] == [["a", ""]]
    assert runs[0]["misses"] == 1 and runs[1] == {**runs[1], "hits": 1, "misses": 0}
    assert any((tmp_path / "numba").rglob("*.nbi"))


def test_a_k_far_beyond_the_corpus_is_refused_before_allocating(bm25):
    """k = 1e8 over a small corpus: memory would grow with k (12 bytes a column and question), not with the corpus."""
    with pytest.raises(InputError, match=f"larger than the BM25 index .{len(bm25)} passages.*ask for k <= {len(bm25)}"):
        bm25.search_rows(["who won the super bowl"] * 8, k=100_000_000, threads=1)
