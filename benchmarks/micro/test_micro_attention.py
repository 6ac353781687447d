"""bf16 attention on one thread: fastdpr's compiled kernel (each path this CPU runs) against torch's
``scaled_dot_product_attention`` on the same packed batch, MiniLM's shape (12 heads of 32), 8 sequences of 134
tokens (the mean SQuAD paragraph) and 32 of 20 (questions).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

C = pytest.importorskip("fastdpr.models._kernels_C")
HEADS, HEAD_DIM = 12, 32
SHAPES = [(8, 134), (32, 20)]


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def _paths():
    return [p for p in C.attention_paths() if p != "scalar"]


@pytest.mark.parametrize("count,length", SHAPES)
@pytest.mark.parametrize("impl", ["torch"] + _paths())
def test_attention_bf16(benchmark, impl, count, length):
    torch.set_num_threads(1)
    benchmark.group = f"bf16 attention, {count} x {length} tokens, {HEADS} heads of {HEAD_DIM}"
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(count * length, 3 * HEADS * HEAD_DIM, generator=g).bfloat16()
    if impl == "torch":
        view = qkv.view(count, length, 3, HEADS, HEAD_DIM)
        q, k, v = (view[:, :, i].transpose(1, 2) for i in range(3))
        out = benchmark(F.scaled_dot_product_attention, q, k, v)
        out = out.transpose(1, 2).reshape(count * length, HEADS * HEAD_DIM)
    else:
        out = torch.empty(count * length, HEADS * HEAD_DIM, dtype=torch.bfloat16)
        groups = np.array([[count, length]], dtype=np.int64)
        benchmark(C.attention_bf16, _bits(qkv), _bits(out), groups, HEADS, impl, 1)
    assert bool(torch.isfinite(out.float()).all())
