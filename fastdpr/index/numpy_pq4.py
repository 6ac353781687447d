"""The numpy twin of IVF-PQ's 4-bit parts: fast-scan codes (csrc/pq4.h) and 4-bit rows (csrc/sq4.h).

``NumpyIVFPQ`` (fastdpr/index/ivfpq.py) reads, searches and writes indexes with 4-bit codes (``nbits=4``) and
4-bit rows (``sq=4``) through these functions, so that the fallback gives the compiled index's answers on the same
file. What decides a search is reproduced operation for operation where it can be:

* a query's table ``lut[j][c] = <q_j, codeword c of sub-space j>`` is summed in the order of csrc/ivfpq.cpp
  (``lut4_scalar``: from 0, t = 0..dsub-1, each product rounded on its own), in float32;
* its uint8 quantization (``quantize_tables``) is pq4::quantize_lut's: float32 row minima and ranges, the offsets
  and ranges summed in float64 in sub-space order, one shared scale, entries rounded by + 0.5 and truncation;
* a code row scores ``(<q, c> + bias) + delta * S`` in float32 with S the exact integer sum of its table entries;
* the candidates are the best by (score, then smaller position) among every row of the probed lists, which is
  what the compiled threshold and cuts keep (a row below the running threshold cannot be among them).

The coarse products <q, c>, the 4-bit row dot products and the exact re-rank are summed in a different order than
the compiled kernels (whose order depends on the SIMD level), so their scores agree to float rounding and two
results whose scores tie to within it may come back in the other order.

Building (training codebooks, choosing codes, quantizing rows) stays with the compiled core: a numpy index with
4-bit codes or rows refuses ``train`` and ``add`` with a ``MissingDependency`` that says so.
"""
from __future__ import annotations

import numpy as np

from fastdpr.errors import MissingDependency

KSUB = 16  # codewords per sub-space (csrc/pq4.h kKsub)
BLOCK = 32  # vectors per packed block (kBlock)
MAX_SUM = 65535  # quantized sums stay below 2^16
SQ_LEVELS = 16  # csrc/sq4.h kLevels


def refuse_build(nbits: int, sq: int, what: str) -> None:
    """Training and adding are left to the compiled core for 4-bit codes and rows (their codes are chosen by
    csrc/ivfpq.cpp and csrc/sq4.cpp): a clear error instead of a half-built index."""
    if nbits == 4 or sq:
        kind = "4-bit codes (nbits=4)" if nbits == 4 else "4-bit rows (sq=4)"
        raise MissingDependency(f"ivfpq: {what} an index with {kind} needs the compiled extension fastdpr._C; "
                                "the numpy backend reads, searches and writes such indexes but does not build them")


# ---------------------------------------------------------------------------------------------------------------
# code layout (csrc/pq4.h): blocks of 32 vectors; per sub-space 16 bytes, byte r holding vector r in its low
# nibble and vector r + 16 in its high one; sub-spaces padded to an even count, the last block padded with zeros


def padded_m(m: int) -> int:
    return (m + 1) & ~1


def packed_bytes(n, m: int):
    """Bytes of n packed vectors (n: an int or an array of list sizes)."""
    return -(-n // BLOCK) * padded_m(m) * 16


def pack(codes: np.ndarray, m: int) -> np.ndarray:
    """(n, m) codes < 16 -> packed_bytes(n, m) bytes of blocks."""
    n = codes.shape[0]
    nb, mp = -(-n // BLOCK), padded_m(m)
    full = np.zeros((nb * BLOCK, mp), np.uint8)
    full[:n, :m] = codes
    per_block = full.reshape(nb, BLOCK, mp).transpose(0, 2, 1)  # (blocks, sub-spaces, 32 vectors)
    return np.ascontiguousarray(per_block[:, :, :16] | (per_block[:, :, 16:] << 4)).reshape(-1)


def unpack(blocks: np.ndarray, n: int, m: int) -> np.ndarray:
    """The inverse of ``pack``: (n, m) codes from packed_bytes(n, m) bytes (padding ignored)."""
    nb, mp = -(-n // BLOCK), padded_m(m)
    b = np.asarray(blocks, np.uint8).reshape(nb, mp, 16)
    both = np.concatenate([b & 15, b >> 4], axis=2)  # (blocks, sub-spaces, 32 vectors)
    return np.ascontiguousarray(both.transpose(0, 2, 1).reshape(nb * BLOCK, mp)[:n, :m])


def pack_lists(codes: list[np.ndarray], m: int) -> np.ndarray:
    """The file's code section: each list's packed blocks, one list after the other."""
    return np.concatenate([np.empty(0, np.uint8)] + [pack(c, m) for c in codes])


def read_code_settings(reader, m: int, max_m4: int) -> tuple[int, float]:
    """(nbits, aniso_eta) of an IVF-PQ file, checked as csrc/ivfpq.cpp load checks them."""
    nbits = reader.meta_int("nbits", 4, 8)
    if nbits not in (4, 8):
        reader.fail("nbits must be 4 or 8")
    if nbits == 4 and m > max_m4:
        reader.fail("m is too large for 4-bit codes")
    eta = 1.0
    if nbits == 4 and reader.has_meta("aniso_eta"):
        eta = reader.meta_float("aniso_eta")
        if not (np.isfinite(eta) and eta > 0):
            reader.fail("aniso_eta must be a positive number")
    return nbits, eta


def read_codes(reader, list_sizes: np.ndarray, m: int) -> list[np.ndarray]:
    """Every list's (size, m) codes from the file's packed code section, whose length the list sizes fix."""
    ends = np.cumsum(packed_bytes(np.asarray(list_sizes, np.int64), m))
    blocks = reader.array("codes", np.uint8, int(ends[-1]) if len(ends) else 0)
    starts = ends - packed_bytes(np.asarray(list_sizes, np.int64), m)
    return [unpack(blocks[a:b], int(n), m) for a, b, n in zip(starts, ends, list_sizes)]


# ---------------------------------------------------------------------------------------------------------------
# query tables


def query_tables(q: np.ndarray, codebooks: np.ndarray) -> np.ndarray:
    """(nq, m, 16) float32 tables, summed as csrc/ivfpq.cpp lut4 does (no fused multiply-add, t ascending)."""
    m, ksub, dsub = codebooks.shape
    qs = np.ascontiguousarray(q, np.float32).reshape(q.shape[0], m, 1, dsub)
    cb = np.ascontiguousarray(codebooks.transpose(2, 0, 1), np.float32)  # (dsub, m, 16)
    acc = np.zeros((q.shape[0], m, ksub), np.float32)
    for t in range(dsub):
        acc += qs[:, :, :, t] * cb[t]  # the product is rounded to float32 before it is added
    return acc


def quantize_tables(lut: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pq4::quantize_lut for every query: ((nq, m, 16) uint8 tables, float32 bias, float32 delta). A table with a
    non-finite entry gives an all-zero table, bias NaN and delta 0 (nothing is scored)."""
    nq, m, _ = lut.shape
    lo = lut.min(axis=2)
    hi = lut.max(axis=2)
    finite = np.isfinite(lut).all(axis=(1, 2))
    with np.errstate(invalid="ignore", over="ignore"):
        # float64 sums in sub-space order: accumulate is sequential, where np.sum would sum pairwise
        bias = np.add.accumulate(lo.astype(np.float64), axis=1)[:, -1]
        sum_range = np.add.accumulate(hi.astype(np.float64) - lo.astype(np.float64), axis=1)[:, -1]
        max_range = (hi - lo).max(axis=1).astype(np.float64)  # float32 differences, as the compiled rows
        delta = np.maximum(max_range / 255.0, sum_range / float(MAX_SUM - m))
        delta = np.where(delta > 0, delta, 1.0)  # every row constant: all entries 0 whatever the scale
        inv = (1.0 / delta).astype(np.float32)
        x = (lut - lo[:, :, None]) * inv[:, None, None] + np.float32(0.5)  # each step rounded to float32
        table = np.minimum(np.float32(255), x).astype(np.uint8)  # truncation: the + 0.5 makes it round
    table[~finite] = 0
    bias = np.where(finite, bias, np.nan).astype(np.float32)
    delta = np.where(finite, delta, 0.0).astype(np.float32)
    return table, bias, delta


def scan(codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Exact integer sums sum_j table[j][codes[:, j]] of (n, m) code rows."""
    m = codes.shape[1]
    flat = table.reshape(-1).astype(np.int64)
    return flat[codes.astype(np.intp) + KSUB * np.arange(m)].sum(axis=1)


def code_scores(list_score: np.ndarray, bias: np.float32, delta: np.float32, sums: np.ndarray) -> np.ndarray:
    """pq4::score: (list score + bias) + delta * S, each operation rounded to float32."""
    base = np.asarray(list_score, np.float32) + np.float32(bias)
    return base + np.float32(delta) * sums.astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# 4-bit rows (csrc/sq4.h): byte j holds dimension 2j in its low nibble and 2j + 1 in its high one


def row_bytes(d: int) -> int:
    return (d + 1) // 2


def row_levels(rows: np.ndarray, d: int) -> np.ndarray:
    """(n, d) levels 0..15 of (n, row_bytes(d)) rows."""
    out = np.empty((rows.shape[0], 2 * rows.shape[1]), np.uint8)
    out[:, 0::2] = rows & 15
    out[:, 1::2] = rows >> 4
    return out[:, :d]


def row_scores(q: np.ndarray, rows: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """<q, lo + step * levels> of 4-bit rows: the constant <q, lo> summed in float64 in dimension order (as
    sq4::prepare_query), plus the scaled query's dot product with the levels, in float32."""
    q = np.asarray(q, np.float32)
    offset = np.float32(np.add.accumulate(q.astype(np.float64) * lo.astype(np.float64))[-1]) if q.size else \
        np.float32(0)
    scaled = (q * step).astype(np.float64)  # float32 products, as the compiled query
    dots = (row_levels(rows, q.shape[0]).astype(np.float64) @ scaled).astype(np.float32)
    return offset + dots


def read_rows(reader, d: int, n: int):
    """(sq bits, (lo, step) or None, the (n, row_bytes(d)) rows as mapped or None) of an IVF-PQ file, checked as
    csrc/ivfpq.cpp load checks them. An index given sq=4 but no rows yet has no ranges either."""
    bits = reader.meta_int("sq_bits", 4, 4) if reader.has_meta("sq_bits") else 0
    if not bits or not (reader.has("sq_lo") or n > 0):  # the ranges come with the first rows
        return bits, None, None
    lo, step = (np.array(reader.array(name, np.float32, d)) for name in ("sq_lo", "sq_step"))
    if not (np.isfinite(lo).all() and np.isfinite(step).all() and (step >= 0).all()):
        reader.fail("4-bit row ranges must be finite (steps >= 0)")
    rows = reader.array("sq_rows", np.uint8, n * row_bytes(d)).reshape(n, row_bytes(d))
    return bits, (lo, step), rows


def write_rows(writer, ranges: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> None:
    writer.add("sq_lo", np.ascontiguousarray(ranges[0], np.float32))
    writer.add("sq_step", np.ascontiguousarray(ranges[1], np.float32))
    writer.add("sq_rows", np.ascontiguousarray(rows, np.uint8))
