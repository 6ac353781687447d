"""How far the fp32 in-batch loss can be from its float64 reference on the GPU check's inputs, on the CPU.

The GPU check (benchmarks/gpu_check.py, section 1) scores unnormalised Gaussian vectors at scale 20, so logits reach
about 3,000; fp32 holds such a number to 2.4e-4 (its unit in the last place), and the softmax weights inherit that
as a relative error. This runs the same inputs through the chunked PyTorch fallback in fp32, the yardstick for the
Triton kernels' own fp32 errors:

    python benchmarks/fp32_rounding.py            # B = 1,000 and 4,096, d = 768, one hard negative, 1 thread
"""
import math
import sys

import torch

from fastdpr.kernels import inbatch_nll


def main() -> int:
    torch.set_num_threads(1)
    sizes = [int(b) for b in sys.argv[1:]] or [1000, 4096]
    print("| B | max abs logit | fp32 ulp there | dq rel. error | dp rel. error |\n|---:|---:|---:|---:|---:|")
    for B in sizes:
        # gpu_check.py's distribution and seed (its CUDA generator draws other numbers from them)
        gen = torch.Generator().manual_seed(B + 768)
        q = torch.randn(B, 768, generator=gen)
        p = torch.randn(2 * B, 768, generator=gen)
        targets = torch.arange(B) * 2
        qq, pp = q.clone().requires_grad_(), p.clone().requires_grad_()
        gq, gp = torch.autograd.grad(inbatch_nll(qq, pp, targets, scale=20.0, backend="torch"), (qq, pp))
        q64, p64 = q.double().requires_grad_(), p.double().requires_grad_()
        rq, rp = torch.autograd.grad(inbatch_nll(q64, p64, targets, scale=20.0, backend="reference"), (q64, p64))

        def rel(a, b):
            return float((a.double() - b).abs().max() / b.abs().max())

        top = float((20.0 * q @ p.T).abs().max())
        ulp = 2.0 ** (math.floor(math.log2(top)) - 23)
        print(f"| {B:,} | {top:,.0f} | {ulp:.1e} | {rel(gq, rq):.2e} | {rel(gp, rp):.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
