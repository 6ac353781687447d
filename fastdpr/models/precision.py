"""The precision policy of inference: the precision names, what ``auto`` means on each device, and whether bf16
runs natively here."""
from __future__ import annotations

import torch

from fastdpr.errors import InputError

# canonical names (the same as `fastdpr train --precision`) and the long names kept as aliases
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}


def resolve_precision(precision: str, device: torch.device) -> str:
    """A canonical precision name; ``auto`` is fp16 on CUDA and fp32 elsewhere."""
    name = ALIASES.get(precision, precision)
    if name not in PRECISIONS:
        raise InputError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)} "
                         f"(or {', '.join(ALIASES)})")
    if name == "auto":
        name = "fp16" if device.type == "cuda" else "fp32"
    if name == "int8" and device.type != "cpu":
        raise InputError("precision int8 runs on the CPU only (dynamic quantization); use fp16 or bf16 on "
                         f"{device.type}")
    return name


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively here, so bf16 (weights or autocast) is faster than float32: a
    CUDA device that supports it, or a CPU with AVX512-BF16/AMX (oneDNN's check). Elsewhere bf16 is emulated and
    slower than float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
