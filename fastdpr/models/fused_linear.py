"""Linear layers of the inference towers with their epilogue fused: one oneDNN call with a pre-packed weight on
CPUs that have it, the few-rows kernel for a few rows where it runs, ``F.linear`` + activation + add elsewhere, all
with the same answers."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fastdpr.models import compiled

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
# the same activations as oneDNN post-ops: (attr, algorithm) of torch.ops.mkldnn._linear_pointwise
ONEDNN_ACTIVATIONS = {
    None: ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}
# rows of a typical batch; oneDNN picks the packed layout for it, and the layout stays correct (and about as fast)
# for any row count
PACK_ROWS_HINT = 4096


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether pre-packed, epilogue-fused oneDNN linear layers run here (x86/ARM CPU builds of torch with
    oneDNN, float32 or bfloat16)."""
    available = (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
                 and torch.backends.mkldnn.is_available()
                 and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
    if available and dtype == torch.bfloat16:
        # oneDNN's bf16 linear refuses CPUs without AVX512-BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only CPU): there
        # bf16 weights take F.linear, slow but exact
        from fastdpr.models.precision import bf16_supported

        return bf16_supported(device)
    return available


class FusedLinear(nn.Module):
    """``activation(x Wᵀ + b) + residual``: one oneDNN call with a pre-packed weight where available
    (:meth:`prepack`), else ``F.linear`` followed by the activation and the add. A layer has either an activation
    or a residual, not both (a transformer layer needs no more)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        self.activation = activation
        self.packed: torch.Tensor | None = None
        self.few_rows: tuple[np.ndarray, np.ndarray | None] | None = None  # (packed weight, fp32 bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> "FusedLinear":
        return cls(linear.weight, linear.bias, activation)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def prepack(self) -> "FusedLinear":
        """Re-lay the weight out once (after the final device and dtype are set): for oneDNN, and for the few-rows
        kernel where it runs (:func:`fastdpr.models.compiled.few_rows_kernel`); no-op elsewhere."""
        self.packed, self.few_rows = None, None
        weight, dtype = self.weight.detach(), self.weight.dtype
        if onednn_linear_available(weight.device, dtype):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
        kernel = compiled.few_rows_kernel(dtype) if weight.device.type == "cpu" else None
        pairs_fit = dtype != torch.bfloat16 or self.in_features % 2 == 0  # bf16 panels hold column pairs
        if kernel is not None and self.out_features % 32 == 0 and pairs_fit:
            bias = None if self.bias is None else self.bias.detach().float().numpy()
            packed = kernel.linear_bf16_pack(compiled.bits(weight.contiguous())) if dtype == torch.bfloat16 else \
                kernel.linear_f32_pack(weight.contiguous().numpy())
            self.few_rows = (packed, bias)
        return self

    def _apply(self, fn, recurse=True):
        # packed copies of the old weight would be stale after .to()/.float()
        self.packed, self.few_rows = None, None
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        few = self.few_rows is not None and x.dim() == 2 and x.shape[0] <= compiled.FEW_ROWS
        if few and x.dtype == self.weight.dtype:
            return self._forward_few_rows(x, residual)
        if self.packed is not None and x.dtype == self.weight.dtype:
            x = x.contiguous()
            if residual is not None:
                return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), self.packed, self.bias,
                                                                 "add")
            attr, algorithm = ONEDNN_ACTIVATIONS[self.activation]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        if self.activation is not None:
            y = ACTIVATIONS[self.activation](y)
        if residual is not None:
            y = y.add_(residual)
        return y

    def _forward_few_rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The few-rows kernel: fp32 sums, + bias, activation, + residual, rounded to bf16 once if bf16 (the order
        of oneDNN's fused epilogue)."""
        packed, bias = self.few_rows
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        activation, threads = compiled.FEW_ROWS_ACTIVATIONS[self.activation], torch.get_num_threads()
        kernel, bits = compiled.few_rows_kernel(x.dtype), compiled.bits
        if x.dtype == torch.bfloat16:
            kernel.linear_bf16(bits(x.contiguous()), packed, self.out_features, bias, activation,
                               None if residual is None else bits(residual.contiguous()), bits(out), threads=threads)
        else:
            kernel.linear_f32(x.contiguous().numpy(), packed, self.out_features, bias, activation,
                              None if residual is None else residual.contiguous().numpy(), out.numpy(),
                              threads=threads)
        return out
