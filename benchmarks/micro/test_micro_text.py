"""The text hot paths: DPR's ``has_answer`` over a ranking, and BM25 search, on the committed SQuAD dev sample.

``has_answer`` is what mining and evaluation call for every (question, retrieved passage) pair; here each of the
240 questions is checked against the same 20 passages (its own paragraph among them), 4,800 calls a round.
BM25 searches a corpus of the 120 paragraphs plus shuffled-word copies of them (3,000 passages, the same
vocabulary and lengths) with one thread.
"""
import random

import pytest

from fastdpr.sparse import BM25
from fastdpr.text.answers import has_answer

BM25_COPIES = 24  # 120 paragraphs x (1 + 24) = 3,000 passages


def test_has_answer(benchmark, squad_passages, squad_questions):
    benchmark.group = "has_answer"
    by_id = {p["id"]: p["text"] for p in squad_passages}
    pairs = []
    for i, q in enumerate(squad_questions):
        texts = [by_id[q["gold_passage_id"]]] + [squad_passages[(i + j) % len(squad_passages)]["text"]
                                                  for j in range(1, 20)]
        pairs += [(text, q["answers"]) for text in texts]

    hits = benchmark(lambda: sum(has_answer(text, answers) for text, answers in pairs))
    # every question's own paragraph holds its answer (SQuAD spans), and most other paragraphs do not
    assert len(squad_questions) <= hits < len(pairs) // 2


@pytest.fixture(scope="session")
def bm25_corpus(squad_passages):
    rng = random.Random(0)
    corpus = list(squad_passages)
    for c in range(BM25_COPIES):
        for p in squad_passages:
            words = p["text"].split()
            rng.shuffle(words)
            corpus.append({"id": f"{p['id']}-shuffled-{c}", "title": p["title"], "text": " ".join(words)})
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    bm25.search(["warm up numba"], k=10, threads=1)  # the first search pays numba's compilation
    return bm25


def test_bm25_search(benchmark, bm25_corpus, squad_questions):
    benchmark.group = "bm25 search"
    questions = [q["question"] for q in squad_questions]
    benchmark.extra_info.update(passages=len(bm25_corpus), questions=len(questions))
    scores, ids = benchmark(bm25_corpus.search, questions, k=100, threads=1)
    assert ids.shape == (len(questions), 100)
    # a question's own paragraph ranks first or ties with a shuffled copy of it (bag of words: the same score)
    top_paragraphs = [row[0].split("-shuffled-")[0] for row in ids]
    found = sum(top == q["gold_passage_id"] for top, q in zip(top_paragraphs, squad_questions))
    assert found >= 0.5 * len(questions)
