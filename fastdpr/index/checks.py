"""The checks every index input passes at the boundary (arrays, ids, k, threads, search parameters) and the
padding of results, shared by :class:`fastdpr.index.base.Index`, the index types, ``tune`` and the retrievers.
A bad input is an ``InputError`` naming the argument."""
from __future__ import annotations

from typing import Any

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index._native import MAX_THREADS

# chunk of rows validated/converted at once on add, so a 21M x 768 fp16 array never needs a full fp32 copy
ADD_CHUNK = 65536


def take_params(params: dict[str, Any], allowed: dict[str, Any], where: str) -> dict[str, Any]:
    """Check ``params`` against ``allowed`` (name -> default; the default's type is the expected type) and return
    the defaults updated with ``params``. Unknown names and wrong types are an ``InputError`` naming ``where``."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InputError(f"unknown parameter(s) {unknown} for {where}; known: {sorted(allowed)}")
    out = dict(allowed)
    for key, value in params.items():
        default = allowed[key]
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise InputError(f"{where}: {key} is a flag (true/false), got {value!r}")
            value = bool(value)
        elif isinstance(default, int) and default is not None:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"{where}: {key} must be an integer, got {value!r}")
            value = int(value)
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InputError(f"{where}: {key} must be a number, got {value!r}")
            value = float(value)
        out[key] = value
    return out


def check_shape(x: Any, dim: int | None, what: str) -> np.ndarray:
    """``x`` as a 2-D array of real numbers -- floating point or integer, converted to float32 later -- without
    copying (a 1-D vector becomes one row). Wrong dimension or dtype is an ``InputError`` naming ``what``."""
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise InputError(f"{what} must be a numeric array: {exc}") from None
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise InputError(f"{what} must be a 2-D array (n, dim), got shape {x.shape}")
    if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
        raise InputError(f"{what} must hold real numbers (floating point or integer), got dtype {x.dtype}")
    if dim is not None and x.shape[1] != dim:
        raise InputError(f"{what} have dimension {x.shape[1]} but the index has dimension {dim}")
    if x.shape[1] == 0:
        raise InputError(f"{what} have dimension 0")
    return x


def check_finite(x: np.ndarray, what: str) -> None:
    """NaN/Inf anywhere is an ``InputError`` naming the first bad row (checked in chunks: no full-size temporary)."""
    if x.dtype.kind != "f":
        return
    for start in range(0, x.shape[0], ADD_CHUNK):
        block = x[start:start + ADD_CHUNK]
        if not np.isfinite(block).all():
            bad = start + int(np.argwhere(~np.isfinite(block))[0, 0])
            raise InputError(f"{what} row {bad} contains NaN or Inf")


def check_scores(scores: np.ndarray, ids: np.ndarray, ranks_past_float32: bool) -> None:
    """Finite vectors whose inner products leave float32 (entries near 1e37 and more) score NaN or +-inf, and an
    index that computes in float32 then ranks them at random: flat search answered -inf after +inf (the fallback
    +inf ties in the wrong order), HNSW NaN. Such a score of a result found is an ``InputError`` naming the query,
    not an answer. An index that ranks in a scale of its own (``ranks_past_float32``: IVF-PQ, whose ids are the
    same at any scale, ``tests/test_index_reliability.py``) may report +inf; NaN or -inf are refused there too."""
    beyond = np.isneginf(scores) if ranks_past_float32 else np.isinf(scores)
    bad = np.isnan(scores) | ((ids >= 0) & beyond)
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        raise InputError(f"queries row {row}: inner products beyond the float32 range (+-3.4e38): the entries of the "
                         "queries or of the indexed vectors are too large; rescale them")


def check_matrix(x: Any, dim: int | None, what: str) -> np.ndarray:
    """Checked float32 C-contiguous rows (see ``check_shape`` and ``check_finite``)."""
    x = check_shape(x, dim, what)
    check_finite(x, what)
    return np.ascontiguousarray(x, dtype=np.float32)


FP16_MAX = 65504.0


def check_fp16_range(x: np.ndarray, what: str = "vectors") -> None:
    """fp16 storage cannot hold |v| > 65504 (it would become Inf and poison every score): a clear error instead."""
    for start in range(0, x.shape[0], ADD_CHUNK):
        block = x[start:start + ADD_CHUNK]
        if block.size and float(np.abs(block).max()) > FP16_MAX:
            bad = start + int(np.argwhere(np.abs(block) > FP16_MAX)[0, 0])
            raise InputError(f"{what} row {bad} has a component beyond the fp16 range (|v| > 65504); "
                             "use fp32 storage or rescale the vectors")


def check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"k must be a positive integer, got {k!r}")
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    return int(k)


def check_threads(threads: Any) -> int:
    """A ``threads=`` value: 0 (all cores) up to ``MAX_THREADS`` (64 per core, at most 4096)."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise InputError(f"threads must be an integer, got {threads!r}")
    if threads < 0:
        raise InputError(f"threads must be >= 0 (0: all cores), got {threads}")
    if threads > MAX_THREADS:
        raise InputError(f"threads={threads} is more than this machine can use (at most {MAX_THREADS}: 64 per core)")
    return int(threads)


# k beyond the index size only pads the result with (-inf, -1); a padded result larger than this is refused rather
# than allocated (csrc/bind.h has the same rule for direct calls to the compiled core)
MAX_PADDED_RESULT_BYTES = 1 << 30


def check_padding(questions: int, k: int, n: int, what: str = "the index", unit: str = "vectors") -> None:
    """An ``InputError`` when ``k`` is beyond the ``n`` results there can be and padding ``questions`` result rows
    to ``k`` would take more than ``MAX_PADDED_RESULT_BYTES``: memory would grow with k, not with what exists."""
    if k > n and questions * k * 12 > MAX_PADDED_RESULT_BYTES:
        raise InputError(f"k={k} is larger than {what} ({n} {unit}), and padding {questions} result rows to that "
                         f"width takes {questions * k * 12 >> 20} MiB; ask for k <= {n}")


def pad_results(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(nq, k') results widened to k columns with -inf scores and -1 ids."""
    nq, have = rows.shape
    if have >= k:
        return scores, rows
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    out_s[:, :have] = scores
    out_i[:, :have] = rows
    return out_s, out_i


def check_ids(ids: Any, n: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] != n:
        raise InputError(f"ids must be a 1-D array of {n} integers, got shape {ids.shape}")
    if n and ids.dtype.kind not in "iu":
        raise InputError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if n and ids.min() < 0:
        raise InputError("ids must be >= 0 (-1 marks a missing result)")
    if np.unique(ids).shape[0] != n:
        raise InputError("ids must be unique")
    return ids
