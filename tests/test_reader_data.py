"""Reader training data keeps every test question and test paragraph out: the test-only sets entirely, the test
splits of the prepared sets, a training question about a test paragraph (even one stored under another id), and test
paragraphs that BM25 would otherwise bring in as negatives."""
from __future__ import annotations

import json

import pytest

from fastdpr.data import sources
from fastdpr.reader.data import build_training_examples, check_held_out, held_out_paragraphs, text_key


def _write(folder, passages, splits):
    folder.mkdir(parents=True)
    sources.write_passages_jsonl(folder / "passages.jsonl", passages)
    for name, questions in splits.items():
        sources.write_qa_jsonl(folder / f"{name}.jsonl", questions)
    (folder / "counts.json").write_text(json.dumps({"passages": len(passages)}))


def _p(pid, text, title=""):
    return {"id": pid, "title": title, "text": text}


def _q(qid, question, answer, gold):
    return {"qid": qid, "question": question, "answers": [answer], "gold_ids": [gold]}


@pytest.fixture
def cache(tmp_path):
    prepared = tmp_path / "prepared"
    nq_passages = [
        _p("nq-1", "the eiffel tower is in paris and was built in 1889 by gustave eiffel"),
        _p("nq-2", "the river thames flows through london to the north sea"),
        _p("nq-3", "mount everest is the highest mountain on earth at 8849 metres"),
        # the text of nq-2 again under another id and spacing: the same paragraph
        _p("nq-4", "the river  thames flows through London to the north sea"),
        _p("nq-5", "the river seine flows through paris to the english channel"),
    ]
    _write(prepared / "qed", nq_passages, {
        "train": [
            _q("nq-a", "where is the eiffel tower", "paris", "nq-1"),
            _q("nq-b", "which sea does the thames reach", "north sea", "nq-4"),  # a test paragraph
            _q("nq-c", "which river flows through paris", "seine", "nq-5"),
        ],
        "dev": [],
        "test": [_q("nq-t", "where does the thames flow", "london", "nq-2")],
    })
    nyt_passages = [
        _p("nyt-1", "the yankees won the world series in 2009 in new york"),
        _p("nyt-2", "the mets play their home games in queens new york"),
    ]
    _write(prepared / "new_wiki", nyt_passages, {
        "train": [_q("nyt-a", "who won the world series in 2009", "the yankees", "nyt-1"),
                  _q("nyt-b", "where do the mets play", "queens", "nyt-2")],
        "dev": [],
        "test": [_q("nyt-t", "where are the mets", "queens", "nyt-2")],  # nyt-b shares its paragraph
    })
    squad_passages = [_p("squad-1", "the river seine flows through paris and rouen", "Seine"),
                      _p("squad-2", "everest is the highest mountain on earth", "Everest")]
    _write(prepared / "xquad", squad_passages, {"test": [_q("squad-t", "where does the seine flow", "rouen",
                                                             "squad-1")]})
    _write(prepared / "reddit", [_p("reddit-1", "my bike needs new mirrors")],
           {"test": [_q("reddit-t", "what does the bike need", "mirrors", "reddit-1")]})
    _write(prepared / "amazon", [_p("amazon-1", "the holder is not too big")],
           {"test": [_q("amazon-t", "how big is the holder", "not too big", "amazon-1")]})
    return tmp_path


def test_held_out_paragraphs(cache):
    keys = held_out_paragraphs(cache)
    assert text_key("the river thames flows through london to the north sea") in keys
    assert text_key("THE RIVER THAMES  flows through london to the north sea") in keys  # folded text
    assert text_key("the mets play their home games in queens new york") in keys
    assert text_key("the river seine flows through paris and rouen") in keys  # a test-only set
    assert text_key("my bike needs new mirrors") in keys
    assert text_key("the eiffel tower is in paris and was built in 1889 by gustave eiffel") not in keys


def test_no_test_question_or_paragraph_in_training(cache):
    examples, stats = build_training_examples(cache, n_negatives=3,
                                              bm25_backend="numpy")  # numba would spend its time compiling
    qids = {ex["qid"] for ex in examples}
    # the training questions about a test paragraph are gone, with their paragraphs
    assert qids == {"nq-a", "nq-c", "nyt-a"}
    assert stats["sources"]["qed"]["dropped_test_paragraph"] == 1
    assert stats["sources"]["new_wiki"]["dropped_test_paragraph"] == 1
    held_out = held_out_paragraphs(cache)
    assert check_held_out(examples, held_out) == 0
    for ex in examples:
        positive, *negatives = ex["ctxs"]
        assert positive["has_answer"] and ex["answers"][0] in positive["text"]
        assert all(not n["has_answer"] and ex["answers"][0] not in n["text"] for n in negatives)
    # "which river flows through paris": BM25 would rank the (held-out) Thames paragraphs high; they are not
    # negatives, while the other training paragraphs are
    seine = next(ex for ex in examples if ex["qid"] == "nq-c")
    assert {c["id"] for c in seine["ctxs"][1:]} <= {"nq-1", "nq-3"} and len(seine["ctxs"]) > 1


def test_check_held_out_counts_leaks(cache):
    held_out = held_out_paragraphs(cache)
    leak = [{"question": "q", "answers": ["x"],
             "ctxs": [_p("x", "the river seine flows through paris and rouen"), _p("y", "something else")]}]
    assert check_held_out(leak, held_out) == 1


def test_missing_prepared_set_is_an_input_error(tmp_path):
    from fastdpr.errors import InputError

    with pytest.raises(InputError, match="fastdpr data fetch"):
        held_out_paragraphs(tmp_path)


def test_a_test_only_set_is_no_training_source(cache):
    from fastdpr.errors import InputError

    with pytest.raises(InputError, match="no training split"):
        build_training_examples(cache, train_sources=("xquad",), bm25_backend="numpy")
