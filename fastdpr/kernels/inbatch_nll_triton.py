"""Triton kernels for the per-row log-sum-exp of masked in-batch scores, and its gradients.

This module imports triton at the top: import it only through ``fastdpr.kernels.loss``, which does so
lazily and only when triton is importable. ``@triton.jit`` decides at decoration time whether the kernels are
compiled for the GPU or run by the interpreter (``TRITON_INTERPRET=1``), so the mode this module was imported
under is recorded in :data:`INTERPRETED`.

The math (one direction; the loss and the bidirectional term are assembled in ``loss.py``)
------------------------------------------------------------------------------------------------
Queries ``Q`` (M×D), passages ``P`` (N×D), scale ``s``, target column ``y_i`` of each row, and a keep mask::

    keep_ij = (j < N) and valid_j and not (ids_j == rowid_i and j != y_i)       rowid_i = ids_{y_i}
    S_ij    = s · q_i·p_j   where keep_ij,   −inf elsewhere
    lse_i   = log Σ_j exp(S_ij)

The forward kernel streams passage tiles past a block of query rows and keeps, per row, a running maximum ``m``
and a running sum ``l = Σ exp2(S·log2e − m)`` (the online softmax).  Working in base 2 (``exp2`` with the
``log2 e`` factor folded into the scale) saves a multiply per element; ``lse = (m + log2 l)·ln 2``.  Only
``lse`` (M floats) is written: no M×N buffer ever exists.

Gradients of ``L = Σ_i g_i·lse_i`` with the softmax ``π_ij = exp(S_ij − lse_i)`` (0 on masked columns)::

    dL/dq_i = s · g_i · Σ_j π_ij p_j          (kernel over query blocks)
    dL/dp_j = s · Σ_i g_i π_ij q_i            (kernel over passage blocks)

Both backward kernels recompute ``S`` tile by tile from Q, P and the stored ``lse``.  Each program owns its
output rows, so there are no atomics and the result is deterministic.  The feature dimension of the output is
split over a second grid axis (``BLOCK_DO`` columns per program) so that the fp32 accumulator stays in registers
for wide embeddings (d = 768); the price is recomputing ``S`` once per output slice.

Every product is accumulated in fp32; row offsets are widened to int64 before multiplying by the row stride so
that B·d beyond 2³¹ elements cannot overflow.  The positive column is never masked (checked by the caller), so
every real row has a finite ``lse``; rows past ``M`` in the last block are fully masked and the online update
guards the ``−inf − (−inf)`` case so they never produce NaN.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

try:  # triton >= 3.3 reads its settings through knobs; older releases read the variable directly
    from triton import knobs

    _interpret = bool(knobs.runtime.interpret)
except ImportError:
    _interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: True when these kernels were decorated under ``TRITON_INTERPRET=1`` (they then run on CPU tensors only).
INTERPRETED: bool = _interpret

# the kernels spell these constants out (plain Python globals are not visible inside @triton.jit)
_LOG2E = 1.4426950408889634


@triton.jit
def _score_tile(
    a_ptr, b_ptr, offs_a, offs_b, n_a, n_b, D, stride_a, stride_b,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    """(BLOCK_A, BLOCK_B) fp32 tile of A[offs_a] · B[offs_b]ᵀ, summed over the feature axis in BLOCK_D slices."""
    acc = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    offs_d = tl.arange(0, BLOCK_D)
    rows_a = offs_a.to(tl.int64) * stride_a
    rows_b = offs_b.to(tl.int64) * stride_b
    in_a = offs_a < n_a
    in_b = offs_b < n_b
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + offs_d
        in_d = dd < D
        a = tl.load(a_ptr + rows_a[:, None] + dd[None, :], mask=in_a[:, None] & in_d[None, :], other=0.0)
        bt = tl.load(b_ptr + rows_b[None, :] + dd[:, None], mask=in_b[None, :] & in_d[:, None], other=0.0)
        acc = tl.dot(a, bt, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _keep_tile(
    offs_m, offs_n, M, N, row_target, row_id, valid_ptr, ids_ptr,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) mask of the (query row, passage column) pairs that take part in the softmax."""
    in_n = offs_n < N
    keep = (offs_m < M)[:, None] & in_n[None, :]
    if HAS_VALID:
        valid = tl.load(valid_ptr + offs_n, mask=in_n, other=0)
        keep = keep & (valid != 0)[None, :]
    if HAS_IDS:
        col_id = tl.load(ids_ptr + offs_n, mask=in_n, other=0)
        # the same passage as the row's positive, seen in another column: a false negative, not a negative
        dup = (col_id[None, :] == row_id[:, None]) & (offs_n[None, :] != row_target[:, None])
        keep = keep & (dup == 0)
    return keep


@triton.jit
def lse_fwd_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, lse_ptr,
    M, N, D, stride_q, stride_p, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
    row_id = row_target
    if HAS_IDS:
        row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max of S·log2e
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running Σ exp2(S·log2e − m_i)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = _score_tile(q_ptr, p_ptr, offs_m, offs_n, M, N, D, stride_q, stride_p,
                        BLOCK_M, BLOCK_N, BLOCK_D, PRECISION) * scale_log2e
        keep = _keep_tile(offs_m, offs_n, M, N, row_target, row_id, valid_ptr, ids_ptr, HAS_VALID, HAS_IDS)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row with nothing kept so far has m_new = −inf; shift by 0 instead so that exp2 sees −inf, not NaN
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_shift) + tl.sum(tl.exp2(s - m_shift[:, None]), axis=1)
        m_i = m_new
    # l_i > 0 on every real row (its positive is kept); the guard only silences rows past M
    lse = (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453
    tl.store(lse_ptr + offs_m, lse, mask=in_m)


@triton.jit
def lse_bwd_dq_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, lse_ptr, grad_ptr, dq_ptr,
    M, N, D, stride_q, stride_p, stride_dq, scale, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DO: tl.constexpr,
):
    """dQ[rows, cols] for one block of query rows and one BLOCK_DO slice of the feature axis."""
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    offs_do = pid_d * BLOCK_DO + tl.arange(0, BLOCK_DO)
    in_do = offs_do < D
    row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
    row_id = row_target
    if HAS_IDS:
        row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)
    lse_log2 = tl.load(lse_ptr + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    coef = tl.load(grad_ptr + offs_m, mask=in_m, other=0.0) * scale

    acc = tl.zeros((BLOCK_M, BLOCK_DO), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = _score_tile(q_ptr, p_ptr, offs_m, offs_n, M, N, D, stride_q, stride_p,
                        BLOCK_M, BLOCK_N, BLOCK_D, PRECISION) * scale_log2e
        keep = _keep_tile(offs_m, offs_n, M, N, row_target, row_id, valid_ptr, ids_ptr, HAS_VALID, HAS_IDS)
        # masking before exp2 keeps excluded columns from overflowing: exp2(−inf) = 0
        prob = tl.exp2(tl.where(keep, s, float("-inf")) - lse_log2[:, None])
        ds = prob * coef[:, None]
        p_blk = tl.load(p_ptr + offs_n.to(tl.int64)[:, None] * stride_p + offs_do[None, :],
                        mask=(offs_n < N)[:, None] & in_do[None, :], other=0.0)
        # half inputs: the probabilities go to the tensor cores in the input dtype, the sum stays fp32
        acc = tl.dot(ds.to(p_blk.dtype), p_blk, acc, input_precision=PRECISION)
    out = dq_ptr + offs_m.to(tl.int64)[:, None] * stride_dq + offs_do[None, :]
    tl.store(out, acc.to(dq_ptr.dtype.element_ty), mask=in_m[:, None] & in_do[None, :])


@triton.jit
def lse_bwd_dp_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, lse_ptr, grad_ptr, dp_ptr,
    M, N, D, stride_q, stride_p, stride_dp, scale, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DO: tl.constexpr,
):
    """dP[cols, feats] for one block of passage rows and one BLOCK_DO slice, looping over query blocks.

    The tile here is the transpose of the forward one: passages along the first axis, queries along the second,
    so the per-query quantities (target, row id, lse, grad) are broadcast along axis 0.
    """
    pid_n = tl.program_id(0)
    pid_d = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    offs_do = pid_d * BLOCK_DO + tl.arange(0, BLOCK_DO)
    in_do = offs_do < D
    col_keep = in_n
    if HAS_VALID:
        col_keep = col_keep & (tl.load(valid_ptr + offs_n, mask=in_n, other=0) != 0)
    col_id = offs_n
    if HAS_IDS:
        col_id = tl.load(ids_ptr + offs_n, mask=in_n, other=0)

    acc = tl.zeros((BLOCK_N, BLOCK_DO), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        in_m = offs_m < M
        row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
        lse_log2 = tl.load(lse_ptr + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
        coef = tl.load(grad_ptr + offs_m, mask=in_m, other=0.0) * scale
        st = _score_tile(p_ptr, q_ptr, offs_n, offs_m, N, M, D, stride_p, stride_q,
                         BLOCK_N, BLOCK_M, BLOCK_D, PRECISION) * scale_log2e
        keep = col_keep[:, None] & in_m[None, :]
        if HAS_IDS:
            row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)
            dup = (col_id[:, None] == row_id[None, :]) & (offs_n[:, None] != row_target[None, :])
            keep = keep & (dup == 0)
        prob = tl.exp2(tl.where(keep, st, float("-inf")) - lse_log2[None, :])
        ds = prob * coef[None, :]
        q_blk = tl.load(q_ptr + offs_m.to(tl.int64)[:, None] * stride_q + offs_do[None, :],
                        mask=in_m[:, None] & in_do[None, :], other=0.0)
        acc = tl.dot(ds.to(q_blk.dtype), q_blk, acc, input_precision=PRECISION)
    out = dp_ptr + offs_n.to(tl.int64)[:, None] * stride_dp + offs_do[None, :]
    tl.store(out, acc.to(dp_ptr.dtype.element_ty), mask=in_n[:, None] & in_do[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------------------------

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DO")


def _pow2_at_least(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


def interpreter_tiles(dim: int) -> dict:
    """Tiles for the interpreter: big feature slices (every tile is a numpy call, so fewer is faster)."""
    return {
        "BLOCK_M": 32,
        "BLOCK_N": 32,
        "BLOCK_D": min(_pow2_at_least(dim), 128),
        "BLOCK_DO": min(_pow2_at_least(dim), 256),
    }


def _gpu_configs(kind: str) -> list:
    """Autotune candidates for a real GPU. Only ever called on the compiled path: the interpreter cannot
    autotune (it has no driver to time kernels on)."""
    if INTERPRETED:
        raise RuntimeError("autotuning needs a GPU; under TRITON_INTERPRET=1 give tile sizes explicitly")
    # Chosen by compiling each kernel ahead of time for sm_90 and keeping tilings that ptxas reported without
    # register spills for bf16 inputs with both masks on; fp32 operands take twice the registers, so the last,
    # smaller tiling is there for fp32 (it compiled with at most 24 bytes of spill).  Autotuning then times
    # them on the real device.
    configs = []
    if kind == "fwd":
        for bm, bn, bd, warps, stages in [
            (128, 64, 64, 8, 3), (128, 128, 32, 8, 3), (64, 64, 64, 8, 3), (64, 64, 32, 4, 3), (64, 32, 32, 4, 3),
        ]:
            configs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd},
                                         num_warps=warps, num_stages=stages))
    else:
        # (rows owned, rows streamed, feature slice for S, output feature slice)
        for own, stream, bd, bdo, warps, stages in [
            (64, 64, 64, 256, 8, 3), (64, 32, 64, 256, 8, 3), (64, 64, 32, 256, 8, 3), (128, 32, 32, 128, 8, 3),
            (64, 32, 32, 128, 8, 3),
        ]:
            if kind == "dq":
                meta = {"BLOCK_M": own, "BLOCK_N": stream}
            else:
                meta = {"BLOCK_N": own, "BLOCK_M": stream}
            meta.update(BLOCK_D=bd, BLOCK_DO=bdo)
            configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    return configs


_TUNED: dict = {}


def _tuned_kernel(kind: str):
    if kind not in _TUNED:
        base = {"fwd": lse_fwd_kernel, "dq": lse_bwd_dq_kernel, "dp": lse_bwd_dp_kernel}[kind]
        _TUNED[kind] = triton.autotune(configs=_gpu_configs(kind), key=["M", "N", "D"])(base)
    return _TUNED[kind]


def _launch(kind: str, grid_fn, args: tuple, flags: dict, tiles: dict | None, dim: int) -> None:
    if tiles is None and INTERPRETED:
        tiles = interpreter_tiles(dim)
    if tiles is None:
        kernel = _tuned_kernel(kind)
        kernel[grid_fn](*args, **flags)
        return
    base = {"fwd": lse_fwd_kernel, "dq": lse_bwd_dq_kernel, "dp": lse_bwd_dp_kernel}[kind]
    meta = {k: int(tiles[k]) for k in TILE_KEYS if k in tiles and (kind != "fwd" or k != "BLOCK_DO")}
    missing = [k for k in TILE_KEYS if k not in meta and (kind != "fwd" or k != "BLOCK_DO")]
    if missing:
        raise ValueError(f"tiles is missing {missing}; give all of {TILE_KEYS}")
    for k, v in meta.items():
        if v < 16 or v & (v - 1):
            raise ValueError(f"tiles[{k!r}] must be a power of two >= 16, got {v}")
    launch = {}
    for k in ("num_warps", "num_stages"):
        if k in tiles and not INTERPRETED:
            launch[k] = int(tiles[k])
    base[grid_fn(meta)](*args, **flags, **meta, **launch)


def _flags(column_ids, valid_u8, precision: str) -> dict:
    return {"HAS_VALID": valid_u8 is not None, "HAS_IDS": column_ids is not None, "PRECISION": precision}


def lse_forward(q, p, targets, row_ids, column_ids, valid_u8, scale: float, precision: str, tiles=None):
    """Per-row log-sum-exp of the masked scores ``scale·Q Pᵀ`` (fp32, shape (M,)). Inputs contiguous, on one
    device; targets and ids int32 (ids: any labels where equal means the same passage);
    ``row_ids = column_ids[targets]`` when ``column_ids`` is given."""
    import torch

    M, D = q.shape
    N = p.shape[0]
    lse = torch.empty(M, dtype=torch.float32, device=q.device)
    dummy = targets
    args = (q, p, targets, row_ids if row_ids is not None else dummy, valid_u8 if valid_u8 is not None else dummy,
            column_ids if column_ids is not None else dummy, lse,
            M, N, D, q.stride(0), p.stride(0), float(scale) * _LOG2E)
    _launch("fwd", lambda meta: (triton.cdiv(M, meta["BLOCK_M"]),), args,
            _flags(column_ids, valid_u8, precision), tiles, D)
    return lse


def lse_backward(q, p, targets, row_ids, column_ids, valid_u8, lse, grad, scale: float, precision: str,
                 need_dq: bool = True, need_dp: bool = True, tiles=None):
    """Gradients of ``Σ_i grad_i·lse_i`` with respect to Q and P, in the input dtypes (None where not needed)."""
    import torch

    M, D = q.shape
    N = p.shape[0]
    grad = grad.to(torch.float32).contiguous()
    dummy = targets
    common = (q, p, targets, row_ids if row_ids is not None else dummy, valid_u8 if valid_u8 is not None else dummy,
              column_ids if column_ids is not None else dummy, lse, grad)
    flags = _flags(column_ids, valid_u8, precision)
    dq = dp = None
    if need_dq:
        dq = torch.empty_like(q)
        _launch("dq", lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(D, meta["BLOCK_DO"])),
                common + (dq, M, N, D, q.stride(0), p.stride(0), dq.stride(0), float(scale), float(scale) * _LOG2E),
                flags, tiles, D)
    if need_dp:
        dp = torch.empty_like(p)
        _launch("dp", lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(D, meta["BLOCK_DO"])),
                common + (dp, M, N, D, q.stride(0), p.stride(0), dp.stride(0), float(scale), float(scale) * _LOG2E),
                flags, tiles, D)
    return dq, dp
