"""Fast reading gives the answers of plain reading: batched across questions and passages (length-sorted, packed)
equals one question at a time; precision settings; ``fit`` and the old ``train(examples)`` spelling; resumable
training; ``train-reader --qa`` retrieving its own passages."""
from __future__ import annotations

import json

import pytest
import torch

from fastdpr.errors import InputError
from fastdpr.reader import Reader
from fastdpr.reader.model import select_answer
from tiny_models import tiny_bert_dir

WORDS = "the river city people world war state school between during known under called paris france london".split()


def _passage(i: int, n_words: int) -> dict:
    words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n_words)]
    return {"id": f"p{i}", "title": WORDS[i % len(WORDS)] if i % 3 else "", "text": " ".join(words)}


QUESTIONS = ["who was the first", "where is paris", "what river runs north", "when did the war start",
             "which school", "how many people live in the city of london"]
# different numbers of passages and lengths, including a question with none and one with a single passage
RETRIEVED = [[_passage(i * 10 + j, 5 + (i * 13 + j * 29) % 60) for j in range(n)]
             for i, n in enumerate([5, 3, 0, 1, 6, 4])]


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    torch.manual_seed(0)
    r = Reader.from_pretrained(tiny_bert_dir(tmp_path_factory.mktemp("read"), dropout=0.0), max_length=64)
    with torch.no_grad():  # random heads give near-ties; larger heads make the argmaxes clear-cut
        r.span_head.weight.mul_(50)
        r.select_head.weight.mul_(50)
    return r


def test_batched_reading_equals_one_question_at_a_time(reader):
    together = reader.read(QUESTIONS, RETRIEVED, top_k=5, batch_size=4)
    for question, passages, want in zip(QUESTIONS, RETRIEVED, together):
        alone = reader.read([question], [passages], top_k=5, batch_size=1)[0]
        assert alone["answer"] == want["answer"]
        assert (alone["passage_id"], alone["start"], alone["end"]) == (want["passage_id"], want["start"], want["end"])
        if want["passage_id"] is not None:
            assert alone["passage_score"] == pytest.approx(want["passage_score"], abs=1e-4)
            assert alone["span_score"] == pytest.approx(want["span_score"], abs=1e-4)
    assert together[2]["answer"] == "" and together[2]["passage_id"] is None
    assert all(p["passage_rank"] is None or p["passage_rank"] < 5 for p in together)


def test_packed_reading_matches_the_padded_forward(reader):
    """The packed inference path gives the logits of the module's own (padded) forward."""
    passages = [p for ps in RETRIEVED for p in ps][:7]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(7)]
    rows = reader.encode(questions, passages)
    order = sorted(range(7), key=lambda i: len(rows[i].ids), reverse=True)
    start, end, relevance = reader.infer([rows[i] for i in order], "fp32")
    reader.eval()
    with torch.no_grad():
        ref_start, ref_end, ref_relevance = reader(reader.tokenize([questions[i] for i in order],
                                                                   [passages[i] for i in order]))
    for j, i in enumerate(order):
        n = len(rows[i].ids)
        torch.testing.assert_close(start[j, :n], ref_start[j, :n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(end[j, :n], ref_end[j, :n], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(relevance, ref_relevance, atol=1e-4, rtol=1e-4)


def test_top_k_prefix_selection(reader):
    scored = reader.score_passages(QUESTIONS, RETRIEVED, top_k=None)
    for k in (1, 3, 5):
        direct = reader.read(QUESTIONS, RETRIEVED, top_k=k)
        via_prefix = [select_answer(row, ctxs, k) for row, ctxs in zip(scored, RETRIEVED)]
        assert [d["answer"] for d in direct] == [v["answer"] for v in via_prefix]
        assert [d["passage_id"] for d in direct] == [v["passage_id"] for v in via_prefix]


def test_precisions_and_errors(reader):
    from fastdpr.errors import InputError

    bf16 = reader.read(QUESTIONS, RETRIEVED, top_k=5, precision="bf16")
    assert len(bf16) == len(QUESTIONS) and bf16[2]["passage_id"] is None
    assert all(p["passage_id"] is not None for i, p in enumerate(bf16) if RETRIEVED[i])
    with pytest.raises(InputError, match="precision"):
        reader.read(QUESTIONS, RETRIEVED, precision="fp8")
    with pytest.raises(ValueError, match="batch_size"):
        reader.read(QUESTIONS, RETRIEVED, batch_size=0)


EXAMPLES = [
    {"question": "where is paris", "answers": ["france"],
     "ctxs": [{"id": "a", "title": "", "text": "paris is the capital city of france"},
              {"id": "b", "title": "", "text": "the river runs north to the sea"}]},
    {"question": "where did the king live", "answers": ["london"],
     "ctxs": [{"id": "c", "title": "", "text": "the king of england lived in london"},
              {"id": "d", "title": "", "text": "paris is the capital city of france"}]},
]


def test_train_is_the_mode_switch_and_fit_trains(tmp_path):
    torch.manual_seed(0)
    reader = Reader.from_pretrained(tiny_bert_dir(tmp_path, dropout=0.0), max_length=48)
    assert reader.train() is reader and reader.training
    assert reader.eval() is reader and not reader.training
    stats = reader.fit(EXAMPLES, max_steps=2, batch_size=2, show_progress=False)
    assert stats["steps"] == 2 and stats["examples_seen"] == 4 and not reader.training
    with pytest.warns(DeprecationWarning, match="fit"):
        assert reader.train(EXAMPLES, max_steps=1, show_progress=False)["steps"] == 1


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    model_dir = tiny_bert_dir(tmp_path / "m", dropout=0.0)

    def fresh():
        torch.manual_seed(0)
        return Reader.from_pretrained(model_dir, max_length=48)

    straight = fresh()
    straight.fit(EXAMPLES, max_steps=4, batch_size=1, lr=1e-3, show_progress=False)

    class Stop(Exception):
        pass

    def stop_at_3(stats, _reader):
        if stats["step"] == 3:
            raise Stop

    first = fresh()
    with pytest.raises(Stop):
        first.fit(EXAMPLES, max_steps=4, batch_size=1, lr=1e-3, show_progress=False,
                  checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=0, callback=stop_at_3, callback_every=1)
    resumed = fresh()
    stats = resumed.fit(EXAMPLES, max_steps=4, batch_size=1, lr=1e-3, show_progress=False,
                        checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=0)
    assert stats["steps"] == 4
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_a_checkpoint_of_other_settings_is_refused_by_name(tmp_path):
    model_dir = tiny_bert_dir(tmp_path / "m", dropout=0.0)
    first = Reader.from_pretrained(model_dir, max_length=48)
    first.fit(EXAMPLES, max_steps=1, batch_size=1, lr=1e-3, show_progress=False, checkpoint_dir=tmp_path / "ckpt")
    other = Reader.from_pretrained(model_dir, max_length=48)
    # frozen word embeddings: the optimizer has other parameter groups than the checkpoint's
    with pytest.raises(InputError, match="not a state of the training asked for") as err:
        other.fit(EXAMPLES, max_steps=2, batch_size=1, lr=1e-3, show_progress=False, freeze_word_embeddings=True,
                  checkpoint_dir=tmp_path / "ckpt")
    assert str(tmp_path / "ckpt") in str(err.value)


def test_train_reader_retrieves_its_own_passages(tmp_path, capsys):
    from fastdpr.cli import main
    from fastdpr.data import Corpus
    from fastdpr.sparse import BM25

    model_dir = tiny_bert_dir(tmp_path / "m", dropout=0.0)
    passages = [c for ex in EXAMPLES for c in ex["ctxs"]]
    passages = list({p["id"]: p for p in passages}.values())
    corpus_path = tmp_path / "psgs.jsonl"
    corpus_path.write_text("".join(json.dumps(p) + "\n" for p in passages))
    BM25.from_corpus(Corpus.open(corpus_path), show_progress=False).save(tmp_path / "bm25")
    qa = tmp_path / "train.qa.jsonl"
    qa.write_text("".join(json.dumps({"question": ex["question"], "answers": ex["answers"]}) + "\n"
                          for ex in EXAMPLES))
    out = tmp_path / "reader"
    code = main(["train-reader", "--qa", str(qa), "--mode", "bm25", "--bm25", str(tmp_path / "bm25"), "--corpus",
                 str(corpus_path), "-k", "2", "--model", str(model_dir), "-o", str(out), "--max-steps", "2",
                 "--max-length", "48", "--quiet"])
    assert code == 0 and (out / "fastdpr_reader.json").is_file()
    assert "trained 2 steps on 2 questions" in capsys.readouterr().out
    # a results file and --qa together, or neither, is a usage error
    assert main(["train-reader", "--model", str(model_dir), "-o", str(out)]) == 2
    assert main(["train-reader", "--qa", str(qa), "--mode", "dense", "--corpus", str(corpus_path),
                 "--model", str(model_dir), "-o", str(out)]) == 2


class _ListRetriever:
    """Returns the same ranked passages for every question."""

    def __init__(self, passages):
        self.passages = passages

    def retrieve(self, questions, k):
        return [[{**p, "score": 1.0 / (r + 1)} for r, p in enumerate(self.passages[:k])] for _ in questions]


def test_train_reader_from_questions_and_the_reader_cache(tmp_path):
    from fastdpr.reader import load_cached_reader, reader_cache_dir, train_reader_from_questions

    model_dir = tiny_bert_dir(tmp_path / "m", dropout=0.0)
    passages = list({c["id"]: c for ex in EXAMPLES for c in ex["ctxs"]}.values())
    questions = [{"question": ex["question"], "answers": ex["answers"]} for ex in EXAMPLES]
    assert load_cached_reader("r", cache=tmp_path) is None
    out = reader_cache_dir("r", cache=tmp_path)
    reader, stats = train_reader_from_questions(questions, _ListRetriever(passages), out, base_model=model_dir, k=3,
                                                max_steps=2, max_length=48, read_length=64, precision="fp32",
                                                show_progress=False)
    assert stats["steps"] == 2 and stats["retrieved_questions"] == 2 and stats["bf16"] is False
    cached = load_cached_reader("r", cache=tmp_path)
    assert cached is not None and cached.config.max_length == 64
    assert cached.read([q["question"] for q in questions], [passages, passages], top_k=3)[0]["answer"] == \
        reader.read([q["question"] for q in questions], [passages, passages], top_k=3)[0]["answer"]


def test_selection_rules_pick_by_their_own_score():
    passages = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    scored = [
        {"passage_score": 3.0, "span_score": 1.0, "start": 0, "end": 1, "answer": "from a"},
        {"passage_score": 1.0, "span_score": 5.0, "start": 0, "end": 1, "answer": "from b"},
        None,  # a passage with no span
    ]
    assert select_answer(scored, passages)["answer"] == "from a"  # the default, DPR: best passage first
    assert select_answer(scored, passages, select="span")["answer"] == "from b"
    joint = select_answer(scored, passages, select="joint")  # passage + span logits, 4 vs 6
    assert joint["answer"] == "from b" and joint["passage_id"] == "b" and joint["passage_rank"] == 1
    assert select_answer(scored, passages, top_k=1, select="span")["answer"] == "from a"  # a prefix only
    assert select_answer([None], passages[:1])["answer"] == ""
    with pytest.raises(ValueError, match="select must be one of"):
        select_answer(scored, passages, select="best")
