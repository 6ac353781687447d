"""The few-rows linear layers (csrc/few_rows_linear.h), bf16 and fp32: every path against a float64 product of the
same numbers and against the scalar path, on odd row counts (the 14-row blocks and their remainders) with and
without bias and residual, bf16 and fp32 outputs; their argument checks; FusedLinear through them against oneDNN's
path; the few-rows tower against the torch forward."""
import numpy as np
import pytest
import torch

from compiled_extension import skip_unrun

import fastdpr.models.inference as inference
from fastdpr.models import compiled

C = pytest.importorskip("fastdpr.models._kernels_C")
# every path, and the ones this CPU runs
ALL_PATHS, ALL_F32_PATHS = ("avx512_bf16", "scalar"), ("avx512", "scalar")
PATHS = C.linear_bf16_paths()
F32_PATHS = C.linear_f32_paths()


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def _run(x, packed, n, bias, residual, path, out_dtype, activation=""):
    out = torch.empty(x.shape[0], n, dtype=out_dtype)
    C.linear_bf16(_bits(x), packed, n, None if bias is None else bias.numpy(), activation,
                  None if residual is None else _bits(residual),
                  _bits(out) if out_dtype == torch.bfloat16 else out.numpy(), path)
    return out


@pytest.mark.parametrize("rows", [1, 2, 13, 14, 15, 29, 64])
@pytest.mark.parametrize("k,n", [(2, 32), (38, 64), (384, 96)])
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, True), (True, True), (False, False)])
def test_every_path_matches_the_float64_product_and_the_scalar_path(rows, k, n, with_bias, with_residual):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g) if with_bias else None
    residual = torch.randn(rows, n, generator=g).bfloat16() if with_residual else None
    want = x.double() @ w.double().T
    if bias is not None:
        want += bias.double()
    if residual is not None:
        want += residual.double()
    packed = C.linear_bf16_pack(_bits(w))
    scale = float(want.abs().max()) + 1.0
    scalar = _run(x, packed, n, bias, residual, "scalar", torch.float32)
    for path in PATHS:
        got = _run(x, packed, n, bias, residual, path, torch.float32)
        # threads take whole 32-column panels: the same sums, bit for bit
        threaded = torch.empty(rows, n)
        C.linear_bf16(_bits(x), packed, n, None if bias is None else bias.numpy(), "",
                      None if residual is None else _bits(residual), threaded.numpy(), path, 3)
        assert torch.equal(threaded, got), f"{path} seed {seed}"
        # fp32 sums of k exact products: a few ulps of the largest partial sum
        np.testing.assert_allclose(got.double(), want, rtol=0, atol=k * 2e-7 * scale, err_msg=f"{path} seed {seed}")
        np.testing.assert_allclose(got, scalar, rtol=0, atol=k * 2e-7 * scale, err_msg=f"{path} seed {seed}")
        rounded = _run(x, packed, n, bias, residual, path, torch.bfloat16)
        # bf16 out is the fp32 result rounded once, to nearest even
        assert torch.equal(rounded, got.bfloat16()), f"{path} seed {seed}"
    skip_unrun(ALL_PATHS, PATHS)


def _run_f32(x, packed, n, bias, residual, path, activation=""):
    out = np.empty((x.shape[0], n), np.float32)
    C.linear_f32(x, packed, n, bias, activation, residual, out, path)
    return out


@pytest.mark.parametrize("rows", [1, 2, 13, 14, 15, 29, 64])
@pytest.mark.parametrize("k,n", [(1, 32), (37, 64), (384, 96)])
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, True), (True, True)])
def test_every_f32_path_matches_the_float64_product_and_the_scalar_path(rows, k, n, with_bias, with_residual):
    rng = np.random.default_rng(int(np.random.SeedSequence().generate_state(1)[0]))
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    residual = rng.standard_normal((rows, n), dtype=np.float32) if with_residual else None
    want = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        want += bias
    if residual is not None:
        want += residual
    packed = C.linear_f32_pack(w)
    # fp32 products and sums: k roundings of partial sums of size about sqrt(k)
    atol = k * 3e-7 * (float(np.abs(want).max()) + 1)
    scalar = _run_f32(x, packed, n, bias, residual, "scalar")
    np.testing.assert_allclose(scalar, want, rtol=0, atol=atol)
    for path in F32_PATHS:
        got = _run_f32(x, packed, n, bias, residual, path)
        threaded = np.empty_like(got)
        C.linear_f32(x, packed, n, bias, "", residual, threaded, path, 3)
        np.testing.assert_array_equal(threaded, got, err_msg=path)
        np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=path)
        np.testing.assert_allclose(got, scalar, rtol=0, atol=atol, err_msg=path)
    skip_unrun(ALL_F32_PATHS, F32_PATHS)


def test_f32_arguments_are_checked():
    packed = C.linear_f32_pack(np.ones((64, 8), np.float32))
    x = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        C.linear_f32_pack(np.ones((40, 8), np.float32))
    with pytest.raises(ValueError, match="does not fit"):
        C.linear_f32(np.ones((3, 6), np.float32), packed, 64, None, "", None, np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="bias"):
        C.linear_f32(x, packed, 64, np.zeros(63, np.float32), "", None, np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="residual"):
        C.linear_f32(x, packed, 64, None, "", np.zeros((3, 63), np.float32), np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="out must"):
        C.linear_f32(x, packed, 64, None, "", None, np.empty((3, 64), np.uint16))
    with pytest.raises(ValueError, match="linear_f32: no avx512_bf16 kernel; it has avx512, scalar"):
        C.linear_f32(x, packed, 64, None, "", None, np.empty((3, 64), np.float32), "avx512_bf16")
    with pytest.raises(ValueError, match="threads"):
        C.linear_f32(x, packed, 64, None, "", None, np.empty((3, 64), np.float32), "", -1)
    with pytest.raises(ValueError, match="linear_bf16: no avx512 kernel; it has avx512_bf16, scalar"):
        C.linear_bf16(np.ones((3, 8), np.uint16), C.linear_bf16_pack(np.ones((64, 8), np.uint16)), 64, None, "",
                      None, np.empty((3, 64), np.float32), "avx512")


def test_arguments_are_checked():
    w = torch.randn(64, 8).bfloat16()
    packed = C.linear_bf16_pack(_bits(w))
    x = torch.randn(3, 8).bfloat16()
    with pytest.raises(ValueError, match="multiple of 32"):
        C.linear_bf16_pack(_bits(torch.randn(40, 8).bfloat16()))
    with pytest.raises(ValueError, match="even"):
        C.linear_bf16_pack(_bits(torch.randn(32, 7).bfloat16()))
    with pytest.raises(ValueError, match="does not fit"):
        C.linear_bf16(_bits(torch.randn(3, 6).bfloat16()), packed, 64, None, "", None, np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="bias"):
        C.linear_bf16(_bits(x), packed, 64, np.zeros(63, np.float32), "", None, np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="residual"):
        C.linear_bf16(_bits(x), packed, 64, None, "", np.zeros((3, 63), np.uint16), np.empty((3, 64), np.float32))
    with pytest.raises(ValueError, match="out must"):
        C.linear_bf16(_bits(x), packed, 64, None, "", None, np.empty((3, 64), np.float64))
    with pytest.raises(ValueError, match="out must"):
        C.linear_bf16(_bits(x), packed, 64, None, "", None, np.empty((4, 64), np.float32))
    with pytest.raises(ValueError, match="linear_bf16: unknown CPU level 'avx9'"):
        C.linear_bf16(_bits(x), packed, 64, None, "", None, np.empty((3, 64), np.float32), "avx9")
    with pytest.raises(ValueError, match="unknown activation"):
        C.linear_bf16(_bits(x), packed, 64, None, "swish", None, np.empty((3, 64), np.float32))


@pytest.mark.parametrize("activation,torch_activation", [
    ("gelu", lambda y: torch.nn.functional.gelu(y)),
    ("gelu_tanh", lambda y: torch.nn.functional.gelu(y, approximate="tanh")),
    ("relu", torch.relu),
])
@pytest.mark.parametrize("rows", [1, 15])
def test_activations_match_torch(activation, torch_activation, rows):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    # pre-activations across GELU's range, into the tails where erfc is small
    x = torch.randn(rows, 64, generator=g).bfloat16()
    w = (torch.randn(96, 64, generator=g) / 2).bfloat16()
    bias = torch.linspace(-12, 12, 96)
    packed = C.linear_bf16_pack(_bits(w))
    pre = _run(x, packed, 96, bias, None, "scalar", torch.float32)
    want = torch_activation(pre.double())
    for path in PATHS:
        got = _run(x, packed, 96, bias, None, path, torch.float32, activation)
        # the sums may differ by a few ulps between paths; the activations add about 1e-6 absolute
        np.testing.assert_allclose(got.double(), want, rtol=1e-5, atol=2e-6, err_msg=f"{path} seed {seed}")
    # fp32: the same pre-activations (products of bf16 numbers are exact in fp32)
    packed32 = C.linear_f32_pack(w.float().numpy())
    for path in F32_PATHS:
        got = _run_f32(x.float().numpy(), packed32, 96, bias.numpy(), None, path, activation)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6, err_msg=f"fp32 {path} seed {seed}")
    skip_unrun(ALL_PATHS + ALL_F32_PATHS, PATHS + F32_PATHS)


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("rows", [1, 11, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_linear_through_the_kernel_equals_the_onednn_path(monkeypatch, activation, rows, dtype):
    monkeypatch.setattr(compiled, "few_rows_kernel", lambda dtype: C)  # whatever the CPU's first choice is
    g = torch.Generator().manual_seed(rows)
    layer = inference.FusedLinear(torch.randn(96, 64, generator=g) / 8, torch.randn(96, generator=g),
                                  activation).to(dtype).prepack()
    assert layer.few_rows is not None
    x = torch.randn(rows, 64, generator=g).to(dtype)
    residual = torch.randn(rows, 96, generator=g).to(dtype) if activation is None else None
    got = layer(x, residual)
    assert got.dtype == dtype and got.shape == (rows, 96)
    layer.few_rows = None
    want = layer(x, residual)
    # bf16: both round fp32 sums once; their summation orders differ, so an element may land one bf16 step apart.
    # fp32: summation order and GELU's approximation (absolute error ~1e-7)
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2e-6
    np.testing.assert_allclose(got.float(), want.float(), rtol=tol, atol=tol)
    # more rows than the kernel takes go the other way
    layer.prepack()
    monkeypatch.setattr(layer, "_forward_few_rows", lambda *a: pytest.fail("few-rows kernel at too many rows"))
    many = compiled.FEW_ROWS + 1
    assert layer(torch.randn(many, 64, generator=g).to(dtype)).shape == (many, 96)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_few_rows_tower_equals_the_torch_path(tmp_path, monkeypatch, precision):
    """The numpy/compiled forward of a tower at few tokens (inference.FewRowsTower) against the same tower's torch
    forward (the same linear kernel through FusedLinear, torch's embeddings and layer norm, the attention kernel);
    more tokens than it takes and int8 towers go the torch way."""
    from tiny_models import tiny_bert_dir

    from fastdpr.models import BiEncoder, BiEncoderConfig

    monkeypatch.setattr(compiled, "few_rows_kernel", lambda dtype: C)  # whatever the CPU's first choice is
    monkeypatch.setattr(compiled, "attention_kernel", lambda dtype: C)
    # head dimension 16 and widths that are multiples of 32, as the kernels need
    qdir = tiny_bert_dir(tmp_path, name="tiny-few-rows", hidden=64, layers=2, heads=4, intermediate=128, seed=3)
    model = BiEncoder.from_encoders(qdir, None, config=BiEncoderConfig(shared=True, pooling="mean")).eval()
    tower = inference.build_tower(model.question_encoder, precision, torch.device("cpu"), model._pad_id())
    assert isinstance(tower.few_rows, inference.FewRowsTower)
    rng = np.random.default_rng(int(np.random.SeedSequence().generate_state(1)[0]))
    seqs = [(list(rng.integers(1, 100, size=n)), None) for n in (5, 5, 9, 1)]
    batch = inference.pack(seqs, torch.device("cpu"))
    with torch.inference_mode():
        got = tower(batch)
        few_rows, tower.few_rows = tower.few_rows, None
        want = tower(batch)
    assert got.dtype == want.dtype == tower.compute_dtype and got.shape == want.shape == (20, 64)
    if precision == "bf16":
        # the same kernels and roundings; the embeddings' and layer norms' fp32 sums may run in other orders, so an
        # element may land one bf16 step apart, and that propagates through two layers
        np.testing.assert_allclose(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6)
        assert float((got != want).float().mean()) < 0.01
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

    tower.few_rows = few_rows
    monkeypatch.setattr(inference.FewRowsTower, "__call__",
                        lambda *a: pytest.fail("few-rows tower at too many tokens"))
    many = [(list(rng.integers(1, 100, size=compiled.FEW_ROWS + 1)), None)]
    with torch.inference_mode():
        assert tower(inference.pack(many, torch.device("cpu"))).shape == (compiled.FEW_ROWS + 1, 64)
    assert inference.build_tower(model.question_encoder, "int8", torch.device("cpu"),
                                 model._pad_id()).few_rows is None
    # moved or cast towers drop the views of their old weights
    assert tower.float().few_rows is None


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("pooling,similarity", [("cls", "dot"), ("mean", "cosine"), ("mean", "dot")])
def test_one_question_through_the_few_rows_tower_equals_the_batched_path(tmp_path, monkeypatch, precision, pooling,
                                                                          similarity):
    """encode_questions(one string) goes from token ids to the vector in numpy (FewRowsTower.vector); the batched
    path packs, pools and normalises in torch."""
    from tiny_models import tiny_bert_dir

    from fastdpr.models import BiEncoder, BiEncoderConfig

    monkeypatch.setattr(compiled, "few_rows_kernel", lambda dtype: C)
    monkeypatch.setattr(compiled, "attention_kernel", lambda dtype: C)
    qdir = tiny_bert_dir(tmp_path, name="tiny-few-rows", hidden=64, layers=2, heads=4, intermediate=128, seed=5)
    model = BiEncoder.from_encoders(qdir, None, config=BiEncoderConfig(shared=True, pooling=pooling,
                                                                       similarity=similarity)).eval()
    questions = ["who wrote the republic", "the river of paris is the seine is it not"]
    calls = []
    real = inference.FewRowsTower.vector
    monkeypatch.setattr(inference.FewRowsTower, "vector", lambda self, *a: calls.append(a) or real(self, *a))
    one = np.stack([model.encode_questions(q, precision=precision) for q in questions])
    assert len(calls) == 2
    batched = model.encode_questions(questions, precision=precision)  # two sequences: the torch path
    assert len(calls) == 2
    assert one.dtype == np.float32 and one.shape == batched.shape
    # the same hidden states row by row (each row's sums run in the same order whatever the other rows); pooling
    # and normalising in numpy rather than torch differ by fp32 rounding
    np.testing.assert_allclose(one, batched, rtol=0, atol=1e-6)
    if similarity == "cosine":
        np.testing.assert_allclose(np.linalg.norm(one, axis=1), 1.0, rtol=1e-6)


def test_the_few_rows_tower_refuses_token_ids_out_of_range(tmp_path, monkeypatch):
    from tiny_models import tiny_bert_dir

    from fastdpr.errors import InputError
    from fastdpr.models import BiEncoder, BiEncoderConfig

    monkeypatch.setattr(compiled, "few_rows_kernel", lambda dtype: C)
    monkeypatch.setattr(compiled, "attention_kernel", lambda dtype: C)
    qdir = tiny_bert_dir(tmp_path, name="tiny-few-rows", hidden=64, layers=2, heads=4, intermediate=128, seed=7)
    model = BiEncoder.from_encoders(qdir, None, config=BiEncoderConfig(shared=True)).eval()
    vocab = model.question_encoder.config.vocab_size
    assert model.encode_token_lists([([1, 5, 2], None)], "question", precision="fp32").shape == (1, 64)
    for seq, what in [(([1, -5, 2], None), "token id -5"), (([1, vocab, 2], None), f"token id {vocab}"),
                      (([1, 5, 2], [0, 7, 0]), "token type id 7")]:
        with pytest.raises(InputError, match=what):
            model.encode_token_lists([seq], "question", precision="fp32")


def test_no_rows_is_an_empty_result_on_every_path():
    """0 rows split into 0 blocks: no division by a block count of 0 (that was a SIGFPE on AVX-512)."""
    w = torch.randn(64, 38).bfloat16()
    packed = C.linear_bf16_pack(_bits(w))
    for path in PATHS:
        assert _run(torch.empty(0, 38).bfloat16(), packed, 64, None, None, path, torch.float32).shape == (0, 64)
    packed32 = C.linear_f32_pack(w.float().numpy())
    for path in F32_PATHS:
        out = np.empty((0, 64), np.float32)
        C.linear_f32(np.empty((0, 38), np.float32), packed32, 64, None, "", None, out, path)
        assert out.shape == (0, 64)
    skip_unrun(ALL_PATHS + ALL_F32_PATHS, PATHS + F32_PATHS)
