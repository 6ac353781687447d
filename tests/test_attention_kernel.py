"""The compiled attention kernels (csrc/attention.h), bf16 and fp32: every path against the scalar path and against
torch's attention in fp32, on random packed batches of odd lengths; their argument checks; the inference tower with
and without them."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compiled_extension import skip_unrun, unavailable

C = pytest.importorskip("fastdpr.models._kernels_C")
BF16_PATHS, F32_PATHS = ("amx", "avx512_bf16", "scalar"), ("avx512", "scalar")


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def _reference(qkv, groups, heads, head_dim):
    out, start = [], 0
    for n, length in groups:
        g = qkv[start:start + n * length].view(n, length, 3, heads, head_dim)
        q, k, v = (g[:, :, i].transpose(1, 2).float() for i in range(3))
        out.append(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n * length, heads * head_dim))
        start += n * length
    return torch.cat(out)


def _run(qkv, groups, heads, path, threads=1):
    out = torch.empty(qkv.shape[0], qkv.shape[1] // 3, dtype=torch.bfloat16)
    C.attention_bf16(_bits(qkv), _bits(out), np.asarray(groups, dtype=np.int64).reshape(-1, 2), heads, path,
                     threads)
    return out.float()


def _run_f32(qkv, groups, heads, path, threads=1):
    out = torch.empty(qkv.shape[0], qkv.shape[1] // 3)
    C.attention_f32(qkv.numpy(), out.numpy(), np.asarray(groups, dtype=np.int64).reshape(-1, 2), heads, path,
                    threads)
    return out


CASES = [  # (heads, head_dim, groups)
    (12, 32, [(1, 1)]),
    (12, 32, [(2, 7), (1, 17), (3, 33)]),
    (3, 32, [(1, 15), (1, 16), (1, 31), (1, 32), (1, 33)]),
    (2, 64, [(4, 9), (1, 130)]),
    (5, 16, [(2, 11), (1, 50)]),
    (1, 96, [(1, 257)]),
]


@pytest.mark.parametrize("heads,head_dim,groups", CASES)
def test_every_path_matches_fp32_attention_and_the_scalar_path(heads, head_dim, groups):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    rows = sum(n * length for n, length in groups)
    qkv = (torch.randn(rows, 3 * heads * head_dim, generator=g) * 2).bfloat16()
    want = _reference(qkv, groups, heads, head_dim)
    scalar = _run(qkv, groups, heads, "scalar")
    # bf16 output: a rounding of at most one bf16 step (2^-8 relative) of values up to |v| ~ 8
    torch.testing.assert_close(scalar, want, rtol=2 ** -7, atol=2 ** -6, msg=f"seed {seed}")
    for path in C.attention_paths():
        if path == "amx" and head_dim % 32:
            with pytest.raises(ValueError, match="multiple of 32"):
                _run(qkv, groups, heads, path)
            continue
        got = _run(qkv, groups, heads, path)
        # the same roundings as the scalar path, sums in another order: within one bf16 step of it
        torch.testing.assert_close(got, scalar, rtol=2 ** -7, atol=2 ** -6, msg=f"{path}, seed {seed}")
        torch.testing.assert_close(_run(qkv, groups, heads, path, threads=2), got, rtol=0, atol=0)
    skip_unrun(BF16_PATHS, C.attention_paths())


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_large_scores_and_a_single_key(dtype):
    # scores far apart (softmax saturates) and a one-token sequence (weight 1 on itself): output = its value
    heads, head_dim = 2, 32
    qkv = torch.zeros(1 + 40, 3 * heads * head_dim)
    qkv[:, : heads * head_dim] = 30.0
    qkv[:, heads * head_dim : 2 * heads * head_dim] = torch.linspace(-30, 30, 41)[:, None]
    qkv[:, 2 * heads * head_dim :] = torch.arange(41, dtype=torch.float32)[:, None]
    if dtype == "bf16":
        qkv = qkv.bfloat16()
    groups = [(1, 1), (1, 40)]
    want = _reference(qkv, groups, heads, head_dim)
    run, tol = (_run, 2 ** -7) if dtype == "bf16" else (_run_f32, 1e-5)
    for path in C.attention_paths(dtype):
        got = run(qkv, groups, heads, path)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=tol, atol=2 * tol)
        assert float(got[0, 0]) == 0.0  # the first sequence's value row is 0
    skip_unrun(BF16_PATHS if dtype == "bf16" else F32_PATHS, C.attention_paths(dtype))


def test_bad_arguments_are_refused():
    qkv = torch.zeros(10, 3 * 2 * 32, dtype=torch.bfloat16)
    out = torch.zeros(10, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cover 9 rows"):
        C.attention_bf16(_bits(qkv), _bits(out), np.array([[1, 9]]), 2, "", 1)
    with pytest.raises(ValueError, match="length 0"):
        C.attention_bf16(_bits(qkv), _bits(out), np.array([[1, 10], [1, 0]]), 2, "", 1)
    with pytest.raises(ValueError, match="out must be"):
        C.attention_bf16(_bits(qkv), _bits(torch.zeros(10, 32, dtype=torch.bfloat16)), np.array([[1, 10]]), 2, "",
                         1)
    with pytest.raises(ValueError, match="attention_bf16: unknown CPU level 'gpu'"):
        C.attention_bf16(_bits(qkv), _bits(out), np.array([[1, 10]]), 2, "gpu", 1)
    with pytest.raises(ValueError, match="multiple of 16"):
        C.attention_bf16(_bits(qkv), _bits(torch.zeros(10, 64, dtype=torch.bfloat16)), np.array([[1, 10]]), 8,
                         "", 1)
    # out is written in place: a float array or a strided view is refused, never converted into a copy
    with pytest.raises(TypeError):
        C.attention_bf16(_bits(qkv), out.float().numpy(), np.array([[1, 10]]), 2, "", 1)
    with pytest.raises(TypeError):
        C.attention_bf16(_bits(qkv), _bits(torch.zeros(10, 128, dtype=torch.bfloat16))[:, ::2], np.array([[1, 10]]),
                         2, "", 1)


def test_tower_with_the_kernel_equals_the_tower_without(tmp_path, monkeypatch):
    from tiny_models import tiny_biencoder

    from fastdpr.models import compiled

    if compiled.attention_kernel(torch.bfloat16) is None:
        pytest.skip(f"{unavailable('avx512_bf16')}: the bf16 tower uses torch's attention")
    model = tiny_biencoder(tmp_path, hidden=64, layers=2)  # 2 heads of 32
    texts = ["a short one", "a somewhat longer passage about the history of the thing", "x " * 40]
    with_kernel = model.encode_passages(texts, precision="bf16", show_progress=False)
    monkeypatch.setattr(compiled, "attention_kernel", lambda dtype: None)
    without = model.encode_passages(texts, precision="bf16", show_progress=False)
    cos = (with_kernel * without).sum(1) / np.linalg.norm(with_kernel, axis=1) / np.linalg.norm(without, axis=1)
    assert cos.min() > 0.999


# ------------------------------------------------------------------------------------------------------------ fp32
@pytest.mark.parametrize("heads,head_dim,groups", CASES)
def test_fp32_paths_match_torch_attention(heads, head_dim, groups):
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    rows = sum(n * length for n, length in groups)
    qkv = torch.randn(rows, 3 * heads * head_dim, generator=g) * 2
    want = _reference(qkv, groups, heads, head_dim)
    assert C.attention_paths("f32")[-1] == "scalar"
    for path in C.attention_paths("f32"):
        got = _run_f32(qkv, groups, heads, path)
        # no roundings besides fp32's own: sums of up to 257 terms in another order, exp to 2e-7
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{path}, seed {seed}")
        torch.testing.assert_close(_run_f32(qkv, groups, heads, path, threads=2), got, rtol=0, atol=0)
    skip_unrun(F32_PATHS, C.attention_paths("f32"))


def test_fp32_bad_arguments_are_refused():
    qkv = np.zeros((10, 3 * 2 * 32), dtype=np.float32)
    out = np.zeros((10, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="attention_f32: the groups cover 9 rows"):
        C.attention_f32(qkv, out, np.array([[1, 9]]), 2, "", 1)
    with pytest.raises(ValueError, match="attention_f32: no amx kernel; it has avx512, scalar"):
        C.attention_f32(qkv, out, np.array([[1, 10]]), 2, "amx", 1)
    with pytest.raises(ValueError, match="attention_f32: unknown CPU level 'avx512bf16'; the levels are scalar, "):
        C.attention_f32(qkv, out, np.array([[1, 10]]), 2, "avx512bf16", 1)
    with pytest.raises(ValueError, match="multiple of 16"):
        C.attention_f32(qkv, np.zeros((10, 64), dtype=np.float32), np.array([[1, 10]]), 8, "", 1)
    with pytest.raises(ValueError, match="dtype must be"):
        C.attention_paths("fp8")
    with pytest.raises(TypeError):  # out is written in place: never converted into a copy
        C.attention_f32(qkv, out.astype(np.float64), np.array([[1, 10]]), 2, "", 1)
    with pytest.raises(ValueError, match="attention_bf16: no avx512 kernel"):  # the fp32 level is not one of bf16's
        C.attention_bf16(_bits(torch.zeros(10, 192, dtype=torch.bfloat16)),
                         _bits(torch.zeros(10, 64, dtype=torch.bfloat16)), np.array([[1, 10]]), 2, "avx512", 1)


def test_fp32_tower_with_the_kernel_equals_the_tower_without(tmp_path, monkeypatch):
    from tiny_models import tiny_biencoder

    from fastdpr.models import compiled

    if compiled.attention_kernel(torch.float32) is None:
        pytest.skip(f"{unavailable('avx512')}: the fp32 tower uses torch's attention")
    model = tiny_biencoder(tmp_path, hidden=64, layers=2)
    texts = ["a short one", "a somewhat longer passage about the history of the thing", "x " * 40]
    with_kernel = model.encode_passages(texts, precision="fp32", show_progress=False)
    monkeypatch.setattr(compiled, "attention_kernel", lambda dtype: None)
    without = model.encode_passages(texts, precision="fp32", show_progress=False)
    np.testing.assert_allclose(with_kernel, without, rtol=1e-4, atol=1e-5)


def test_group_sizes_near_the_int64_limit_are_refused_not_overflowed():
    """count x length beyond the rows (their product overflowing int64, or wrapping to exactly T) and a head count
    whose 3 x heads overflows: clear errors. In a subprocess: these were a SIGSEGV."""
    code = """
import numpy as np, fastdpr.models._kernels_C as C
qkv, out = np.zeros((4, 96), np.float32), np.zeros((4, 32), np.float32)
seen = []
for groups in ([[1, 2**62]], [[2**62, 2]], [[4, 2**62 + 1]], [[2**61, 2**3]], [[1, 2], [2**62, 4]], [[2**40, 1]]):
    for fn, q, o in ((C.attention_f32, qkv, out),
                     (C.attention_bf16, qkv.view(np.uint16)[:, :96], out.view(np.uint16)[:, :32].copy())):
        try:
            fn(np.ascontiguousarray(q), o, np.array(groups, np.int64), 1, "scalar", 1)
        except ValueError as exc:
            seen.append("rows of qkv left" in str(exc))
try:
    C.attention_f32(qkv, out, np.array([[1, 4]], np.int64), 2**62, "", 1)
except ValueError as exc:
    seen.append("heads do not fit" in str(exc))
print(seen)
"""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str([True] * 13)
