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

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdpr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
