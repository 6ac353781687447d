"""The extractive reader: input layout, answer-span location, span decoding limits, the DPR loss, save/load, and a
tiny model that overfits a few examples."""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from fastdpr.reader import Reader, best_spans, evaluate_answers, locate_answer_spans
from fastdpr.reader.training import reader_loss
from tiny_models import tiny_bert_dir

EXAMPLES = [
    {
        "question": "who was the first president",
        "answers": ["washington"],
        "ctxs": [
            {"id": "p1", "title": "president", "text": "the first president of the united states was washington in 1789"},
            {"id": "p2", "title": "river", "text": "the river runs north to the sea"},
            {"id": "p3", "title": "city", "text": "paris is the capital city of france"},
        ],
    },
    {
        "question": "what is the capital of france",
        "answers": ["Paris"],
        "ctxs": [
            {"id": "p3", "title": "city", "text": "paris is the capital city of france"},
            {"id": "p4", "title": "king", "text": "the king of england lived in london"},
            {"id": "p2", "title": "river", "text": "the river runs north to the sea"},
        ],
    },
    {
        "question": "where did the king live",
        "answers": ["london"],
        "ctxs": [
            {"id": "p4", "title": "king", "text": "the king of england lived in london"},
            {"id": "p3", "title": "city", "text": "paris is the capital city of france"},
        ],
    },
    {
        "question": "when was the first president",
        "answers": ["1789"],
        "ctxs": [
            {"id": "p2", "title": "river", "text": "the river runs north to the sea"},
            {"id": "p1", "title": "president", "text": "the first president of the united states was washington in 1789"},
        ],
    },
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_bert_dir(tmp_path_factory.mktemp("reader"), dropout=0.0)


@pytest.fixture
def reader(tiny_dir):
    torch.manual_seed(0)
    return Reader.from_pretrained(tiny_dir, max_length=64)


# ------------------------------------------------------------------------------------------------ span decoding


def _brute_force(start, end, allowed, max_len):
    best = None
    for s, e in itertools.product(range(len(start)), repeat=2):
        if s <= e < s + max_len and allowed[s] and allowed[e]:
            score = float(start[s] + end[e])
            if best is None or score > best[2]:
                best = (s, e, score)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_best_span_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    for length, max_len in [(1, 1), (7, 3), (23, 10), (40, 1)]:
        start = torch.randn(5, length, generator=g)
        end = torch.randn(5, length, generator=g)
        allowed = torch.rand(5, length, generator=g) > 0.3
        allowed[0] = False  # a row with nothing allowed
        got = best_spans(start, end, allowed, max_len, top_n=3)
        assert got[0] == []
        for i in range(1, 5):
            want = _brute_force(start[i], end[i], allowed[i], max_len)
            if want is None:
                assert got[i] == []
                continue
            s, e, score = got[i][0]
            assert (s, e) == want[:2] and score == pytest.approx(want[2], abs=1e-6)
            for s, e, score in got[i]:
                assert s <= e < s + max_len and allowed[i, s] and allowed[i, e]
            assert [x[2] for x in got[i]] == sorted((x[2] for x in got[i]), reverse=True)


def test_best_span_length_cap_and_order():
    start = torch.tensor([[0.0, 9.0, 0.0, 0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 9.0]])
    allowed = torch.ones(1, 6, dtype=torch.bool)
    assert best_spans(start, end, allowed, max_answer_length=5)[0][0][:2] == (1, 5)
    s, e, _ = best_spans(start, end, allowed, max_answer_length=4)[0][0]
    assert e - s + 1 <= 4
    # an end before the start is never chosen even if it scores best
    end = torch.tensor([[9.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    s, e, _ = best_spans(start, end, allowed, max_answer_length=10)[0][0]
    assert s <= e
    with pytest.raises(ValueError):
        best_spans(start, end, allowed, max_answer_length=0)


# --------------------------------------------------------------------------------------------------- features


def test_input_layout_and_passage_offsets(reader):
    passage = {"title": "president", "text": "The first president was Washington, in 1789."}
    inputs = reader.tokenize(["who was the first president"], [passage])
    tok = reader.tokenizer
    ids = inputs.input_ids[0].tolist()
    first, last = int(inputs.passage_start[0]), int(inputs.passage_end[0])
    q = tok("who was the first president", add_special_tokens=False)["input_ids"]
    t = tok("president", add_special_tokens=False)["input_ids"]
    assert ids[: 2 + len(q)] == [tok.cls_token_id] + q + [tok.sep_token_id]
    assert ids[2 + len(q) : first] == t + [tok.sep_token_id]
    assert ids[last] == tok.sep_token_id and len(ids) == last + 1
    assert inputs.token_type_ids[0, : 2 + len(q)].eq(0).all() and inputs.token_type_ids[0, 2 + len(q) : last + 1].eq(1).all()
    # offsets map passage tokens back to the text
    pieces = [passage["text"][a:b].lower() for a, b in inputs.offsets[0]]
    assert "".join(pieces) == passage["text"].lower().replace(" ", "")
    assert inputs.allowed_mask()[0].nonzero().squeeze(1).tolist() == list(range(first, last))


def test_truncation_keeps_rows_within_max_length(tiny_dir):
    reader = Reader.from_pretrained(tiny_dir, max_length=24, max_question_length=6)
    long = " ".join(["river"] * 100)
    inputs = reader.tokenize([long, "short"], [{"title": long, "text": long}, {"title": "", "text": "the sea"}])
    assert inputs.input_ids.shape[1] == 24
    assert int(inputs.passage_end[0]) - int(inputs.passage_start[0]) >= 1
    assert len(inputs.offsets[0]) == int(inputs.passage_end[0]) - int(inputs.passage_start[0])
    # an empty title adds no [SEP]
    n_short = len(reader.tokenizer("short", add_special_tokens=False)["input_ids"])
    assert int(inputs.passage_start[1]) == 1 + n_short + 1


def test_locate_answer_spans(reader):
    long = "city people world war state school between during known under called"  # 11 in-vocabulary words
    text = "Paris, paris and PARIS; not parisian. Long answer " + long
    offsets = reader.tokenize(["q"], [{"title": "", "text": text}]).offsets[0]
    spans = locate_answer_spans(text, offsets, ["paris"], max_answer_length=10)
    assert len(spans) == 3  # case-insensitive, whole tokens only (not inside "parisian")
    assert all(text[offsets[s][0] : offsets[e][1]].lower() == "paris" for s, e in spans)
    assert locate_answer_spans(text, offsets, [long], max_answer_length=10) == []
    assert len(locate_answer_spans(text, offsets, [long], max_answer_length=11)) == 1
    # an answer cut off by truncation is not located
    assert locate_answer_spans(text, offsets[:5], ["called"], 10) == []
    assert locate_answer_spans(text, offsets, ["", "zzz"], 10) == []


# ---------------------------------------------------------------------------------------------- loss and read


@pytest.mark.parametrize("shared", [True, False])
def test_reader_loss_against_direct_formula(shared):
    g = torch.Generator().manual_seed(0)
    start = torch.randn(5, 8, generator=g, dtype=torch.float64)
    end = torch.randn(5, 8, generator=g, dtype=torch.float64)
    relevance = torch.randn(5, generator=g, dtype=torch.float64)
    allowed = torch.zeros(5, 8, dtype=torch.bool)
    allowed[:, 3:7] = True
    groups = torch.tensor([0, 0, 0, 1, 1])
    spans = [[(3, 4), (5, 5)], [(6, 6)]]
    span_loss, select_loss = reader_loss(start, end, relevance, allowed, torch.tensor([0, 3]), spans, groups, 2,
                                         shared_normalization=shared)
    expected_span = []
    for row, sp, rows in zip([0, 3], spans, [slice(0, 3), slice(3, 5)]):
        # shared: one softmax over the passage tokens of all the question's rows; else the positive's row only
        zs = torch.logsumexp(start[rows, 3:7].flatten() if shared else start[row, 3:7], 0)
        ze = torch.logsumexp(end[rows, 3:7].flatten() if shared else end[row, 3:7], 0)
        expected_span.append(-math.log(sum(math.exp(start[row, s] - zs + end[row, e] - ze) for s, e in sp)))
    assert float(span_loss) == pytest.approx(sum(expected_span) / 2, rel=1e-9)
    sel = [-(relevance[0] - torch.logsumexp(relevance[:3], 0)), -(relevance[3] - torch.logsumexp(relevance[3:], 0))]
    assert float(select_loss) == pytest.approx(float(sum(sel) / 2), rel=1e-9)


def test_read_never_answers_from_question_or_title(reader, monkeypatch):
    passages = [{"id": "a", "title": "paris france", "text": "the river runs north"}]
    first = reader.encode(["what is the capital of france"], passages)[0].passage_start

    def peaked_infer(rows, precision="fp32"):
        n, length = len(rows), max(len(r.ids) for r in rows)
        start = torch.zeros(n, length)
        end = torch.zeros(n, length)
        start[:, 1:4] = 100.0  # question and title tokens score highest
        end[:, 1:4] = 100.0
        start[:, first + 1] = 5.0
        end[:, first + 2] = 5.0
        return start, end, torch.zeros(n)

    monkeypatch.setattr(reader, "infer", peaked_infer)
    out = reader.read(["what is the capital of france"], [passages], top_k=5)
    inputs = reader.tokenize(["what is the capital of france"], passages)
    expected = passages[0]["text"][inputs.offsets[0][1][0] : inputs.offsets[0][2][1]]
    assert out[0]["answer"] == expected and expected.startswith("river")
    assert out[0]["passage_id"] == "a" and out[0]["passage_rank"] == 0
    empty = reader.read(["q"], [[]])
    assert empty[0]["answer"] == "" and empty[0]["passage_id"] is None


def test_tiny_reader_overfits_a_few_examples(reader):
    log = []
    stats = reader.fit(EXAMPLES, max_steps=160, lr=3e-3, batch_size=4, n_passages=3, show_progress=False, log=log)
    assert stats["questions"] == 4 and stats["steps"] == 160
    assert log[-1]["loss"] < 0.1 * log[0]["loss"]
    # passages shuffled: the reader must pick the right passage, not the first one
    retrieved = [list(reversed(ex["ctxs"])) for ex in EXAMPLES]
    predictions = reader.read([ex["question"] for ex in EXAMPLES], retrieved, top_k=3)
    scores = evaluate_answers([p["answer"] for p in predictions], [ex["answers"] for ex in EXAMPLES])
    assert scores["em"] == 1.0 and scores["f1"] == 1.0
    assert [p["passage_id"] for p in predictions] == ["p1", "p3", "p4", "p1"]


def test_save_and_load_round_trip(reader, tmp_path):
    reader.fit(EXAMPLES[:2], max_steps=3, lr=1e-3, show_progress=False)
    reader.save_pretrained(tmp_path / "r")
    again = Reader.from_pretrained(tmp_path / "r")
    assert again.config == reader.config
    inputs = reader.tokenize(["who was the first president"], [EXAMPLES[0]["ctxs"][0]])
    reader.eval()
    for a, b in zip(reader(inputs), again.eval()(inputs)):
        torch.testing.assert_close(a, b)


def test_from_pretrained_errors(tmp_path):
    from fastdpr.errors import InputError

    with pytest.raises(InputError, match="not a model directory"):
        Reader.from_pretrained(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="cannot load"):
        Reader.from_pretrained(tmp_path / "empty")


def test_training_without_any_positive_is_an_error(reader):
    bad = [{"question": "q", "answers": ["zzz"], "ctxs": [{"id": "x", "title": "", "text": "the sea"}]}]
    with pytest.raises(ValueError, match="no training question"):
        reader.fit(bad, max_steps=1, show_progress=False)


def test_evaluate_answers():
    scores = evaluate_answers(["The Paris", "london bridge", ""], [["paris"], ["London"], ["x"]])
    assert scores["em"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)


# ------------------------------------------------------------------------------------------------------- CLI


def test_train_reader_and_read_commands(tiny_dir, tmp_path, capsys):
    from fastdpr.cli import main

    results = tmp_path / "train.json"
    results.write_text(json.dumps(EXAMPLES))
    out_dir = tmp_path / "reader"
    code = main(["train-reader", str(results), "--model", str(tiny_dir), "--out", str(out_dir), "--max-steps", "2",
                 "--max-length", "64", "--quiet"])
    assert code == 0 and (out_dir / "fastdpr_reader.json").is_file()
    predictions = tmp_path / "pred.json"
    assert main(["read", str(results), "--reader", str(out_dir), "--out", str(predictions), "--top-k", "2"]) == 0
    data = json.loads(predictions.read_text())
    assert len(data["predictions"]) == 4 and set(data["metrics"]) == {"em", "f1", "n"}
    assert all(0.0 <= data["metrics"][k] <= 1.0 for k in ("em", "f1"))
    assert "EM" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["read", str(bad), "--reader", str(out_dir), "--out", str(predictions)]) == 2


def test_a_row_longer_than_the_encoder_is_refused_by_name(tmp_path):
    from fastdpr.errors import InputError
    from fastdpr.reader import Reader
    from tiny_models import tiny_bert_dir

    path = tiny_bert_dir(tmp_path)
    import json as _json

    positions = _json.loads((path / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(InputError, match="positions"):
        Reader.from_pretrained(path, max_length=positions + 1)
