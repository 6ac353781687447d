"""Passage encoding of one fixed batch with a tiny random BERT (``tests/tiny_models.py``): tokenisation, length
sorting, padding, the forward pass and pooling, on one thread. The model is tiny on purpose: what regresses here
is fastdpr's own path around the transformer, which a large model's matrix products would hide.
"""
import pytest
import torch

BATCH = 64


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from tiny_models import tiny_biencoder

    model = tiny_biencoder(tmp_path_factory.mktemp("micro-encode"), pooling="cls", max_passage_length=64,
                           dropout=0.0)
    return model.eval()


@pytest.mark.parametrize("tower", ["passages", "questions"])
def test_encode_batch(benchmark, tiny_model, squad_passages, squad_questions, tower):
    benchmark.group = f"encode {BATCH} texts, tiny BERT"
    if tower == "passages":
        inputs = [(p["title"], p["text"]) for p in squad_passages[:BATCH]]
        encode = tiny_model.encode_passages
    else:
        inputs = [q["question"] for q in squad_questions[:BATCH]]
        encode = tiny_model.encode_questions
    vectors = benchmark(encode, inputs, batch_size=BATCH)
    assert tuple(vectors.shape) == (BATCH, tiny_model.dim)
    assert bool(torch.isfinite(torch.as_tensor(vectors)).all())
    # encoding is deterministic in eval mode: the same input gives the same vector whatever else is in the batch
    alone = encode(inputs[:1], batch_size=1)
    assert torch.allclose(torch.as_tensor(alone[0]), torch.as_tensor(vectors[0]), atol=1e-5)
