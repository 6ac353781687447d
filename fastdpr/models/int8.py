"""int8 linear layers: int8 weights (one scale per output row), activations quantized per call, through oneDNN
(VNNI / AMX-INT8) or fbgemm."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from fastdpr.models.fused_linear import ACTIVATIONS, ONEDNN_ACTIVATIONS


def onednn_int8_available() -> bool:
    """Whether oneDNN's int8 linear (VNNI / AMX-INT8 on x86) is in this torch build."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops, "onednn")
            and hasattr(torch.ops.onednn, "qlinear_prepack") and hasattr(torch.ops.onednn, "qlinear_pointwise"))


def vnni_available() -> bool:
    """Whether the CPU has VNNI (AVX512-VNNI or AMX-INT8): its int8 products add u8 x s8 pairs in 32 bits. Without
    it oneDNN and fbgemm add each pair in 16 bits first (VPMADDUBSW), which saturates once two products of 8-bit
    activations and 7-bit weights pass 32,767: the answer is silently wrong (errors of 15% of the output's range on
    an AVX2-only CPU), so activations there keep 7 bits, as torch's own dynamic quantization does."""
    from fastdpr import cpu_features

    features = cpu_features(detected=True)
    return bool(features.get("avx512_vnni") or features.get("amx"))


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output row) and activations quantized per call
    to 0..255 on CPUs with VNNI, 0..127 without (:func:`vnni_available`; one scale and zero point for the call's
    whole input, from its range); the output in ``out_dtype`` (float32, or bfloat16 with oneDNN). torch's
    ``quantize_dynamic`` default keeps weights per tensor and activations at 7 bits everywhere.

    Two kernels with the same integer arithmetic: oneDNN's int8 linear with the weight pre-packed and the activation
    fused (``backend="onednn"``, AMX-INT8 / VNNI), else fbgemm's dynamic linear (``"fbgemm"``, torch's quantized
    tensors)."""

    def __init__(self, linear: nn.Module, backend: str | None = None, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.activation = getattr(linear, "activation", None)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.backend = backend or ("onednn" if onednn_int8_available() else "fbgemm")
        if out_dtype != torch.float32 and self.backend != "onednn":
            raise ValueError(f"Int8Linear: output dtype {out_dtype} needs the onednn backend")
        self.out_dtype = out_dtype
        self.levels = 255 if vnni_available() else 127
        if self.backend == "onednn":
            qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
            self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
            self.weight_scale, self.bias = scale, bias
            self.weight_zero = torch.zeros(w.shape[0], dtype=torch.long)
            return
        with warnings.catch_warnings():
            # torch announces the removal of quantized tensor types; until then they are fbgemm's int8 GEMM's input
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0,
                                                 torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.backend == "onednn":
            x = x.contiguous()
            lo, hi = torch.aminmax(x)
            lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
            step = (hi - lo) / self.levels or 1.0
            zero = int(round(-lo / step))
            xq = _quantize_u8(x, step, zero)
            attr, algorithm = ONEDNN_ACTIVATIONS[self.activation]
            y = torch.ops.onednn.qlinear_pointwise(xq, step, zero, self.packed, self.weight_scale, self.weight_zero,
                                                   self.bias, 1.0, 0, self.out_dtype, attr,
                                                   [None] if attr == "none" else [], algorithm)
        else:
            y = torch.ops.quantized.linear_dynamic(x, self.packed, self.levels < 255)  # reduce_range
            if self.activation is not None:
                y = ACTIVATIONS[self.activation](y)
        return y.add_(residual) if residual is not None else y


def _quantize_u8(x: torch.Tensor, step: float, zero: int) -> torch.Tensor:
    """round(x / step) + zero, clamped to 0..255, as uint8, computed in float32 (bf16 cannot hold the integers
    above 256 it passes through). torch's quantize kernel does it in one pass, where the elementwise chain makes one
    per operation; the chain is the fallback for torch builds that no longer have quantized tensors."""
    x = x.float()
    if hasattr(torch, "quantize_per_tensor"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the deprecation notice of quantized tensor types
            return torch.quantize_per_tensor(x, step, zero, torch.quint8).int_repr()
    return torch.round(x * (1.0 / step)).add_(zero).clamp_(0, 255).to(torch.uint8)


def quantize_linears(module: nn.Module) -> None:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in place."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child)
