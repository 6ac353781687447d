"""The fused in-batch NLL, forward and forward+backward, beside the eager matmul + cross_entropy it replaces.

CPU: the row-chunked PyTorch fallback (``backend="torch"``). CUDA: the Triton kernels (``backend="triton"``),
skipped without a GPU. The batch is DPR's layout with one hard negative: B questions against 2B passages.
"""
import pytest
import torch

from fastdpr.kernels import inbatch_nll

D = 768
CASES = [  # (device, backend, B, dtype)
    ("cpu", "torch", 256, torch.float32),
    ("cuda", "triton", 8192, torch.float32),
    ("cuda", "triton", 8192, torch.bfloat16),
]
SCALE = 20.0  # cosine / tau with tau = 0.05, the GTR setting: the softmax is sharp, as in training


def _case_id(case) -> str:
    device, backend, b, dtype = case
    return f"{device}-{backend}-B{b}-{str(dtype).split('.')[-1]}"


def _batch(device: str, b: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(b, D, generator=g), dim=1)
    p = torch.nn.functional.normalize(torch.randn(2 * b, D, generator=g), dim=1)
    targets = torch.arange(b) * 2  # [pos_0, hn_0, pos_1, hn_1, ...]
    ids = torch.arange(2 * b)  # distinct passages: the false-negative mask is computed but removes nothing
    return q.to(device, dtype), p.to(device, dtype), targets.to(device), ids.to(device)


def _eager(q, p, targets):
    return torch.nn.functional.cross_entropy(SCALE * (q.float() @ p.float().t()), targets)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(params=CASES, ids=_case_id)
def case(request):
    device, backend, b, dtype = request.param
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: the Triton kernels are timed on a GPU only")
    return request.param


@pytest.mark.parametrize("method", ["fused", "eager"])
def test_loss_forward(benchmark, case, method):
    device, backend, b, dtype = case
    benchmark.group = f"loss forward {_case_id(case)}"
    q, p, targets, ids = _batch(device, b, dtype)

    def run():
        with torch.no_grad():
            out = inbatch_nll(q, p, targets, scale=SCALE, column_ids=ids, backend=backend) if method == "fused" \
                else _eager(q, p, targets)
        _sync(device)
        return out

    loss = benchmark(run)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.isfinite(loss) and abs(loss.item() - _eager(q, p, targets).item()) < tol * max(1.0, loss.item())


@pytest.mark.parametrize("method", ["fused", "eager"])
def test_loss_forward_backward(benchmark, case, method):
    device, backend, b, dtype = case
    benchmark.group = f"loss forward+backward {_case_id(case)}"
    q, p, targets, ids = _batch(device, b, dtype)
    q.requires_grad_(True)
    p.requires_grad_(True)

    def run():
        loss = inbatch_nll(q, p, targets, scale=SCALE, column_ids=ids, backend=backend) if method == "fused" \
            else _eager(q, p, targets)
        grads = torch.autograd.grad(loss, (q, p))
        _sync(device)
        return grads

    dq, dp = benchmark(run)
    ref_q, ref_p = torch.autograd.grad(_eager(q, p, targets), (q, p))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(dq.float(), ref_q.float(), atol=tol, rtol=1e-3)
    assert torch.allclose(dp.float(), ref_p.float(), atol=tol, rtol=1e-3)
