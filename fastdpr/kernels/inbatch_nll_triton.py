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

Forward: one pass of online log-sum-exp
    A program owns BLOCK_M query rows and streams passage tiles past them, keeping per row a running maximum
    ``m`` and a running sum ``l = Σ exp2(S·log2e − m)``; a new tile with maximum ``m'`` rescales ``l`` by
    ``exp2(m − m')`` (the online softmax).  Working in base 2 (``exp2`` with ``log2 e`` folded into the scale)
    saves a multiply per element; ``lse = (m + log2 l)·ln 2``.  Each score tile ``Q_blk·P_tileᵀ`` is one matrix
    product whose K-loop runs over the whole feature axis in BLOCK_D slices.  The positive's score
    ``pos_i = S_{i,y_i}`` is picked out of the tile that holds column ``y_i`` on the way, so the loss
    ``lse_i − pos_i`` needs no product outside the kernels.  Only ``lse`` and ``pos`` (M floats each) are
    written, ``lse`` saved for the backward: no M×N buffer ever exists.

    Few query rows (B = 1,024 makes 16 blocks of 64 on a card of 132 SMs) would leave most of the GPU idle, so
    the passage axis is cut into ``SPLIT`` contiguous ranges on a second grid axis.  Each program then writes the
    partial ``lse`` of its range, and a second stage merges them: ``lse_i = logsumexp_r lse_i^(r)`` (exact, since
    log-sum-exp is associative; a range with nothing kept contributes −inf).  A split is only used while the row
    blocks alone would fill less than 85% of the programs the card runs at once (``_split``), so large batches
    pay nothing for it.

Backward: the FlashAttention-2 split, each score tile's gradient computed once per kernel
    Gradients of ``L = Σ_i g_i·lse_i + Σ_i h_i·pos_i`` with the softmax ``π_ij = exp(S_ij − lse_i)`` (0 on masked
    columns); for the loss ``h_i = −g_i``, which makes dS the familiar g·(softmax − onehot)::

        dS_ij   = g_i · π_ij + h_i · [j = y_i]
        dL/dq_i = s · Σ_j dS_ij p_j                   (dq kernel: owns query rows, streams passage tiles)
        dL/dp_j = s · Σ_i dS_ij q_i                   (dp kernel: owns passage rows, streams query tiles)

    The dq kernel holds a full-width (BLOCK_M × D) fp32 accumulator for its rows; per passage tile it computes
    ``S = s·Q_blk·P_tileᵀ`` once (the whole D in its K-loop), turns it into ``dS`` with the saved ``lse`` (no
    second max/sum pass), and adds ``dS·P_tile`` to the accumulator.  The dp kernel is its mirror image with a
    (BLOCK_N × D) accumulator.  So each kernel does two matrix products per tile, the whole backward four
    against eager's two: S is recomputed once in each kernel, which is what keeps the memory at O((M + N)·D).

    Why no atomics: every output row belongs to exactly one program (dq by query block, dp by passage block), so
    no two programs ever write the same element; the result is deterministic run to run.  When a split is used
    (few owned blocks), the programs of one row block write fp32 partial sums for their ranges of the streamed
    axis into separate slices of a (SPLIT, rows, D) buffer and one sum over the slices finishes the gradient:
    still no atomics.

    The accumulator must be a power of two wide, and D = 768 is not: padding to 1,024 would waste a third of the
    registers and of the dS·P products.  It is kept as two power-of-two parts instead, ``WIDTH_A`` (the largest
    power of two ≤ D) and ``WIDTH_B`` (the rest, rounded up; 0 when D is a power of two): 768 = 512 + 256 with
    no padding at all.

    A full-width accumulator of 64 rows at D = 768 is 192 KiB of an SM's 256 KiB register file, and ptxas
    spills a little for it.  So the autotuner may also pick ``SLICES`` = 2 or 3: a third grid axis gives each
    program one slice of the features (its accumulator 384 or 256 wide), at the price of recomputing S once more
    per extra slice.  ``SLICES`` = 1 is the full width described above; the candidates and what ptxas said of
    them are listed at ``_BACKWARD_CANDIDATES``.

Every product is accumulated in fp32 (half inputs go to the tensor cores in their own dtype: Q and P as loaded,
dS rounded to the input dtype before its product); row offsets are widened to int64 before multiplying by
the row stride so that B·D beyond 2³¹ elements cannot overflow.  The positive column is never masked (checked by
the caller), so every real row has a finite ``lse``; rows past ``M`` in the last block are fully masked and the
online update guards the ``−inf − (−inf)`` case so they never produce NaN.
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

# The row counts only bound masks, so compiling a variant for each of their divisibilities (as triton does for
# integer arguments) would double the compiles, each a few seconds per autotune candidate, for nothing; D and the
# strides keep theirs, which align the loads.
_jit_kernel = triton.jit(do_not_specialize=["M", "N"])


@triton.jit
def _score_tile(
    a_ptr, b_ptr, offs_a, offs_b, n_a, n_b, D, stride_a, stride_b,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    """(BLOCK_A, BLOCK_B) fp32 tile of A[offs_a] · B[offs_b]ᵀ, the whole feature axis in one K-loop."""
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
def _split_range(n_rows, BLOCK: tl.constexpr):
    """[lo, hi) of the streamed axis that this program's split (grid axis 1) covers: whole tiles, so that no
    tile straddles two splits, spread evenly over the splits."""
    n_tiles = tl.cdiv(n_rows, BLOCK)
    per_split = tl.cdiv(n_tiles, tl.num_programs(1))
    lo = tl.program_id(1) * per_split * BLOCK
    hi = tl.minimum(n_rows, lo + per_split * BLOCK)
    return lo, hi


@triton.jit
def _accumulators(BLOCK: tl.constexpr, D, SLICE_W: tl.constexpr, WIDTH_A: tl.constexpr, WIDTH_B: tl.constexpr):
    """This program's feature slice (grid axis 2) as the end of its features and the columns and fp32
    accumulators of the two power-of-two parts.  Without a second part (WIDTH_B = 0) the first part stands in for
    it; it is then never read or written, and the compiler drops it."""
    f_lo = tl.program_id(2) * SLICE_W
    f_hi = tl.minimum(D, f_lo + SLICE_W)
    offs_a = f_lo + tl.arange(0, WIDTH_A)
    acc_a = tl.zeros((BLOCK, WIDTH_A), dtype=tl.float32)
    if WIDTH_B > 0:
        offs_b = f_lo + WIDTH_A + tl.arange(0, WIDTH_B)
        acc_b = tl.zeros((BLOCK, WIDTH_B), dtype=tl.float32)
    else:
        offs_b = offs_a
        acc_b = acc_a
    return f_hi, offs_a, offs_b, acc_a, acc_b


@triton.jit
def _add_product(acc, ds, src_ptr, rows, in_rows, offs_w, w_end, PRECISION: tl.constexpr):
    """acc + ds · SRC[rows, offs_w]: one column part of the program's gradient accumulator (features < w_end)."""
    blk = tl.load(src_ptr + rows[:, None] + offs_w[None, :], mask=in_rows[:, None] & (offs_w < w_end)[None, :],
                  other=0.0)
    # half inputs: dS goes to the tensor cores in the input dtype, the sum stays fp32
    return tl.dot(ds.to(blk.dtype), blk, acc, input_precision=PRECISION)


@triton.jit
def _add_products(acc_a, acc_b, ds, src_ptr, rows, in_rows, offs_a, offs_b, f_hi,
                  WIDTH_B: tl.constexpr, PRECISION: tl.constexpr):
    """Both parts of the accumulator + ds · SRC[rows, slice]: one gradient product per streamed tile."""
    acc_a = _add_product(acc_a, ds, src_ptr, rows, in_rows, offs_a, f_hi, PRECISION)
    if WIDTH_B > 0:
        acc_b = _add_product(acc_b, ds, src_ptr, rows, in_rows, offs_b, f_hi, PRECISION)
    return acc_a, acc_b


@triton.jit
def _store_accumulators(out_ptr, acc_a, acc_b, rows, in_rows, offs_a, offs_b, f_hi, WIDTH_B: tl.constexpr):
    """The slice's gradient rows (in the output's dtype: the input dtype, or fp32 partials under a split)."""
    tl.store(out_ptr + rows[:, None] + offs_a[None, :], acc_a.to(out_ptr.dtype.element_ty),
             mask=in_rows[:, None] & (offs_a < f_hi)[None, :])
    if WIDTH_B > 0:
        tl.store(out_ptr + rows[:, None] + offs_b[None, :], acc_b.to(out_ptr.dtype.element_ty),
                 mask=in_rows[:, None] & (offs_b < f_hi)[None, :])


@_jit_kernel
def lse_fwd_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, part_ptr, pos_ptr,
    M, N, D, stride_q, stride_p, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Partial lse of BLOCK_M query rows over this program's range of passages, into part[split, row]; the
    positive's score S_{i,y_i} into pos[row] by the program whose range holds column y_i."""
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
    row_id = row_target
    if HAS_IDS:
        row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)
    n_lo, n_hi = _split_range(N, BLOCK_N)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max of S·log2e
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running Σ exp2(S·log2e − m_i)
    pos_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # S_{i,y_i}·log2e once its tile has passed
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = _score_tile(q_ptr, p_ptr, offs_m, offs_n, M, n_hi, D, stride_q, stride_p,
                        BLOCK_M, BLOCK_N, BLOCK_D, PRECISION) * scale_log2e
        keep = _keep_tile(offs_m, offs_n, M, n_hi, row_target, row_id, valid_ptr, ids_ptr, HAS_VALID, HAS_IDS)
        s = tl.where(keep, s, float("-inf"))
        # the positive is never masked; taking its score from the same tile as the lse keeps lse − S_{i,y_i}
        # consistent to the last bit where the positive dominates (large scales)
        pos_i += tl.sum(tl.where(offs_n[None, :] == row_target[:, None], s, 0.0), axis=1)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row with nothing kept so far has m_new = −inf; shift by 0 instead so that exp2 sees −inf, not NaN
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_shift) + tl.sum(tl.exp2(s - m_shift[:, None]), axis=1)
        m_i = m_new
    # l_i = 0 only where this range kept nothing for the row: its partial lse is then −inf (m_i), which the merge
    # ignores; every real row keeps its positive in some range
    lse = (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453
    tl.store(part_ptr + tl.program_id(1).to(tl.int64) * M + offs_m, lse, mask=in_m)
    tl.store(pos_ptr + offs_m, pos_i * 0.6931471805599453, mask=in_m & (row_target >= n_lo) & (row_target < n_hi))


@_jit_kernel
def lse_bwd_dq_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, lse_ptr, grad_ptr, gpos_ptr, dq_ptr,
    M, N, D, stride_q, stride_p, stride_dq, stride_split, scale, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, HAS_POS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SLICE_W: tl.constexpr, WIDTH_A: tl.constexpr, WIDTH_B: tl.constexpr,
):
    """dQ of one block of query rows, all D features, over this program's range of passage tiles."""
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
    row_id = row_target
    if HAS_IDS:
        row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)
    lse_log2 = tl.load(lse_ptr + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
    coef = tl.load(grad_ptr + offs_m, mask=in_m, other=0.0) * scale
    coef_pos = coef
    if HAS_POS:
        coef_pos = tl.load(gpos_ptr + offs_m, mask=in_m, other=0.0) * scale
    n_lo, n_hi = _split_range(N, BLOCK_N)

    f_hi, offs_a, offs_b, acc_a, acc_b = _accumulators(BLOCK_M, D, SLICE_W, WIDTH_A, WIDTH_B)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s = _score_tile(q_ptr, p_ptr, offs_m, offs_n, M, n_hi, D, stride_q, stride_p,
                        BLOCK_M, BLOCK_N, BLOCK_D, PRECISION) * scale_log2e
        keep = _keep_tile(offs_m, offs_n, M, n_hi, row_target, row_id, valid_ptr, ids_ptr, HAS_VALID, HAS_IDS)
        # masking before exp2 keeps excluded columns from overflowing: exp2(−inf) = 0
        ds = tl.exp2(tl.where(keep, s, float("-inf")) - lse_log2[:, None]) * coef[:, None]
        if HAS_POS:  # the positive's own score term: its gradient lands on column y_i alone (−g for the loss)
            ds += tl.where(offs_n[None, :] == row_target[:, None], coef_pos[:, None], 0.0)
        acc_a, acc_b = _add_products(acc_a, acc_b, ds, p_ptr, offs_n.to(tl.int64) * stride_p, offs_n < n_hi,
                                     offs_a, offs_b, f_hi, WIDTH_B, PRECISION)
    _store_accumulators(dq_ptr + tl.program_id(1).to(tl.int64) * stride_split, acc_a, acc_b,
                        offs_m.to(tl.int64) * stride_dq, in_m, offs_a, offs_b, f_hi, WIDTH_B)


@_jit_kernel
def lse_bwd_dp_kernel(
    q_ptr, p_ptr, target_ptr, rowid_ptr, valid_ptr, ids_ptr, lse_ptr, grad_ptr, gpos_ptr, dp_ptr,
    M, N, D, stride_q, stride_p, stride_dp, stride_split, scale, scale_log2e,
    HAS_VALID: tl.constexpr, HAS_IDS: tl.constexpr, HAS_POS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SLICE_W: tl.constexpr, WIDTH_A: tl.constexpr, WIDTH_B: tl.constexpr,
):
    """dP of one block of passage rows, all D features, over this program's range of query tiles.

    The score tile here is the transpose of the forward one (passages along axis 0, queries along axis 1), so
    that dSᵀ·Q_blk is a plain product; the per-query quantities (target, row id, lse, grad) broadcast along
    axis 0.
    """
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    col_keep = in_n
    if HAS_VALID:
        col_keep = col_keep & (tl.load(valid_ptr + offs_n, mask=in_n, other=0) != 0)
    col_id = offs_n
    if HAS_IDS:
        col_id = tl.load(ids_ptr + offs_n, mask=in_n, other=0)
    m_lo, m_hi = _split_range(M, BLOCK_M)

    f_hi, offs_a, offs_b, acc_a, acc_b = _accumulators(BLOCK_N, D, SLICE_W, WIDTH_A, WIDTH_B)
    for m0 in range(m_lo, m_hi, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        in_m = offs_m < m_hi
        row_target = tl.load(target_ptr + offs_m, mask=in_m, other=-1)
        lse_log2 = tl.load(lse_ptr + offs_m, mask=in_m, other=0.0) * 1.4426950408889634
        coef = tl.load(grad_ptr + offs_m, mask=in_m, other=0.0) * scale
        st = _score_tile(p_ptr, q_ptr, offs_n, offs_m, N, m_hi, D, stride_p, stride_q,
                         BLOCK_N, BLOCK_M, BLOCK_D, PRECISION) * scale_log2e
        keep = col_keep[:, None] & in_m[None, :]
        if HAS_IDS:
            row_id = tl.load(rowid_ptr + offs_m, mask=in_m, other=0)
            dup = (col_id[:, None] == row_id[None, :]) & (offs_n[:, None] != row_target[None, :])
            keep = keep & (dup == 0)
        ds_t = tl.exp2(tl.where(keep, st, float("-inf")) - lse_log2[None, :]) * coef[None, :]
        if HAS_POS:
            coef_pos = tl.load(gpos_ptr + offs_m, mask=in_m, other=0.0) * scale
            ds_t += tl.where(offs_n[:, None] == row_target[None, :], coef_pos[None, :], 0.0)
        acc_a, acc_b = _add_products(acc_a, acc_b, ds_t, q_ptr, offs_m.to(tl.int64) * stride_q, in_m,
                                     offs_a, offs_b, f_hi, WIDTH_B, PRECISION)
    _store_accumulators(dp_ptr + tl.program_id(1).to(tl.int64) * stride_split, acc_a, acc_b,
                        offs_n.to(tl.int64) * stride_dp, in_n, offs_a, offs_b, f_hi, WIDTH_B)


# ---------------------------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------------------------

TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_D")
#: optional keys of ``tiles``: the split of the streamed axis (all three kernels), the feature slices of the
#: backward (1: full width), and the launch settings
OPTIONAL_TILE_KEYS = ("SPLIT", "SLICES", "num_warps", "num_stages")
#: the first backward always cut the output features into slices of this width; ``SLICES`` replaced it, and it
#: is accepted and ignored so that tile dicts written for that kernel keep working
RETIRED_TILE_KEYS = ("BLOCK_DO",)

# the rows a program owns that the split decision assumes (the autotuned tiles are 32 to 128); the split is fixed
# before the autotuner picks a tiling, since the partial buffers are allocated before the launch
_NOMINAL_BLOCK = 64
_MAX_SPLIT = 16


def _pow2_at_least(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


def accumulator_widths(width: int) -> tuple[int, int]:
    """(WIDTH_A, WIDTH_B): two powers of two ≥ 16 (WIDTH_B may be 0) whose sum covers ``width`` with the least
    padding two parts allow; 768 → (512, 256), 384 → (256, 128), 1,024 → (1,024, 0), 37 → (32, 16)."""
    if width <= 16:
        return 16, 0
    width_a = 1 << (int(width).bit_length() - 1)
    return width_a, (0 if width_a == width else _pow2_at_least(width - width_a))


def slice_meta(dim: int, slices: int) -> dict:
    """The backward's feature slicing as kernel constants: ``slices`` programs per owned block, each with a
    ``SLICE_W``-wide accumulator in two parts.  1 is the full width (S computed once per tile and kernel);
    more slices shrink the accumulator at the price of recomputing S once per slice.  A slice starts on a
    multiple of 16 features, so that its loads stay aligned for wide vector accesses (at most ``slices`` slices
    cover ``dim``; small widths may need fewer)."""
    width = triton.cdiv(dim, max(1, int(slices)))
    width = width if slices == 1 else 16 * triton.cdiv(width, 16)
    width_a, width_b = accumulator_widths(width)
    return {"SLICE_W": width, "WIDTH_A": width_a, "WIDTH_B": width_b}


def interpreter_tiles(dim: int) -> dict:
    """Tiles for the interpreter: big feature slices (every tile is a numpy call, so fewer is faster)."""
    return {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_D": min(_pow2_at_least(dim), 128)}


# Backward candidates: (rows owned, rows streamed, K-slice of the score loop, warps, stages, feature slices).
# The full-width accumulator (slices = 1) is BLOCK × D fp32 in registers: at D = 768 and 64 owned rows that is
# 192 KiB of an SM's 256 KiB register file.  Compiled ahead of time for sm_90a (bf16, both masks and the positive's
# term, 16-divisible strides as the launcher specialises them), ptxas reports at D = 768, for the dq / dp kernel:
# full width with 16 streamed rows spills 52 / 48 bytes per thread, with 32 144 / 220, with 64 556 / 672 (8 warps;
# 32 owned rows cannot use wgmma and spill more, 16 warps spill more); two slices (64 × 384) and three (64 × 256)
# spill nothing, 128 × 256 80 / 140 bytes.  Which costs less on the card, a few spills or recomputing S once more
# per slice, is for the autotuner to time: it gets both.
# The tilings that spilled most (full width with 64 streamed rows, 128 × 256) are left out: every candidate costs
# a compile of a few seconds per dtype and width the first time it is autotuned, inside the first training step.
_BACKWARD_CANDIDATES = (
    (64, 16, 64, 8, 2, 1), (64, 32, 64, 8, 2, 1),
    (64, 64, 64, 8, 2, 2), (64, 32, 64, 8, 3, 2), (64, 64, 64, 8, 3, 3),
)
_FORWARD_CANDIDATES = ((128, 64, 64, 8, 3), (128, 128, 32, 8, 3), (64, 128, 64, 8, 3))
# the largest accumulator (owned rows × slice width) a backward tiling may hold: 64 × 1,024 fp32 values
_MAX_ACCUMULATOR = 64 * 1024


def _gpu_configs(kind: str, dim: int = 768) -> list:
    """Autotune candidates for a real GPU and features of width ``dim``. Only ever called on the compiled path:
    the interpreter cannot autotune (it has no driver to time kernels on)."""
    if INTERPRETED:
        raise RuntimeError("autotuning needs a GPU; under TRITON_INTERPRET=1 give tile sizes explicitly")
    if kind == "fwd":
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd}, num_warps=warps, num_stages=stages)
                for bm, bn, bd, warps, stages in _FORWARD_CANDIDATES]
    configs = []
    for own, stream, bd, warps, stages, slices in _BACKWARD_CANDIDATES:
        meta = {"BLOCK_M": own, "BLOCK_N": stream} if kind == "dq" else {"BLOCK_N": own, "BLOCK_M": stream}
        meta.update(BLOCK_D=bd, **slice_meta(dim, slices))
        if own * (meta["WIDTH_A"] + meta["WIDTH_B"]) <= _MAX_ACCUMULATOR:
            configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    if not configs:  # very wide features: as many slices as keep 32 owned rows within the bound
        slices = triton.cdiv(32 * dim, _MAX_ACCUMULATOR)
        meta = {"BLOCK_M": 32, "BLOCK_N": 32} if kind == "dq" else {"BLOCK_N": 32, "BLOCK_M": 32}
        configs.append(triton.Config({**meta, "BLOCK_D": 64, **slice_meta(dim, slices)}, num_warps=8, num_stages=2))
    return configs


_KERNELS = {"fwd": lse_fwd_kernel, "dq": lse_bwd_dq_kernel, "dp": lse_bwd_dp_kernel}
_TUNED: dict = {}


def _tuned_kernel(kind: str, dim: int):
    """One autotuner per kernel and feature width (the backward's candidates depend on the width)."""
    key = (kind, dim if kind != "fwd" else None)
    if key not in _TUNED:
        _TUNED[key] = triton.autotune(configs=_gpu_configs(kind, dim), key=["M", "N", "D"])(_KERNELS[kind])
    return _TUNED[key]


def _check_tiles(tiles: dict) -> dict:
    unknown = sorted(set(tiles) - set(TILE_KEYS) - set(OPTIONAL_TILE_KEYS) - set(RETIRED_TILE_KEYS))
    if unknown:
        raise ValueError(f"unknown tiles keys {unknown}; known: {TILE_KEYS + OPTIONAL_TILE_KEYS}")
    missing = [k for k in TILE_KEYS if k not in tiles]
    if missing:
        raise ValueError(f"tiles is missing {missing}; give all of {TILE_KEYS}")
    meta = {k: int(tiles[k]) for k in TILE_KEYS}
    for k, v in meta.items():
        if v < 16 or v & (v - 1):
            raise ValueError(f"tiles[{k!r}] must be a power of two >= 16, got {v}")
    for k in ("SPLIT", "SLICES"):
        if k in tiles and int(tiles[k]) < 1:
            raise ValueError(f"tiles[{k!r}] must be a positive integer, got {tiles[k]}")
    return meta


def _resident_programs(device) -> int:
    """Programs the device runs at once, about: one per SM (the backward's accumulators fill an SM's registers);
    the interpreter runs one at a time."""
    if device.type != "cuda":
        return 1
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _split(tiles, owned_rows: int, streamed_rows: int, device, programs_per_sm: int = 1) -> int:
    """How many ranges the streamed axis is cut into: the fewest that fill the card's resident programs to at
    least 85% (counting the last, partial wave as a whole one), never a range below one nominal tile; 1 when the
    owned blocks alone do (large batches), so they pay nothing for it."""
    if tiles is not None and "SPLIT" in tiles:
        return max(1, min(int(tiles["SPLIT"]), streamed_rows))
    target = _resident_programs(device) * programs_per_sm
    blocks = triton.cdiv(owned_rows, _NOMINAL_BLOCK)
    most = max(1, min(triton.cdiv(streamed_rows, _NOMINAL_BLOCK), _MAX_SPLIT))

    def filled(split: int) -> float:
        programs = blocks * split
        return programs / (triton.cdiv(programs, target) * target)

    return next((k for k in range(1, most + 1) if filled(k) >= 0.85), max(range(1, most + 1), key=filled))


def _launch(kind: str, owned_rows: int, split: int, args: tuple, flags: dict, tiles: dict | None, dim: int) -> None:
    """One kernel over (owned blocks, split[, feature slices]); autotuned when ``tiles`` is None on a GPU."""
    own = "BLOCK_M" if kind in ("fwd", "dq") else "BLOCK_N"

    def grid(meta):
        blocks = triton.cdiv(owned_rows, meta[own])
        return (blocks, split) if kind == "fwd" else (blocks, split, triton.cdiv(dim, meta["SLICE_W"]))

    if tiles is None and INTERPRETED:
        tiles = interpreter_tiles(dim)
    if tiles is None:
        _tuned_kernel(kind, dim)[grid](*args, **flags)
        return
    meta = _check_tiles(tiles)
    if kind != "fwd":
        meta.update(slice_meta(dim, tiles.get("SLICES", 1)))
    launch = {k: int(tiles[k]) for k in ("num_warps", "num_stages") if k in tiles and not INTERPRETED}
    _KERNELS[kind][grid(meta)](*args, **flags, **meta, **launch)


def _flags(column_ids, valid_u8, precision: str) -> dict:
    return {"HAS_VALID": valid_u8 is not None, "HAS_IDS": column_ids is not None, "PRECISION": precision}


def _common_args(q, p, targets, row_ids, column_ids, valid_u8) -> tuple:
    dummy = targets  # never read: the flags compile the masks out
    return (q, p, targets, row_ids if row_ids is not None else dummy, valid_u8 if valid_u8 is not None else dummy,
            column_ids if column_ids is not None else dummy)


def lse_forward(q, p, targets, row_ids, column_ids, valid_u8, scale: float, precision: str, tiles=None):
    """Per-row log-sum-exp of the masked scores ``scale·Q Pᵀ`` and each row's positive score ``S_{i,y_i}`` (both
    fp32, shape (M,)). Inputs contiguous, on one device; targets and ids int32 (ids: any labels where equal means
    the same passage); ``row_ids = column_ids[targets]`` when ``column_ids`` is given."""
    import torch

    M, D = q.shape
    N = p.shape[0]
    # the forward is light on registers: two programs per SM keep the memory system busy
    split = _split(tiles, M, N, q.device, programs_per_sm=2)
    part = torch.empty((split, M), dtype=torch.float32, device=q.device)
    pos = torch.empty(M, dtype=torch.float32, device=q.device)  # every row's target lies in exactly one range
    args = _common_args(q, p, targets, row_ids, column_ids, valid_u8) + (
        part, pos, M, N, D, q.stride(0), p.stride(0), float(scale) * _LOG2E)
    _launch("fwd", M, split, args, _flags(column_ids, valid_u8, precision), tiles, D)
    # the second stage: exact, and M·split floats
    return (part[0] if split == 1 else torch.logsumexp(part, dim=0)), pos


def _gradient(kind: str, common: tuple, q, p, flags: dict, scale: float, tiles):
    """dQ (kind "dq") or dP ("dp") in the input dtype: written directly, or summed from fp32 split partials."""
    import torch

    owned, streamed = (q, p) if kind == "dq" else (p, q)
    rows, dim = owned.shape
    split = _split(tiles, rows, streamed.shape[0], owned.device)
    if split == 1:
        out = torch.empty_like(owned)
    else:
        out = torch.empty((split, rows, dim), dtype=torch.float32, device=owned.device)
    args = common + (out, q.shape[0], p.shape[0], dim, q.stride(0), p.stride(0), out.stride(-2),
                     out.stride(0) if split > 1 else 0, float(scale), float(scale) * _LOG2E)
    _launch(kind, rows, split, args, flags, tiles, dim)
    return out if split == 1 else out.sum(dim=0).to(owned.dtype)


def lse_backward(q, p, targets, row_ids, column_ids, valid_u8, lse, grad, scale: float, precision: str,
                 need_dq: bool = True, need_dp: bool = True, tiles=None, grad_pos=None):
    """Gradients of ``Σ_i grad_i·lse_i + Σ_i grad_pos_i·S_{i,y_i}`` with respect to Q and P, in the input dtypes
    (None where not needed); ``grad_pos`` None leaves the second sum out."""
    import torch

    grad = grad.to(torch.float32).contiguous()
    has_pos = grad_pos is not None
    grad_pos = grad_pos.to(torch.float32).contiguous() if has_pos else grad
    common = _common_args(q, p, targets, row_ids, column_ids, valid_u8) + (lse, grad, grad_pos)
    flags = {**_flags(column_ids, valid_u8, precision), "HAS_POS": has_pos}
    dq = _gradient("dq", common, q, p, flags, scale, tiles) if need_dq else None
    dp = _gradient("dp", common, q, p, flags, scale, tiles) if need_dp else None
    return dq, dp
