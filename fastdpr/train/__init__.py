"""Training: the loop every model shares (``Trainer``, ``TrainingArguments``, the ``Task`` it trains) and the dual
encoder's task (``BiEncoderTask``, ``BiEncoderArguments``: batches with hard negatives, the fused loss, GradCache).

The heavy names load lazily so ``import fastdpr.train`` stays cheap."""
from __future__ import annotations

import importlib

_LAZY = {
    "Trainer": "fastdpr.train.trainer",
    "TrainingArguments": "fastdpr.train.trainer",
    "Task": "fastdpr.train.task",
    "BiEncoderArguments": "fastdpr.train.biencoder",
    "BiEncoderTask": "fastdpr.train.biencoder",
    "Batch": "fastdpr.train.data",
    "BatchBuilder": "fastdpr.train.data",
    "Example": "fastdpr.train.data",
    "load_examples": "fastdpr.train.data",
    "examples_from_records": "fastdpr.train.data",
    "GradCacheStep": "fastdpr.train.grad_cache",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdpr.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
