"""Training batches: interleaved layout, padding, duplicate-passage ids, determinism, sharding over ranks."""
import json

import pytest
import torch

from fastdpr.errors import InputError
from fastdpr.train.data import BatchBuilder, examples_from_records, load_examples, passage_key


def _ctx(pid, text=None):
    return {"title": f"t{pid}", "text": text or f"passage {pid}", "passage_id": str(pid)}


def _records():
    # q0: 3 hard negatives; q1: 1 hard negative; q2: none; q3: hard negative = q0's positive (a duplicate)
    return [
        {"question": "q0", "answers": ["a"], "positive_ctxs": [_ctx(0), _ctx(100)],
         "hard_negative_ctxs": [_ctx(10), _ctx(11), _ctx(12)], "negative_ctxs": [_ctx(50)]},
        {"question": "q1", "answers": [], "positive_ctxs": [_ctx(1)], "hard_negative_ctxs": [_ctx(13)]},
        {"question": "q2", "answers": [], "positive_ctxs": [_ctx(2)], "hard_negative_ctxs": []},
        {"question": "q3", "answers": [], "positive_ctxs": [_ctx(3)], "hard_negative_ctxs": [_ctx(0)]},
        {"question": "no positive", "answers": [], "positive_ctxs": [], "hard_negative_ctxs": [_ctx(9)]},
    ]


def test_records_without_positive_are_skipped_and_ids_are_stable():
    examples = examples_from_records(_records())
    assert [e.question for e in examples] == ["q0", "q1", "q2", "q3"]
    assert examples[0].answers == ["a"]
    # the same passage id gives the same key whatever its text; without an id the text decides
    assert passage_key({"passage_id": "7", "text": "x"}) == passage_key({"passage_id": "7", "text": "y"})
    assert passage_key({"text": "x", "title": "a"}) != passage_key({"text": "x", "title": "b"})
    assert passage_key({"passage_id": None, "text": "x"}) == passage_key({"text": "x"})
    assert 0 <= passage_key({"text": "x"}) < 2**63


def test_layout_padding_and_duplicate_ids():
    examples = examples_from_records(_records())
    builder = BatchBuilder(examples, batch_size=4, n_hard=2, seed=3, shuffle=False, sample_hard=False)
    batch = builder.batch(0, 0)
    g = 3
    assert batch.group == g and batch.n_columns == 12
    assert batch.targets.tolist() == [0, 3, 6, 9]
    valid = batch.column_valid.tolist()
    # q0 full, q1 one hard negative + 1 pad, q2 two pads, q3 one hard negative + 1 pad
    assert valid == [True, True, True, True, True, False, True, False, False, True, True, False]
    assert len(batch.passages) == sum(valid)
    assert batch.passage_columns.tolist() == [j for j, v in enumerate(valid) if v]
    ids = batch.column_ids
    # first positive and the first two hard negatives in file order
    assert [p["text"] for p in batch.passages[:3]] == ["passage 0", "passage 10", "passage 11"]
    # q3's hard negative is q0's positive: same id, so the loss can mask it as a false negative for q0
    assert ids[10] == ids[0]
    # padding ids are unique negatives, never equal to a real id
    pads = ids[~batch.column_valid]
    assert (pads < 0).all() and len(set(pads.tolist())) == len(pads)
    for k, col in enumerate(batch.passage_columns.tolist()):
        assert ids[col] == batch.passages[k]["key"]


def test_random_negatives_fall_back_to_other_positives():
    examples = examples_from_records(_records())
    builder = BatchBuilder(examples, batch_size=4, n_hard=1, n_random=1, seed=0, shuffle=False)
    batch = builder.batch(0, 0)
    assert batch.group == 3
    texts = {col: batch.passages[k]["text"] for k, col in enumerate(batch.passage_columns.tolist())}
    assert texts[2] == "passage 50"  # q0's own random negative
    # q1 has no random negatives: one of the other questions' first positives
    assert texts[5] in {"passage 0", "passage 2", "passage 3"}


def test_batches_are_a_pure_function_of_seed_epoch_position():
    records = [{"question": f"q{i}", "positive_ctxs": [_ctx(i)],
                "hard_negative_ctxs": [_ctx(1000 + 10 * i + j) for j in range(6)]} for i in range(20)]
    examples = examples_from_records(records)
    a = BatchBuilder(examples, batch_size=4, n_hard=2, seed=7)
    b = BatchBuilder(examples, batch_size=4, n_hard=2, seed=7)
    assert a.batches_per_epoch == 5
    for epoch in range(2):
        for pos in (3, 0, 4):  # any order: no hidden iterator state
            x, y = a.batch(epoch, pos), b.batch(epoch, pos)
            assert x.questions == y.questions and torch.equal(x.column_ids, y.column_ids)
    # each epoch reshuffles questions and resamples hard negatives
    e0 = [a.batch(0, p) for p in range(5)]
    e1 = [a.batch(1, p) for p in range(5)]
    assert [x.questions for x in e0] != [x.questions for x in e1]
    assert sorted(q for x in e0 for q in x.questions) == sorted(e.question for e in examples)
    hard0 = {q: set(x.column_ids[i * 3 + 1: i * 3 + 3].tolist()) for x in e0 for i, q in enumerate(x.questions)}
    hard1 = {q: set(x.column_ids[i * 3 + 1: i * 3 + 3].tolist()) for x in e1 for i, q in enumerate(x.questions)}
    assert hard0 != hard1
    assert BatchBuilder(examples, batch_size=4, n_hard=2, seed=8).batch(0, 0).questions != e0[0].questions


def test_shard_splits_questions_and_their_columns():
    examples = examples_from_records(_records())
    batch = BatchBuilder(examples, batch_size=4, n_hard=2, shuffle=False, sample_hard=False).batch(0, 0)
    parts = [batch.shard(r, 2) for r in range(2)]
    assert [p.questions for p in parts] == [["q0", "q1"], ["q2", "q3"]]
    for r, part in enumerate(parts):
        assert part.targets.tolist() == [0, 3]
        lo = r * 6
        assert torch.equal(part.column_ids, batch.column_ids[lo:lo + 6])
        assert torch.equal(part.column_valid, batch.column_valid[lo:lo + 6])
        assert part.passage_columns.tolist() == [c - lo for c in batch.passage_columns.tolist() if lo <= c < lo + 6]
    assert sum(len(p.passages) for p in parts) == len(batch.passages)
    with pytest.raises(ValueError):
        batch.shard(0, 3)


def test_load_examples_reads_dpr_and_tevatron(tmp_path, data_dir):
    examples = load_examples(data_dir / "squad_dev_train_sample.json")
    assert len(examples) == 64 and examples[0].hard_negatives
    tev = tmp_path / "train.jsonl"
    rows = [{"query_id": "1", "query": "who?", "positive_passages": [{"docid": "d1", "title": "T", "text": "x"}],
             "negative_passages": [{"docid": "d2", "title": "T", "text": "y"}]}]
    tev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (example,) = load_examples(tev)
    assert example.question == "who?" and example.hard_negatives[0]["key"] == passage_key({"passage_id": "d2"})
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"question": "q", "positive_ctxs": []}]))
    with pytest.raises(InputError, match="no training question has a positive"):
        load_examples(empty)
