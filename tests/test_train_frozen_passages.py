"""Query-side fine-tuning: the passage tower frozen (a shared tower untied), pool negatives from encoded vectors."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fastdpr import cli
from fastdpr.data import Corpus
from fastdpr.encode import encode_corpus
from fastdpr.errors import InputError
from fastdpr.kernels import inbatch_nll
from fastdpr.models import BiEncoder
from fastdpr.train.data import load_examples, passage_key
from fastdpr.train.pool import PassagePool
from fastdpr.train.biencoder import BiEncoderTask, split_arguments
from fastdpr.train.trainer import Trainer
from tiny_models import tiny_biencoder

SAMPLE = Path(__file__).parent / "data" / "squad_dev_train_sample.json"


@pytest.fixture(scope="module")
def examples():
    return load_examples(SAMPLE)


def _corpus_of_sample(extra: int = 7) -> Corpus:
    """Every passage of the sample by its passage_id, plus a few that no training example names."""
    seen = {}
    for record in json.loads(SAMPLE.read_text()):
        for ctx in record["positive_ctxs"] + record["hard_negative_ctxs"]:
            seen.setdefault(ctx["passage_id"], {"id": ctx["passage_id"], "title": ctx["title"], "text": ctx["text"]})
    passages = list(seen.values())
    passages += [{"id": f"extra-{i}", "title": "", "text": f"unrelated filler passage number {i}"}
                 for i in range(extra)]
    return Corpus.from_passages(passages)


@pytest.fixture(scope="module")
def shared_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("shared")
    model = tiny_biencoder(path, pooling="mean", similarity="cosine", shared=True, dropout=0.0,
                           max_question_length=24, max_passage_length=48)
    model.save_pretrained(path / "model")
    return path / "model"


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory, shared_model_dir):
    out = tmp_path_factory.mktemp("vectors") / "v"
    encode_corpus(BiEncoder.from_pretrained(shared_model_dir), _corpus_of_sample(), out, dtype="float32",
                  show_progress=False, precision="fp32")
    return out


def _args(out, **kw):
    base = dict(output_dir=str(out), batch_size=16, n_hard=1, lr=5e-3, show_progress=False, logging_steps=1,
                loss_backend="torch", freeze_passages=True, max_steps=3, epochs=1)
    base.update(kw)
    return split_arguments(base)


def _trainer(model, args, examples):
    training, biencoder = args
    return Trainer(BiEncoderTask(model, examples, biencoder), training)


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("grad_cache", [False, True])
def test_question_tower_moves_and_passage_tower_stays_bitwise(tmp_path, examples, shared_model_dir, grad_cache):
    model = BiEncoder.from_pretrained(shared_model_dir)
    start = _state(model.question_encoder)
    _trainer(model, _args(tmp_path / "run", grad_cache=grad_cache, chunk_size=5), examples).train()
    saved = BiEncoder.from_pretrained(tmp_path / "run" / "model")
    assert not saved.config.shared  # untied, so that the two towers can differ
    moved = _state(saved.question_encoder)
    assert any(not torch.equal(moved[k], start[k]) for k in start), "the question tower did not train"
    kept = _state(saved.passage_encoder)
    assert all(torch.equal(kept[k], start[k]) for k in start), "the passage tower moved"
    # the vectors an index holds stay valid: the saved passage tower encodes exactly as the starting model
    passages = [("a title", "a passage about something"), ("", "another one")]
    before = BiEncoder.from_pretrained(shared_model_dir).encode_passages(passages, show_progress=False)
    after = saved.encode_passages(passages, show_progress=False)
    np.testing.assert_array_equal(before, after)


def test_pool_negatives_give_the_loss_over_batch_and_pool(tmp_path, examples, shared_model_dir, pool_dir):
    model = BiEncoder.from_pretrained(shared_model_dir)
    trainer = _trainer(model, _args(tmp_path / "run", negatives_from=str(pool_dir)), examples)
    trainer._setup()
    batch = trainer.task.builder.batch(0, 0)
    torch.manual_seed(0)
    got = float(trainer.training_step(batch))

    # the same loss written out: question vectors against [batch columns, every pool vector]
    model.eval()
    with torch.no_grad():
        q = model.encode_question_tokens(**model.tokenize_questions(batch.questions))
        p_real = model.encode_passage_tokens(**model.tokenize_passages(
            [(c["title"], c["text"]) for c in batch.passages]))
    p = torch.zeros(batch.n_columns, q.shape[1])
    p[batch.passage_columns] = p_real
    from fastdpr.encode import load_vectors

    vectors, ids = load_vectors(pool_dir)
    pool = torch.from_numpy(np.array(vectors, dtype=np.float32))
    keys = torch.tensor([passage_key({"id": pid}) for pid in ids])
    want = inbatch_nll(q, torch.cat([p, pool]), batch.targets, scale=model.scale,
                       column_ids=torch.cat([batch.column_ids, keys]),
                       column_valid=torch.cat([batch.column_valid, torch.ones(len(ids), dtype=torch.bool)]),
                       backend="reference")
    assert got == pytest.approx(float(want), rel=1e-5)
    # the pool copy of each positive is masked: the same loss without the ids is larger
    unmasked = inbatch_nll(q, torch.cat([p, pool]), batch.targets, scale=model.scale, backend="reference")
    assert float(unmasked) > float(want)


def test_k_best_pool_passages_are_the_union_of_each_questions_best():
    gen = torch.Generator().manual_seed(3)
    vectors = torch.randn(50, 6, generator=gen)
    pool = PassagePool(vectors, torch.arange(50) * 7)
    q = torch.randn(4, 6, generator=gen)
    chosen, keys = pool.columns(q, k=5)
    want = sorted({int(i) for row in (q @ vectors.T).topk(5, dim=1).indices for i in row})
    assert sorted(int(k) // 7 for k in keys) == want
    torch.testing.assert_close(chosen, vectors[torch.tensor(sorted(want))])
    assert pool.columns(q, k=0)[0] is vectors and pool.columns(q, k=50)[0] is vectors


def test_k_best_across_blocks(monkeypatch):
    import fastdpr.train.pool as pool_module

    monkeypatch.setattr(pool_module, "SELECT_BLOCK", 7)  # the running top-k merges several blocks
    gen = torch.Generator().manual_seed(5)
    vectors = torch.randn(40, 3, generator=gen)
    q = torch.randn(3, 3, generator=gen)
    _, keys = PassagePool(vectors, torch.arange(40)).columns(q, k=4)
    want = sorted({int(i) for row in (q @ vectors.T).topk(4, dim=1).indices for i in row})
    assert sorted(keys.tolist()) == want


def test_vectors_of_another_passage_tower_are_refused(tmp_path, examples, pool_dir):
    other = tiny_biencoder(tmp_path, pooling="mean", similarity="cosine", shared=True, dropout=0.0, seed=9,
                           max_question_length=24, max_passage_length=48)
    with pytest.raises(InputError, match="another passage tower"):
        _trainer(other, _args(tmp_path / "run", negatives_from=str(pool_dir)), examples).train()


@pytest.mark.parametrize("kw,message", [
    (dict(freeze_passages=False, negatives_from="v"), "negatives_from needs freeze_passages"),
    (dict(negatives_from="v", group_size=4), "cannot be combined"),
    (dict(pool_negatives=-1), "pool_negatives must be >= 0"),
])
def test_bad_settings_are_named(tmp_path, kw, message):
    with pytest.raises(InputError, match=message):
        _args(tmp_path, **kw)


def test_cli_trains_the_question_side_with_pool_negatives(tmp_path, shared_model_dir, pool_dir, capsys):
    out = tmp_path / "cli"
    code = cli.main(["train", str(SAMPLE), "--model", str(shared_model_dir), "-o", str(out), "--batch-size", "16",
                     "--max-steps", "2", "--lr", "1e-3", "--loss-backend", "torch", "--no-progress",
                     "--freeze-passages", "--negatives-from", str(pool_dir), "--pool-negatives", "8"])
    assert code == 0
    saved = json.loads((out / "training_args.json").read_text())["task"]
    assert saved["freeze_passages"] and saved["pool_negatives"] == 8
    trained = BiEncoder.from_pretrained(out / "model")
    start = BiEncoder.from_pretrained(shared_model_dir)
    assert all(torch.equal(a, b) for a, b in zip(trained.passage_encoder.state_dict().values(),
                                                 start.question_encoder.state_dict().values()))
    # the vectors encoded by the starting model are the trained model's too
    PassagePool.load(pool_dir, trained)
