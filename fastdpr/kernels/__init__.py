"""Fused in-batch negative log-likelihood for dual-encoder training.

``inbatch_nll`` computes the softmax cross-entropy of every query against all passages of the batch without
materialising the B×N score matrix: Triton kernels on the GPU (or under the Triton interpreter), a row-chunked
PyTorch fallback elsewhere.  Importing this package never needs triton or a GPU; triton is imported on first use.

Example:
    >>> import torch
    >>> from fastdpr.kernels import inbatch_nll
    >>> q = torch.randn(2, 4, requires_grad=True)
    >>> p = torch.randn(4, 4, requires_grad=True)     # [pos_0, hn_0, pos_1, hn_1]
    >>> loss = inbatch_nll(q, p, torch.tensor([0, 2]), scale=1.0)
    >>> loss.backward()
"""
from .loss import InBatchNLLLoss, inbatch_nll, resolve_backend
from .inbatch_nll_torch import inbatch_nll_reference

__all__ = ["inbatch_nll", "InBatchNLLLoss", "inbatch_nll_reference", "resolve_backend"]
