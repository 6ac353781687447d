"""The few-rows bf16 linear layer (csrc/linear_bf16.h): every path against a float64 product of the same bf16
numbers and against the scalar path, on odd row counts (the 14-row blocks and their remainders) with and without
bias and residual, bf16 and fp32 outputs; its argument checks; FusedLinear through it against oneDNN's path."""
import numpy as np
import pytest
import torch

import fastdpr.models.inference as inference

C = pytest.importorskip("fastdpr._C")
if not hasattr(C, "linear_bf16"):
    pytest.skip("this build of fastdpr._C has no few-rows linear kernel", allow_module_level=True)

PATHS = C.linear_bf16_paths()


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
        # fp32 sums of k exact products: a few ulps of the largest partial sum
        np.testing.assert_allclose(got.double(), want, rtol=0, atol=k * 2e-7 * scale, err_msg=f"{path} seed {seed}")
        np.testing.assert_allclose(got, scalar, rtol=0, atol=k * 2e-7 * scale, err_msg=f"{path} seed {seed}")
        rounded = _run(x, packed, n, bias, residual, path, torch.bfloat16)
        # bf16 out is the fp32 result rounded once, to nearest even
        assert torch.equal(rounded, got.bfloat16()), f"{path} seed {seed}"


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
    with pytest.raises(ValueError, match="unknown path"):
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


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("rows", [1, 11, 40])
def test_fused_linear_through_the_kernel_equals_the_onednn_path(monkeypatch, activation, rows):
    monkeypatch.setattr(inference, "_few_rows_kernel", lambda: C)  # whatever the CPU's first choice is
    g = torch.Generator().manual_seed(rows)
    layer = inference.FusedLinear(torch.randn(96, 64, generator=g) / 8, torch.randn(96, generator=g),
                                  activation).to(torch.bfloat16).prepack()
    assert layer.few_rows is not None
    x = torch.randn(rows, 64, generator=g).bfloat16()
    residual = torch.randn(rows, 96, generator=g).bfloat16() if activation is None else None
    got = layer(x, residual)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    layer.few_rows = None
    want = layer(x, residual)
    # both round fp32 sums once; their summation orders differ, so an element may land one bf16 step apart
    np.testing.assert_allclose(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -7)
    # more rows than the kernel takes go the other way
    layer.prepack()
    monkeypatch.setattr(layer, "_forward_few_rows", lambda *a: pytest.fail("few-rows kernel at too many rows"))
    many = inference._FEW_ROWS + 1
    assert layer(torch.randn(many, 64, generator=g).bfloat16()).shape == (many, 96)


def test_few_rows_tower_equals_the_torch_path(tmp_path, monkeypatch):
    """The numpy/compiled forward of a bf16 tower at few tokens (inference.FewRowsTower) against the same tower's
    torch forward (oneDNN or F.linear, torch's layer norm and the attention kernel); more tokens than it takes, fp32
    and int8 towers go the torch way."""
    from tiny_models import tiny_bert_dir

    from fastdpr.models import BiEncoder, BiEncoderConfig

    monkeypatch.setattr(inference, "_few_rows_kernel", lambda: C)  # whatever the CPU's first choice is
    monkeypatch.setattr(inference, "_attention_kernel", lambda dtype: C)
    # head dimension 16 and widths that are multiples of 32, as the kernels need
    qdir = tiny_bert_dir(tmp_path, name="tiny-few-rows", hidden=64, layers=2, heads=4, intermediate=128, seed=3)
    model = BiEncoder.from_encoders(qdir, None, config=BiEncoderConfig(shared=True, pooling="mean")).eval()
    tower = inference.build_tower(model.question_encoder, "bf16", torch.device("cpu"), model._pad_id())
    assert isinstance(tower.few_rows, inference.FewRowsTower)
    rng = np.random.default_rng(int(np.random.SeedSequence().generate_state(1)[0]))
    seqs = [(list(rng.integers(1, 100, size=n)), None) for n in (5, 5, 9, 1)]
    batch = inference.pack(seqs, torch.device("cpu"))
    with torch.inference_mode():
        got = tower(batch)
        few_rows, tower.few_rows = tower.few_rows, None
        want = tower(batch)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape == (20, 64)
    # the same kernels and roundings; the embeddings' and layer norms' fp32 sums may run in other orders, so an
    # element may land one bf16 step apart, and that propagates through two layers
    np.testing.assert_allclose(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6)
    assert float((got != want).float().mean()) < 0.01

    tower.few_rows = few_rows
    monkeypatch.setattr(inference.FewRowsTower, "__call__",
                        lambda *a: pytest.fail("few-rows tower at too many tokens"))
    many = [(list(rng.integers(1, 100, size=inference._FEW_ROWS + 1)), None)]
    with torch.inference_mode():
        assert tower(inference.pack(many, torch.device("cpu"))).shape == (inference._FEW_ROWS + 1, 64)
    for precision in ("fp32", "int8"):
        assert inference.build_tower(model.question_encoder, precision, torch.device("cpu"),
                                     model._pad_id()).few_rows is None
    # moved or cast towers drop the views of their old weights
    assert tower.float().few_rows is None
