"""The door to the compiled model kernels (``fastdpr.models._kernels_C``: csrc/attention.h, few_rows_linear.h,
layer_norm.h): whether each runs vectorised on this CPU for a dtype, and the names and limits the towers use with
them. The rest of ``models/`` reaches the kernels through here only; the index core (``fastdpr._C``) is not
involved. Like every compiled path they are off under ``FASTDPR_NO_NATIVE=1``."""
from __future__ import annotations

import functools
import os

import numpy as np
import torch

from fastdpr import CPU_LEVELS

# products of at most this many rows (a question, a small batch) go through fastdpr's few-rows kernel where it runs
# (csrc/few_rows_linear.h); above it oneDNN is as fast (benchmarks/results/few_rows.md at c97483c: MiniLM's layers
# in a 6-layer weight rotation on an AMD EPYC, bf16 and fp32, the gain shrinking to a few percent at 64 rows)
FEW_ROWS = 64
# the same activations in the few-rows kernel (csrc/few_rows_linear.h)
FEW_ROWS_ACTIVATIONS = {None: "", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "relu": "relu"}


@functools.lru_cache(maxsize=None)
def kernels():
    """The ``fastdpr.models._kernels_C`` module, or None when it is not built or ``FASTDPR_NO_NATIVE`` is set."""
    if os.environ.get("FASTDPR_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from fastdpr.models import _kernels_C
    except ImportError:
        return None
    return _kernels_C


def _vectorised(levels: list[str]) -> bool:
    """Whether the widest of a kernel's CPU levels that runs here (its ``*_paths()``, widest first) is a vector one:
    every kernel table ends with the scalar level (csrc/cpu.h), which runs everywhere."""
    return levels[0] != CPU_LEVELS[0]


def bits(t: torch.Tensor) -> np.ndarray:
    """A 16-bit tensor's bits as a numpy uint16 array sharing its memory (numpy has no bfloat16)."""
    return t.view(torch.int16).numpy().view(np.uint16)


@functools.lru_cache(maxsize=None)
def attention_kernel(dtype: torch.dtype):
    """The kernels' module when its attention kernel for ``dtype`` runs vectorised on this CPU (bf16: AMX or
    AVX512-BF16; fp32: AVX-512), else None."""
    names = {torch.bfloat16: "bf16", torch.float32: "f32"}
    module = kernels()
    if dtype not in names or module is None:
        return None
    return module if _vectorised(module.attention_paths(names[dtype])) else None


@functools.lru_cache(maxsize=None)
def few_rows_kernel(dtype: torch.dtype):
    """The kernels' module where its few-rows linear layer for ``dtype`` is the fastest choice, else None: bf16 with
    AVX512-BF16, fp32 with AVX-512, both only on CPUs without AMX (on AMX CPUs oneDNN's tiles are used at every
    row count for bf16, and fp32 has not been measured there)."""
    module = kernels()
    if module is None or module.cpu_features()["amx"]:
        return None
    if dtype == torch.bfloat16:
        return module if _vectorised(module.linear_bf16_paths()) else None
    if dtype == torch.float32:
        return module if _vectorised(module.linear_f32_paths()) else None
    return None
