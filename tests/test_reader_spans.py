"""Answer-span location on real NQ paragraphs (the committed sample, tests/data/README.md): answers that occur several times,
answers written with other spacing or punctuation than the paragraph's, answers not there, and positives longer
than a reader row."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fastdpr.data import sources
from fastdpr.reader import Reader
from fastdpr.reader.features import answer_char_spans, locate_answer_spans
from fastdpr.reader.training import _fit_positive, prepare_groups
from tiny_models import tiny_bert_dir

SAMPLE = Path(__file__).parent / "data" / "sources" / "nq_paragraphs_sample.jsonl"


@pytest.fixture(scope="module")
def nq():
    return [({"question": r["question"], "answers": r["answers"]}, {"title": "", "text": r["paragraph"]})
            for r in sources.read_jsonl(SAMPLE)]


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    torch.manual_seed(0)
    return Reader.from_pretrained(tiny_bert_dir(tmp_path_factory.mktemp("spans"), dropout=0.0), max_length=128)


def _paragraph(nq, answer):
    return next(p for q, p in nq if q["answers"] == [answer])


def test_every_occurrence_is_found(nq):
    text = _paragraph(nq, "Cersei Lannister")["text"]
    spans = answer_char_spans(text, ["Cersei Lannister"])
    assert len(spans) == text.count("Cersei Lannister") >= 2
    assert all(text[a:b] == "Cersei Lannister" for a, b in spans)
    # case does not matter, and the same answer given twice is one set of spans
    assert answer_char_spans(text, ["cersei LANNISTER", "Cersei Lannister"]) == spans


def test_answers_across_punctuation_and_spacing(nq):
    text = _paragraph(nq, "Robert Mitchum")["text"]
    # the paragraph is tokenised text: "Chicago - based", "`` Beef . It 's What 's For Dinner ''"
    (a, b), = answer_char_spans(text, ["Chicago-based"])
    assert text[a:b] == "Chicago - based"
    (a, b), = answer_char_spans(text, ["Beef. It's What's For Dinner"])
    assert text[a:b] == "Beef . It 's What 's For Dinner"
    # punctuation the paragraph lacks is ignored once the exact token run is not there
    (a, b), = answer_char_spans(text, ["National Livestock, and Meat Board"])
    assert text[a:b] == "National Livestock and Meat Board"
    candace = _paragraph(nq, "Jeremy Johnson")["text"]
    (a, b), = answer_char_spans(candace, ["Phineas's"])
    assert candace[a:b] == "Phineas 's"


def test_answers_not_found(nq):
    text = _paragraph(nq, "Dilip Kumar")["text"]
    assert answer_char_spans(text, ["Raj Kapoor"]) == []
    assert answer_char_spans(text, ["", "   "]) == []
    # whole tokens only: "Kumar" is found, "Kum" (inside "Kumar") is not
    assert answer_char_spans(text, ["Kum"]) == []
    assert len(answer_char_spans(text, ["Kumar"])) == text.count("Kumar")


def test_token_spans_cover_the_answer_text(nq, reader):
    for question, passage in nq:
        row = reader.encode([question["question"]], [passage])[0]
        spans = locate_answer_spans(passage["text"], row.offsets, question["answers"], max_answer_length=30)
        occurrences = [ab for ab in answer_char_spans(passage["text"], question["answers"])
                       if ab[1] <= row.offsets[-1][1]]
        assert len(spans) == len(occurrences)
        for (s, e), (a, b) in zip(spans, occurrences):
            assert row.offsets[s][0] == a and row.offsets[e][1] == b


def test_positive_longer_than_a_row_is_cut_around_its_answer(reader):
    filler = " ".join(["the river runs north to the sea ."] * 40)
    passage = {"id": "p", "title": "", "text": f"{filler} the capital is paris . {filler}"}
    row = reader.encode(["what is the capital"], [passage])[0]
    assert locate_answer_spans(passage["text"], row.offsets, ["paris"]) == []  # beyond the truncated row
    for seed in range(5):
        fitted = _fit_positive(reader, "what is the capital", passage, ["paris"], random.Random(seed))
        assert fitted is not None
        cropped, spans = fitted
        assert cropped["text"] in passage["text"] and len(cropped["text"]) < len(passage["text"])
        row = reader.encode(["what is the capital"], [cropped])[0]
        (s, e), = spans
        assert cropped["text"][row.offsets[s][0] : row.offsets[e][1]] == "paris"
    groups = prepare_groups(reader, [{"question": "what is the capital", "answers": ["paris"], "ctxs": [passage]}])
    assert len(groups) == 1 and groups[0].positives[0][0]["text"] != passage["text"]
