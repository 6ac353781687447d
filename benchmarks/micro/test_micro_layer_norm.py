"""Layer norm of a question's hidden states on one thread: fastdpr's compiled layer norm (each path this CPU runs)
against torch's ``nn.LayerNorm`` on the same rows, MiniLM's width (384) at 14 tokens (a median SQuAD question), bf16
and fp32. At this size both are mostly call overhead, which is what the few-rows forward pass saves
(``fastdpr.models.inference.FewRowsTower``).
"""
import numpy as np
import pytest
import torch

C = pytest.importorskip("fastdpr.models._kernels_C")
ROWS, WIDTH = 14, 384


def _paths():
    return list(C.layer_norm_paths())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("impl", ["torch"] + _paths())
def test_layer_norm(benchmark, impl, dtype):
    torch.set_num_threads(1)
    benchmark.group = f"layer norm, {ROWS} x {WIDTH}, {str(dtype).removeprefix('torch.')}"
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(ROWS, WIDTH, generator=g) * 3 + 1).to(dtype)
    ln = torch.nn.LayerNorm(WIDTH, eps=1e-12).to(dtype)
    if impl == "torch":
        with torch.inference_mode():
            out = benchmark(ln, x)
    else:
        def bits(t):
            return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

        out = torch.empty_like(x)
        gamma, beta = (p.detach().float().numpy() for p in (ln.weight, ln.bias))
        benchmark(C.layer_norm, bits(x), gamma, beta, 1e-12, bits(out), impl)
    assert bool(torch.isfinite(out.float()).all())
