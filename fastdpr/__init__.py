"""fastdpr: Dense Passage Retrieval end to end.

split -> BM25 -> mine negatives -> train -> encode -> index -> search -> hybrid -> read -> evaluate.

The top-level names are imported lazily so that ``import fastdpr`` stays cheap and never needs torch, triton or a
GPU until a model or a loss is actually used.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Corpus": "fastdpr.data.corpus",
    "BM25": "fastdpr.sparse.bm25",
    "BiEncoder": "fastdpr.models.biencoder",
    "Trainer": "fastdpr.train.trainer",
    "encode_corpus": "fastdpr.encode",
    "Index": "fastdpr.index",
    "build_index": "fastdpr.index",
    "load_index": "fastdpr.index",
    "DenseRetriever": "fastdpr.retrieve",
    "SparseRetriever": "fastdpr.retrieve",
    "HybridRetriever": "fastdpr.retrieve",
    "Reader": "fastdpr.reader",
    "evaluate_retrieval": "fastdpr.eval",
    "has_answer": "fastdpr.text.answers",
    "inbatch_nll": "fastdpr.kernels",
}

__all__ = sorted(_LAZY) + ["__version__", "cpu_features"]

# the CPU levels of csrc/cpu.h, each implying the ones before it: the names every kernel's level argument takes,
# and the one place in Python that lists them (the compiled modules' cpu_levels() gives the same, tested)
CPU_LEVELS = ("scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx")


def cpu_features(detected: bool = False) -> dict:
    """What the compiled kernels (index and model alike) may use on this machine: ``{level: bool}`` for each of
    :data:`CPU_LEVELS` (scalar: always; avx2 with FMA and F16C; avx512: F+BW+VL; avx512_vnni, avx512_bf16, amx),
    plus ``cap``, the ``FASTDPR_SIMD`` value that limits them ("" when unset). ``detected=True``: what the CPU and
    OS offer, ignoring the cap. Without the compiled extension every level but scalar is False (no kernel runs
    vectorised). Loads only a tiny extension, never torch.

    Raises :class:`fastdpr.errors.InputError` when ``FASTDPR_SIMD`` names no level (the kernels then ignore it)."""
    try:
        from fastdpr import _cpu
    except ImportError:
        import os

        return {**{level: level == CPU_LEVELS[0] for level in CPU_LEVELS}, "cap": os.environ.get("FASTDPR_SIMD", "")}
    features = _cpu.cpu_features(detected)
    if not features.pop("cap_valid"):
        from fastdpr.errors import InputError

        raise InputError(f"FASTDPR_SIMD={features['cap']!r} names no level; expected one of "
                         f"{', '.join(CPU_LEVELS)} (the kernels ignore it)")
    return features


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdpr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
