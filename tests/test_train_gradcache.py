"""GradCache gives plain large-batch gradients (fp32, dropout on), composed with the fused loss."""
import json
from pathlib import Path

import pytest
import torch

from fastdpr.train import grad_cache as gc
from fastdpr.train.data import examples_from_records
from fastdpr.train.grad_cache import chunk_schedule, length_sorted_chunks, split_tokens, trim_padding
from fastdpr.train.loss import batch_loss
from fastdpr.train.biencoder import BiEncoderTask, split_arguments
from fastdpr.train.trainer import Trainer
from tiny_models import tiny_biencoder


DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def examples():
    records = json.loads((DATA / "squad_dev_train_sample.json").read_text())
    # give some questions a second hard negative and others none, so the batch has padded columns
    for i, rec in enumerate(records):
        if i % 3 == 0:
            rec["hard_negative_ctxs"] = []
        elif i % 3 == 1:
            rec["hard_negative_ctxs"].append(records[(i + 9) % len(records)]["positive_ctxs"][0])
    return examples_from_records(records)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _trainer(model, tmp_path, examples, **kw):
    training, biencoder = split_arguments(dict(output_dir=str(tmp_path / "out"), batch_size=12, n_hard=2, lr=1e-3,
                                               show_progress=False, **kw))
    trainer = Trainer(BiEncoderTask(model, examples, biencoder), training)
    trainer._setup()
    return trainer


def _reference_grads(trainer, batch, seed, chunk_size):
    """Plain large-batch training: one autograd graph over the whole batch, full-batch loss, one backward.

    The encoder is called on the same chunks in the same order from the same RNG state as GradCache's first
    pass, so dropout draws the same masks; nothing is detached or cached."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    model.train()
    q_tok, p_tok = trainer.task.tokens(batch)
    q_chunks, q_restore = length_sorted_chunks(q_tok, chunk_size)
    p_chunks, p_restore = length_sorted_chunks(p_tok, chunk_size)
    torch.manual_seed(seed)
    qs, ps = [], []
    for qi, pi in chunk_schedule(len(q_chunks), len(p_chunks)):
        q, p = model(q_chunks[qi] if qi is not None else None, p_chunks[pi] if pi is not None else None)
        qs += [q] if q is not None else []
        ps += [p] if p is not None else []
    loss = batch_loss(torch.cat(qs)[q_restore], torch.cat(ps)[p_restore], batch, batch, scale=model.scale,
                      loss_fn=trainer.task.loss_fn)
    loss.backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _grad_cache_grads(trainer, batch, seed):
    trainer.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = trainer.training_step(batch)
    grads = _grads(trainer.model)
    trainer.model.zero_grad(set_to_none=True)
    return float(loss), grads


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("shared,pooling,similarity", [(False, "cls", "dot"), (True, "mean", "cosine")])
def test_grad_cache_equals_large_batch_with_dropout(tmp_path, examples, shared, pooling, similarity):
    model = tiny_biencoder(tmp_path, shared=shared, pooling=pooling, similarity=similarity, temperature=0.1,
                           dropout=0.1, max_passage_length=48)
    trainer = _trainer(model, tmp_path, examples, grad_cache=True, chunk_size=5)  # uneven chunks: 12 = 5+5+2
    batch = trainer.task.builder.batch(0, 1)
    assert not batch.column_valid.all()  # padding is exercised
    ref_loss, ref = _reference_grads(trainer, batch, seed=11, chunk_size=5)
    gc_loss, got = _grad_cache_grads(trainer, batch, seed=11)
    assert abs(ref_loss - gc_loss) < 1e-5
    assert len(got) >= 30
    assert _max_diff(ref, got) < 1e-5
    # dropout really is on: another RNG state gives other gradients
    _, other = _grad_cache_grads(trainer, batch, seed=12)
    assert _max_diff(ref, other) > 1e-4


def test_without_rng_replay_the_gradients_differ(tmp_path, examples, monkeypatch):
    # the check above can fail: break the replay and the gradients no longer match
    model = tiny_biencoder(tmp_path, dropout=0.1, max_passage_length=48)
    trainer = _trainer(model, tmp_path, examples, grad_cache=True, chunk_size=5)
    batch = trainer.task.builder.batch(0, 0)
    _, ref = _reference_grads(trainer, batch, seed=5, chunk_size=5)
    monkeypatch.setattr(gc.RandomState, "restore", lambda self: None)
    _, got = _grad_cache_grads(trainer, batch, seed=5)
    assert _max_diff(ref, got) > 1e-4


def test_grad_cache_equals_plain_trainer_step_without_dropout(tmp_path, examples):
    # with no randomness, the chunked GradCache step equals the trainer's plain one-call step
    model = tiny_biencoder(tmp_path, dropout=0.0, max_passage_length=48)
    plain = _trainer(model, tmp_path, examples, grad_cache=False)
    cached = _trainer(model, tmp_path, examples, grad_cache=True, chunk_size=4)
    batch = plain.task.builder.batch(0, 2)
    loss_a, a = _grad_cache_grads(plain, batch, seed=0)
    loss_b, b = _grad_cache_grads(cached, batch, seed=0)
    assert abs(loss_a - loss_b) < 1e-5 and _max_diff(a, b) < 1e-5


def test_length_sorted_chunks_restore_the_batch_order():
    torch.manual_seed(4)
    lengths = torch.tensor([3, 9, 1, 9, 5, 2, 7, 4, 8, 6, 2])
    width = 12
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 100, (len(lengths), width)) * mask
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    chunks, restore = length_sorted_chunks(tokens, 4)
    assert [c["input_ids"].shape for c in chunks] == [(4, 3), (4, 7), (3, 9)]  # each trimmed to its longest row
    assert [int(c["attention_mask"].sum(1).max()) for c in chunks] == [3, 7, 9]
    # a row-wise function of the chunks, concatenated and restored, equals it applied to the batch in order
    def rowwise(t):
        return (t["input_ids"] * t["attention_mask"]).sum(1) * 1000 + t["attention_mask"].sum(1)
    assert torch.equal(torch.cat([rowwise(c) for c in chunks])[restore], rowwise(tokens))
    # unsorted chunks of the same batch cost more positions
    unsorted = [trim_padding(t) for t in split_tokens(tokens, 4)]
    assert sum(c["input_ids"].numel() for c in chunks) < sum(c["input_ids"].numel() for c in unsorted)


class _CountingEncoder(torch.nn.Module):
    """Two linear towers with dropout, called like BiEncoder.forward(q_tokens, p_tokens); counts its calls."""

    def __init__(self):
        super().__init__()
        self.q, self.p, self.drop, self.calls = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4), torch.nn.Dropout(0.3), 0

    def forward(self, q_tokens, p_tokens):
        self.calls += 1
        q = self.drop(self.q(q_tokens["x"])) if q_tokens is not None else None
        p = self.drop(self.p(p_tokens["x"])) if p_tokens is not None else None
        return q, p


@pytest.mark.parametrize("n_q,n_p,chunk", [(7, 14, 3), (4, 4, 4), (5, 9, 2)])
def test_the_last_call_keeps_its_graph_and_gradients_stay_exact(n_q, n_p, chunk):
    torch.manual_seed(0)
    enc = _CountingEncoder().double()
    xq, xp = torch.randn(n_q, 6, dtype=torch.float64), torch.randn(n_p, 6, dtype=torch.float64)
    targets = torch.arange(n_q) % n_p

    def loss_fn(q, p):
        return torch.nn.functional.cross_entropy(q @ p.t(), targets)

    q_chunks = split_tokens({"x": xq}, chunk)
    p_chunks = split_tokens({"x": xp}, chunk)
    calls = chunk_schedule(len(q_chunks), len(p_chunks))
    torch.manual_seed(5)
    loss = gc.GradCacheStep(enc)(q_chunks, p_chunks, loss_fn, lambda t: t.backward())
    assert enc.calls == 2 * len(calls) - 1 + sum(q is not None and p is not None for q, p in calls[:-1])
    got = {n: t.grad.clone() for n, t in enc.named_parameters()}
    # the reference: the same calls from the same generator state, one graph, one backward
    enc.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    outs = [enc(q_chunks[qi] if qi is not None else None, p_chunks[pi] if pi is not None else None) for qi, pi in calls]
    ref_loss = loss_fn(torch.cat([q for q, _ in outs if q is not None]), torch.cat([p for _, p in outs if p is not None]))
    ref_loss.backward()
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-12)
    for n, t in enc.named_parameters():
        torch.testing.assert_close(got[n], t.grad, rtol=1e-12, atol=1e-12)


def test_chunk_schedule_ends_with_both_towers():
    assert chunk_schedule(2, 5) == [(None, 0), (None, 1), (None, 2), (0, 3), (1, 4)]
    assert chunk_schedule(1, 1) == [(0, 0)]
    for nq, np_ in [(1, 7), (3, 3), (4, 9)]:
        calls = chunk_schedule(nq, np_)
        assert calls[-1][0] is not None and calls[-1][1] is not None
        assert [q for q, _ in calls if q is not None] == list(range(nq))
        assert [p for _, p in calls if p is not None] == list(range(np_))


def test_gradient_checkpointing_keeps_the_gradients(tmp_path, examples):
    # recomputation replays the dropout draws, so checkpointed and plain steps agree with dropout on
    grads = {}
    for name, kw in {"plain": {}, "checkpointed": {"gradient_checkpointing": True},
                     "checkpointed+gc": {"gradient_checkpointing": True, "grad_cache": True, "chunk_size": 5}}.items():
        model = tiny_biencoder(tmp_path / name, dropout=0.1, max_passage_length=48)
        trainer = _trainer(model, tmp_path / name, examples, **kw)
        batch = trainer.task.builder.batch(0, 0)
        assert model.question_encoder.is_gradient_checkpointing == bool(kw)
        if kw.get("grad_cache"):
            _, grads[name] = _reference_grads(trainer, batch, seed=3, chunk_size=5)
            _, got = _grad_cache_grads(trainer, batch, seed=3)
            assert _max_diff(grads[name], got) < 1e-5
        else:
            _, grads[name] = _grad_cache_grads(trainer, batch, seed=3)
    assert _max_diff(grads["plain"], grads["checkpointed"]) < 1e-5


def test_grad_cache_at_batch_1024_equals_plain_training(tmp_path):
    # the size the quality benchmark trains at: 1,024 questions and 2,048 passages, in chunks of 128
    records = json.loads((DATA / "squad_dev_train_sample.json").read_text())
    many = [{**rec, "question": f"{rec['question']} ({copy})"}
            for copy in range(-(-1024 // len(records))) for rec in records][:1024]
    examples = examples_from_records(many)
    model = tiny_biencoder(tmp_path, dropout=0.0, max_passage_length=32)

    def trainer(**kw):
        # the chunked torch loss: the Triton interpreter is exact but slow at 1,024 x 2,048
        training, biencoder = split_arguments(dict(output_dir=str(tmp_path / "out"), batch_size=1024, n_hard=1,
                                                   lr=1e-3, show_progress=False, loss_backend="torch", **kw))
        t = Trainer(BiEncoderTask(model, examples, biencoder), training)
        t._setup()
        return t

    plain, cached = trainer(grad_cache=False), trainer(grad_cache=True, chunk_size=128)
    batch = plain.task.builder.batch(0, 0)
    assert batch.size == 1024 and len(batch.passages) == 2048
    loss_a, a = _grad_cache_grads(plain, batch, seed=0)
    loss_b, b = _grad_cache_grads(cached, batch, seed=0)
    assert abs(loss_a - loss_b) < 1e-5
    assert _max_diff(a, b) < 1e-5


def test_grad_cache_equals_large_batch_in_float64_with_seeded_attention_dropout(tmp_path, examples):
    # the CPU trainer's attention (seeded dropout, recomputed in the backward pass) replays exactly under GradCache
    from fastdpr.models.attention import NAME

    model = tiny_biencoder(tmp_path, dropout=0.1, max_passage_length=48).double()
    trainer = _trainer(model, tmp_path, examples, grad_cache=True, chunk_size=5)
    assert model.question_encoder.config._attn_implementation == NAME
    batch = trainer.task.builder.batch(0, 1)
    ref_loss, ref = _reference_grads(trainer, batch, seed=11, chunk_size=5)
    gc_loss, got = _grad_cache_grads(trainer, batch, seed=11)
    assert all(g.dtype == torch.float64 for g in got.values())
    assert abs(ref_loss - gc_loss) < 1e-12
    assert _max_diff(ref, got) < 1e-12
    _, other = _grad_cache_grads(trainer, batch, seed=12)
    assert _max_diff(ref, other) > 1e-4
