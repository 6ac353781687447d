"""The in-batch negative log-likelihood loss of dense retrieval, without the B×N score matrix.

Public entry point: :func:`inbatch_nll`.  The heavy part, the per-row log-sum-exp over all in-batch passages and
its gradients, runs in one of three implementations that give the same answers:

* ``"triton"``: fused Triton kernels (``inbatch_nll_triton.py``), compiled on CUDA tensors, or run by the Triton
  interpreter on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was first imported;
* ``"torch"``: a row-chunked PyTorch version with the same O(chunk·N + (B+N)·d) memory bound
  (``inbatch_nll_torch.py``);
* ``"reference"``: the full score matrix in float64, for checking.

The positive logit ``scale·q_i·p_{y_i}``: the Triton kernels take it from the score tile that holds it, in the same
pass as the log-sum-exp, and fold its gradient into the same backward pass (the "− onehot" of softmax − onehot); the
PyTorch paths compute it as a gathered row-wise dot product with ordinary autograd.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from fastdpr._renamed import renamed
from fastdpr.errors import MissingDependency

from .inbatch_nll_torch import accumulation_dtype, chunked_lse, inbatch_nll_reference, reduce_losses

BACKENDS = ("auto", "triton", "torch", "reference")
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------------
# Backend selection
# ---------------------------------------------------------------------------------------------------------------

def interpreter_requested() -> bool:
    """``TRITON_INTERPRET=1`` in the environment, read at call time."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


_triton_module = None
_triton_error: str | None = None


def _load_triton_kernels():
    """Import the kernel module on first use; None (and the reason kept) when triton cannot be imported."""
    global _triton_module, _triton_error
    if _triton_module is None and _triton_error is None:
        if importlib.util.find_spec("triton") is None:
            _triton_error = "triton is not installed (pip install 'fastdpr[triton]')"
        else:
            try:
                from . import inbatch_nll_triton
            except Exception as exc:  # a broken triton install must not break the loss: fall back, say why
                _triton_error = f"triton failed to import: {type(exc).__name__}: {exc}"
            else:
                _triton_module = inbatch_nll_triton
    return _triton_module


def triton_usable_for(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton kernels can run on tensors of ``device`` in this process, and if not, why."""
    if device.type == "cpu" and not interpreter_requested():
        return False, "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before triton is imported"
    if device.type not in ("cpu", "cuda"):
        return False, f"no Triton kernels for device type {device.type!r}"
    kernels = _load_triton_kernels()
    if kernels is None:
        return False, _triton_error or "triton unavailable"
    if device.type == "cpu" and not kernels.INTERPRETED:
        return False, ("the kernels were compiled for the GPU because triton was imported before "
                       "TRITON_INTERPRET=1 was set; set it before anything imports triton")
    if device.type == "cuda" and kernels.INTERPRETED:
        return False, "TRITON_INTERPRET=1 is set: the kernels are interpreted and cannot run compiled on CUDA"
    return True, ""


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """The implementation ``backend`` means for inputs like ``q`` ("triton", "torch" or "reference")."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in ("torch", "reference"):
        return backend
    usable, why = triton_usable_for(q.device)
    dtype_ok = q.dtype in _TRITON_DTYPES and not (q.device.type == "cpu" and q.dtype == torch.bfloat16)
    if backend == "auto":
        return "triton" if usable and dtype_ok else "torch"
    if not usable:
        if _triton_error is not None and "not installed" in _triton_error:
            raise MissingDependency(f"backend='triton': {why}")
        raise RuntimeError(f"backend='triton' cannot run here: {why}")
    if not dtype_ok:
        if q.dtype == torch.bfloat16:
            raise ValueError("backend='triton' with bfloat16 on the CPU: the Triton interpreter's bfloat16 support "
                             "is unreliable; use float32/float16 or backend='torch'")
        raise ValueError(f"backend='triton' supports float32, float16 and bfloat16, got {q.dtype}; "
                         "use backend='torch' (float64 gradient checks go there)")
    return "triton"


# ---------------------------------------------------------------------------------------------------------------
# The Triton path as an autograd Function
# ---------------------------------------------------------------------------------------------------------------

def _dot_precision(dtype: torch.dtype) -> str:
    """float32 products follow PyTorch's own TF32 switch so that the fused loss is exactly as precise as the eager
    matmul it replaces; half inputs always use the tensor cores."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


class TritonLogSumExp(torch.autograd.Function):
    """``lse_i = logsumexp_j S_ij`` of the masked scores, by the fused kernels. See :mod:`.inbatch_nll_triton`.

    With ``with_positive=True`` it returns ``(lse, pos)``, ``pos_i = S_{i,y_i}`` the positive's score from the
    same kernel pass, and the backward takes both gradients in one pass of each kernel (the loss is
    ``lse − pos``: no gathered positive product, and none of its B×d fp32 temporaries, outside the kernels)."""

    @staticmethod
    def forward(ctx, q, p, targets, row_ids, column_ids, valid_u8, scale, tiles, with_positive=False):
        kernels = _load_triton_kernels()
        precision = _dot_precision(q.dtype)
        lse, pos = kernels.lse_forward(q, p, targets, row_ids, column_ids, valid_u8, scale, precision, tiles)
        ctx.save_for_backward(q, p, targets, row_ids, column_ids, valid_u8, lse)
        ctx.scale, ctx.precision, ctx.tiles = scale, precision, tiles
        ctx.set_materialize_grads(False)  # an output the loss does not use comes back as None, not zeros
        return (lse, pos) if with_positive else lse

    @staticmethod
    def backward(ctx, grad_lse, grad_pos=None):
        q, p, targets, row_ids, column_ids, valid_u8, lse = ctx.saved_tensors
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        dq, dp = _load_triton_kernels().lse_backward(
            q, p, targets, row_ids, column_ids, valid_u8, lse, grad_lse, ctx.scale, ctx.precision,
            need_dq=ctx.needs_input_grad[0], need_dp=ctx.needs_input_grad[1], tiles=ctx.tiles, grad_pos=grad_pos)
        return dq, dp, None, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------------------------

def _check_inputs(q, p, targets, scale, column_ids, column_valid):
    if not isinstance(q, torch.Tensor) or not isinstance(p, torch.Tensor):
        raise TypeError("q and p must be torch tensors")
    if q.dim() != 2 or p.dim() != 2:
        raise ValueError(f"q must be (B, d) and p (N, d); got q {tuple(q.shape)}, p {tuple(p.shape)}")
    if q.shape[1] != p.shape[1]:
        raise ValueError(f"q and p must have the same width d; got {q.shape[1]} and {p.shape[1]}")
    if q.shape[0] == 0 or p.shape[0] == 0 or q.shape[1] == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, p {tuple(p.shape)}")
    if q.device != p.device:
        raise ValueError(f"q and p must be on one device; got {q.device} and {p.device}")
    if q.dtype != p.dtype:
        raise ValueError(f"q and p must have one dtype; got {q.dtype} and {p.dtype}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q and p must be floating point; got {q.dtype}")
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError("scale must be a single number")
        scale = scale.item()  # a constant: the loss does not differentiate with respect to the temperature
    scale = float(scale)
    if not (scale > 0 and scale != float("inf")):
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    n_rows, n_cols = q.shape[0], p.shape[0]
    if max(n_rows, n_cols) >= 2**31:
        raise ValueError(f"at most 2**31 - 1 rows in q and p; got {n_rows} and {n_cols}")
    if not isinstance(targets, torch.Tensor) or targets.shape != (n_rows,):
        raise ValueError(f"targets must be a tensor of shape ({n_rows},) (one column per query row)")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"targets must hold integer column indices, got {targets.dtype}")
    targets = targets.to(device=q.device, dtype=torch.int64)
    low, high = torch.stack(torch.aminmax(targets)).tolist()  # one device sync, not two
    if low < 0 or high >= n_cols:
        raise ValueError(f"targets must lie in [0, {n_cols}) (p has {n_cols} rows); got values in [{low}, {high}]")
    if column_valid is not None:
        if not isinstance(column_valid, torch.Tensor) or column_valid.shape != (n_cols,):
            raise ValueError(f"column_valid must be a bool tensor of shape ({n_cols},)")
        column_valid = column_valid.to(device=q.device, dtype=torch.bool)
        padded_positive = (~column_valid[targets]).nonzero()
        if padded_positive.numel():
            row = int(padded_positive[0])
            raise ValueError(f"column_valid marks the positive of query row {row} (column {int(targets[row])}) "
                             "as padding; a positive is never padding")
    if column_ids is not None:
        if not isinstance(column_ids, torch.Tensor) or column_ids.shape != (n_cols,):
            raise ValueError(f"column_ids must be an integer tensor of shape ({n_cols},)")
        if column_ids.dtype.is_floating_point or column_ids.dtype == torch.bool:
            raise ValueError(f"column_ids must hold integer passage ids, got {column_ids.dtype}")
        column_ids = column_ids.to(device=q.device, dtype=torch.int64)
    return targets, scale, column_ids, column_valid


# ---------------------------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------------------------

def _renamed_chunk_rows(chunk_rows: int | None, chunk_size: int | None) -> int | None:
    # "chunk size" also names GradCache's sub-batch, which is another thing
    return renamed("chunk_rows", chunk_rows, "chunk_size", chunk_size, "inbatch_nll")


def _lse(impl, q, p, targets, row_ids, column_ids, column_valid, scale, tiles, chunk_rows, with_positive=False):
    """The (B,) log-sum-exp of one direction; with ``with_positive`` (Triton only) also the positive's score."""
    if impl == "triton":
        # The kernels compare ids per (row, column) pair of every tile; 32-bit values there halve the registers
        # those masks take (64-bit ones made the compiled kernels spill).  Ranks of the ids keep equality exactly.
        valid_u8 = None if column_valid is None else column_valid.to(torch.uint8)
        col_ranks = row_ranks = None
        if column_ids is not None:
            col_ranks = torch.unique(column_ids, return_inverse=True)[1].to(torch.int32)
            row_ranks = col_ranks[targets]
        return TritonLogSumExp.apply(q.contiguous(), p.contiguous(), targets.to(torch.int32), row_ranks,
                                     col_ranks, valid_u8, scale, tiles, with_positive)
    return chunked_lse(q, p, targets, row_ids, column_ids, column_valid, scale, chunk_rows)


def _check_group_size(group_size, n_rows: int, n_cols: int, targets: torch.Tensor) -> int | None:
    """None when every row sees every column; else the validated group size (rows per group)."""
    if group_size is None:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
    if group_size >= n_rows:
        return None
    if n_cols % n_rows:
        raise ValueError(f"group_size needs the same number of columns per query row (the training layout): "
                         f"{n_cols} columns for {n_rows} rows")
    slots = n_cols // n_rows
    outside = (targets // slots) // group_size != torch.arange(n_rows, device=targets.device) // group_size
    if bool(outside.any()):
        row = int(outside.nonzero()[0])
        raise ValueError(f"group_size={group_size}: the positive of query row {row} (column {int(targets[row])}) "
                         f"lies outside its group's columns")
    return group_size


def inbatch_nll(q: torch.Tensor, p: torch.Tensor, targets: torch.Tensor, scale: float = 1.0,
                column_ids: torch.Tensor | None = None, column_valid: torch.Tensor | None = None,
                bidirectional: bool = False, reduction: str = "mean", backend: str = "auto", *,
                group_size: int | None = None, tiles: dict | None = None, chunk_rows: int | None = None,
                chunk_size: int | None = None) -> torch.Tensor:
    """In-batch softmax cross-entropy of queries against all passages of the batch, without the B×N matrix.

    With ``S = scale·Q Pᵀ`` and excluded columns set to −inf, the loss of query row i is
    ``loss_i = logsumexp_j S_ij − S_{i,y_i}`` where ``y_i = targets[i]``.  Column j is excluded from row i when

    * ``column_valid[j]`` is False (a padded column), or
    * ``column_ids[j] == column_ids[y_i]`` and ``j != y_i`` (the row's own positive passage seen in another
      column — by dedup, another query's positive or hard negative — is a false negative, not a negative).

    The positive column itself is never excluded (padding a positive is an error).

    ``group_size=G`` splits the softmax into groups (for ablations of the number of negatives at a fixed batch):
    with ``g = N / B`` columns per query row (the training layout), rows ``[kG, (k+1)G)`` are scored only against
    columns ``[kGg, (k+1)Gg)``, so each query sees ``G − 1`` in-batch negatives plus the group's hard negatives;
    the bidirectional term likewise scores a positive only against its group's queries.  ``None`` (or ``G ≥ B``)
    is the whole batch.  The groups run one after another through the chosen backend, so no kernel changes.

    ``bidirectional=True`` adds the passages → queries direction (as in GTR): the positive passage of query i is
    scored against every query, ``R_ik = scale·p_{y_i}·q_k``, with query k ≠ i excluded when
    ``column_ids[y_k] == column_ids[y_i]`` (it shares the positive); then
    ``loss_i = ½·[(logsumexp_j S_ij − S_{i,y_i}) + (logsumexp_k R_ik − R_ii)]`` (note ``R_ii = S_{i,y_i}``).

    Args:
        q: (B, d) query vectors.  p: (N, d) passage vectors, usually laid out ``[pos_0, hn_0.., pos_1, ...]``.
        targets: (B,) integer column of each query's positive.
        scale: positive constant multiplying the scores (1 for DPR's dot product, 1/τ for cosine).  Not
            differentiated.
        column_ids: (N,) integer passage ids, for the false-negative mask.  column_valid: (N,) bool, False = padding.
        reduction: "mean" (over the B rows), "sum", or "none" (the (B,) vector).
        group_size: query rows per softmax group (None: the whole batch), see above.
        backend: "auto" (Triton on CUDA; the Triton interpreter on CPU when TRITON_INTERPRET=1; the chunked
            PyTorch fallback otherwise, and always for float64), or force "triton", "torch", "reference".
        tiles: Triton tile sizes ``{"BLOCK_M", "BLOCK_N", "BLOCK_D"}`` (powers of two ≥ 16), optionally
            ``SPLIT`` (ranges the streamed axis is cut into; default: enough programs to fill the GPU),
            ``SLICES`` (feature slices of the backward's accumulators; default 1, the full width) and
            ``num_warps``/``num_stages``; ``BLOCK_DO`` of earlier versions is accepted and ignored.  None
            autotunes on a GPU and uses fixed tiles in the interpreter.
        chunk_rows: query rows per chunk in the PyTorch fallback (None: about 4M scores per chunk).
            ``chunk_size`` is its old, deprecated name.

    Returns:
        The reduced loss (a scalar, or (B,) for "none") in float32 — float64 for float64 inputs and for the
        reference.  Gradients reach q and p in their own dtype.

    Example:
        >>> import torch
        >>> from fastdpr.kernels import inbatch_nll
        >>> q = torch.randn(4, 8, requires_grad=True)
        >>> p = torch.randn(8, 8, requires_grad=True)        # [pos_0, hn_0, pos_1, hn_1, ...]
        >>> loss = inbatch_nll(q, p, torch.arange(4) * 2)
        >>> loss.backward()
        >>> q.grad.shape
        torch.Size([4, 8])
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    targets, scale, column_ids, column_valid = _check_inputs(q, p, targets, scale, column_ids, column_valid)
    group_size = _check_group_size(group_size, q.shape[0], p.shape[0], targets)
    chunk_rows = _renamed_chunk_rows(chunk_rows, chunk_size)
    impl = resolve_backend(backend, q)
    if impl == "reference":
        return inbatch_nll_reference(q, p, targets, scale, column_ids, column_valid, bidirectional, reduction,
                                     group_size=group_size)
    if group_size is None:
        losses = _row_losses(impl, q, p, targets, scale, column_ids, column_valid, bidirectional, tiles, chunk_rows)
    else:
        # a group is a contiguous block of rows and of columns: slicing it out gives exactly the masked loss
        slots = p.shape[0] // q.shape[0]
        parts = []
        for lo in range(0, q.shape[0], group_size):
            hi = min(lo + group_size, q.shape[0])
            cols = slice(lo * slots, hi * slots)
            parts.append(_row_losses(
                impl, q[lo:hi], p[cols], targets[lo:hi] - lo * slots, scale,
                None if column_ids is None else column_ids[cols],
                None if column_valid is None else column_valid[cols], bidirectional, tiles, chunk_rows))
        losses = torch.cat(parts)
    return reduce_losses(losses, reduction)


def _row_losses(impl, q, p, targets, scale, column_ids, column_valid, bidirectional, tiles, chunk_rows):
    """The (B,) per-row losses of one softmax over all of ``p``, by the "triton" or "torch" implementation."""
    acc = accumulation_dtype(q.dtype)
    row_ids = None if column_ids is None else column_ids[targets]
    if impl == "triton":
        # the kernels give each direction's positive score with its lse (R_ii of the reverse direction is
        # S_{i,y_i} again, from the other kernel pass)
        lse, pos = _lse(impl, q, p, targets, row_ids, column_ids, column_valid, scale, tiles, chunk_rows, True)
        if not bidirectional:
            return lse - pos
        rows = torch.arange(q.shape[0], device=q.device)
        lse_rev, pos_rev = _lse(impl, p.index_select(0, targets), q, rows, row_ids, row_ids, None, scale, tiles,
                                chunk_rows, True)
        return 0.5 * ((lse - pos) + (lse_rev - pos_rev))
    positives = p.index_select(0, targets)
    pos_logit = scale * (q.to(acc) * positives.to(acc)).sum(dim=1)
    lse = _lse(impl, q, p, targets, row_ids, column_ids, column_valid, scale, tiles, chunk_rows)
    if bidirectional:
        # the reverse direction is the same log-sum-exp with the roles swapped: rows = positive passages,
        # columns = queries, row i's positive is column i, and the column ids are the ids of each query's positive
        rows = torch.arange(q.shape[0], device=q.device)
        lse_rev = _lse(impl, positives, q, rows, row_ids, row_ids, None, scale, tiles, chunk_rows)
        return 0.5 * (lse.to(acc) + lse_rev.to(acc)) - pos_logit
    return lse.to(acc) - pos_logit


class InBatchNLLLoss(torch.nn.Module):
    """:func:`inbatch_nll` as a module holding the scale, direction, reduction and backend.

    Example:
        >>> import torch
        >>> from fastdpr.kernels import InBatchNLLLoss
        >>> loss_fn = InBatchNLLLoss(scale=20.0, bidirectional=True)   # cosine scores with τ = 0.05
        >>> q = torch.nn.functional.normalize(torch.randn(3, 16), dim=1).requires_grad_()
        >>> p = torch.nn.functional.normalize(torch.randn(6, 16), dim=1).requires_grad_()
        >>> ids = torch.tensor([10, 11, 12, 13, 14, 12])     # column 5 repeats query 1's positive: masked for it
        >>> loss = loss_fn(q, p, torch.tensor([0, 2, 4]), column_ids=ids)
        >>> loss.backward()
    """

    def __init__(self, scale: float = 1.0, bidirectional: bool = False, reduction: str = "mean",
                 backend: str = "auto", tiles: dict | None = None, chunk_rows: int | None = None,
                 chunk_size: int | None = None, group_size: int | None = None):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.scale = float(scale)
        self.bidirectional = bool(bidirectional)
        self.reduction = reduction
        self.backend = backend
        self.tiles = tiles
        self.chunk_rows = _renamed_chunk_rows(chunk_rows, chunk_size)
        self.group_size = group_size

    def forward(self, q, p, targets, column_ids=None, column_valid=None):
        return inbatch_nll(q, p, targets, scale=self.scale, column_ids=column_ids, column_valid=column_valid,
                           bidirectional=self.bidirectional, reduction=self.reduction, backend=self.backend,
                           group_size=self.group_size, tiles=self.tiles, chunk_rows=self.chunk_rows)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, bidirectional={self.bidirectional}, reduction={self.reduction!r}, " \
               f"backend={self.backend!r}, group_size={self.group_size}"
