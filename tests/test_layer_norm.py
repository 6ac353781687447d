"""The few-rows layer norm (csrc/layer_norm.h): every path against float64 on odd widths (vector tails), fp32 and
bf16 in and out, in place; bf16 output is the fp32 result rounded once; torch's layer norm agrees; arguments are
checked."""
import numpy as np
import pytest
import torch

from compiled_extension import skip_unrun

C = pytest.importorskip("fastdpr.models._kernels_C")
ALL_PATHS = ("avx512", "scalar")
PATHS = C.layer_norm_paths()  # the ones this CPU runs


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def _norm(x, gamma, beta, eps, out_dtype, path):
    out = torch.empty(x.shape, dtype=out_dtype)
    C.layer_norm(_bits(x) if x.dtype == torch.bfloat16 else x.numpy(), gamma.numpy(), beta.numpy(), eps,
                 _bits(out) if out_dtype == torch.bfloat16 else out.numpy(), path)
    return out


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("width", [1, 15, 16, 17, 33, 384])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_every_path_matches_float64(rows, width, in_dtype):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    # an offset and a scale far from 0 and 1, as the residual stream has
    x = (torch.randn(rows, width, generator=g) * 4 + 3).to(in_dtype)
    gamma, beta = torch.randn(width, generator=g), torch.randn(width, generator=g)
    eps = 1e-12 if width > 1 else 1e-5
    want = torch.nn.functional.layer_norm(x.double(), (width,), gamma.double(), beta.double(), eps)
    for path in PATHS:
        got = _norm(x, gamma, beta, eps, torch.float32, path)
        # fp32 statistics and arithmetic: a few ulps of the largest output
        np.testing.assert_allclose(got.double(), want, rtol=0, atol=1e-6 * (float(want.abs().max()) + 1),
                                   err_msg=f"{path} seed {seed}")
        rounded = _norm(x, gamma, beta, eps, torch.bfloat16, path)
        assert torch.equal(rounded, got.bfloat16()), f"{path} seed {seed}"
    skip_unrun(ALL_PATHS, PATHS)


def test_bf16_output_equals_torchs_layer_norm_of_bf16_parameters():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(13, 384, generator=g) * 3 + 1).bfloat16()
    ln = torch.nn.LayerNorm(384, eps=1e-12)
    with torch.no_grad():
        ln.weight.normal_(generator=g)
        ln.bias.normal_(generator=g)
    ln = ln.bfloat16()
    want = ln(x).detach()
    for path in PATHS:
        got = _norm(x, ln.weight.detach().float(), ln.bias.detach().float(), 1e-12, torch.bfloat16, path)
        # fp32 statistics summed in another order: at most one bf16 step apart, almost always equal
        diff = (got.float() - want.float()).abs()
        assert float((diff <= want.float().abs() * 2 ** -7 + 1e-6).float().mean()) == 1.0, path
        assert float((got != want).float().mean()) < 0.01, path
    skip_unrun(ALL_PATHS, PATHS)


def test_in_place():
    x = (torch.randn(5, 40) * 2).bfloat16()
    gamma, beta = torch.rand(40) + 0.5, torch.randn(40)
    for path in PATHS:
        want = _norm(x, gamma, beta, 1e-6, torch.bfloat16, path)
        y = x.clone()
        C.layer_norm(_bits(y), gamma.numpy(), beta.numpy(), 1e-6, _bits(y), path)
        assert torch.equal(y, want), path
    skip_unrun(ALL_PATHS, PATHS)


def test_arguments_are_checked():
    x = np.ones((3, 8), np.float32)
    gb = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="gamma and beta"):
        C.layer_norm(x, np.ones(7, np.float32), gb, 1e-5, np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="x's shape"):
        C.layer_norm(x, gb, gb, 1e-5, np.empty((4, 8), np.float32))
    with pytest.raises(ValueError, match="float32 or uint16"):
        C.layer_norm(x, gb, gb, 1e-5, np.empty((3, 8), np.float64))
    with pytest.raises(ValueError, match="float32 or uint16"):
        C.layer_norm(x.astype(np.float64), gb, gb, 1e-5, np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        C.layer_norm(np.ones(8, np.float32), gb, gb, 1e-5, np.empty(8, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        out = np.empty((3, 8), np.float32)
        out.flags.writeable = False
        C.layer_norm(x, gb, gb, 1e-5, out)
    with pytest.raises(ValueError, match="eps"):
        C.layer_norm(x, gb, gb, -1.0, np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="layer_norm: unknown CPU level 'avx9'; the levels are scalar, avx2"):
        C.layer_norm(x, gb, gb, 1e-5, np.empty((3, 8), np.float32), "avx9")
