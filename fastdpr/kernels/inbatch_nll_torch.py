"""Pure PyTorch versions of the in-batch NLL: a row-chunked log-sum-exp with its own backward, and a plain
full-matrix float64 reference.

The chunked version is the fallback wherever the Triton kernels cannot run (no triton, CPU without the
interpreter, float64).  It has the fused kernel's memory bound: it never holds more than ``chunk × N`` scores,
and its backward recomputes each chunk's scores from Q, P and the saved per-row log-sum-exp instead of keeping
them, so peak memory is O(chunk·N + (B+N)·d) whatever the batch size.  Autograd over a plain
``torch.logsumexp`` loop would save every chunk's scores for the backward and lose that bound, hence the custom
``autograd.Function``.
"""
from __future__ import annotations

import torch

#: Scores per chunk when no chunk size is given: 4M fp32 values = 16 MiB of scores (plus as much for their
#: exponentials in the backward), large enough that each chunk is an efficient matrix product.
DEFAULT_CHUNK_ELEMENTS = 1 << 22


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (for gradient checks); everything else is accumulated in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_chunk_rows(n_columns: int) -> int:
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(1, n_columns))


def _chunk_scores(q_chunk, p_acc, scale, targets_chunk, row_ids_chunk, column_ids, column_valid):
    """Masked ``scale · q_chunk · Pᵀ`` for one chunk of query rows (−inf where a column is excluded)."""
    s = torch.matmul(q_chunk, p_acc.t())
    s.mul_(scale)
    if column_valid is not None:
        s.masked_fill_(~column_valid[None, :], float("-inf"))
    if column_ids is not None:
        cols = torch.arange(column_ids.shape[0], device=column_ids.device)
        dup = (column_ids[None, :] == row_ids_chunk[:, None]) & (cols[None, :] != targets_chunk[:, None])
        s.masked_fill_(dup, float("-inf"))
    return s


class ChunkedLogSumExp(torch.autograd.Function):
    """``lse_i = logsumexp_j S_ij`` over masked scores, computed ``chunk`` query rows at a time.

    Arguments: q (B,d), p (N,d), targets (B,) int64, row_ids (B,) int64 or None (= column_ids[targets]),
    column_ids (N,) int64 or None, column_valid (N,) bool or None, scale (float), chunk (int rows).
    Returns lse (B,) in the accumulation dtype (float32, or float64 for float64 inputs).
    """

    @staticmethod
    def forward(ctx, q, p, targets, row_ids, column_ids, column_valid, scale, chunk):
        acc = accumulation_dtype(q.dtype)
        p_acc = p.to(acc)
        lse = torch.empty(q.shape[0], dtype=acc, device=q.device)
        for start in range(0, q.shape[0], chunk):
            stop = min(start + chunk, q.shape[0])
            s = _chunk_scores(q[start:stop].to(acc), p_acc, scale, targets[start:stop],
                              None if row_ids is None else row_ids[start:stop], column_ids, column_valid)
            lse[start:stop] = torch.logsumexp(s, dim=1)
        ctx.save_for_backward(q, p, targets, row_ids, column_ids, column_valid, lse)
        ctx.scale = scale
        ctx.chunk = chunk
        return lse

    @staticmethod
    def backward(ctx, grad_lse):
        q, p, targets, row_ids, column_ids, column_valid, lse = ctx.saved_tensors
        need_q, need_p = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc = lse.dtype
        p_acc = p.to(acc)
        grad_lse = grad_lse.to(acc)
        dq = torch.empty(q.shape, dtype=acc, device=q.device) if need_q else None
        dp = torch.zeros(p.shape, dtype=acc, device=p.device) if need_p else None
        for start in range(0, q.shape[0], ctx.chunk):
            stop = min(start + ctx.chunk, q.shape[0])
            q_chunk = q[start:stop].to(acc)
            s = _chunk_scores(q_chunk, p_acc, ctx.scale, targets[start:stop],
                              None if row_ids is None else row_ids[start:stop], column_ids, column_valid)
            # softmax weights times the upstream gradient and the chain-rule scale; masked columns give exp(−inf)=0
            w = s.sub_(lse[start:stop, None]).exp_().mul_((grad_lse[start:stop] * ctx.scale)[:, None])
            if need_q:
                torch.matmul(w, p_acc, out=dq[start:stop])
            if need_p:
                dp.addmm_(w.t(), q_chunk)
        return (None if dq is None else dq.to(q.dtype), None if dp is None else dp.to(p.dtype),
                None, None, None, None, None, None)


def chunked_lse(q, p, targets, row_ids, column_ids, column_valid, scale: float, chunk: int | None = None):
    if chunk is None:
        chunk = default_chunk_rows(p.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk}")
    return ChunkedLogSumExp.apply(q, p, targets, row_ids, column_ids, column_valid, float(scale), int(chunk))


def inbatch_nll_reference(q, p, targets, scale=1.0, column_ids=None, column_valid=None, bidirectional=False,
                          reduction="mean", group_size=None):
    """The loss written the obvious way: the full B×N score matrix in float64, autograd for the gradients.

    Memory is O(B·N); it exists to check the other implementations (same arguments and meaning as
    :func:`fastdpr.kernels.inbatch_nll`).  Groups are a mask here (the other paths slice them out).
    """
    q64, p64 = q.to(torch.float64), p.to(torch.float64)
    n_rows, n_cols = q.shape[0], p.shape[0]
    rows = torch.arange(n_rows, device=q.device)
    cols = torch.arange(n_cols, device=q.device)
    scores = scale * (q64 @ p64.t())
    keep = torch.ones(n_rows, n_cols, dtype=torch.bool, device=q.device)
    if column_valid is not None:
        keep &= column_valid[None, :]
    if column_ids is not None:
        keep &= ~((column_ids[None, :] == column_ids[targets][:, None]) & (cols[None, :] != targets[:, None]))
    row_group = col_group = None
    if group_size is not None:
        row_group = rows // group_size
        col_group = (cols // (n_cols // n_rows)) // group_size
        keep &= row_group[:, None] == col_group[None, :]
    scores = scores.masked_fill(~keep, float("-inf"))
    losses = torch.logsumexp(scores, dim=1) - scores[rows, targets]
    if bidirectional:
        # passages → queries: row i is the positive passage of query i scored against every query
        reverse = scale * (p64[targets] @ q64.t())
        if column_ids is not None:
            pos_ids = column_ids[targets]
            dup = (pos_ids[None, :] == pos_ids[:, None]) & (rows[None, :] != rows[:, None])
            reverse = reverse.masked_fill(dup, float("-inf"))
        if row_group is not None:
            reverse = reverse.masked_fill(row_group[None, :] != row_group[:, None], float("-inf"))
        losses = 0.5 * (losses + torch.logsumexp(reverse, dim=1) - reverse[rows, rows])
    return reduce_losses(losses, reduction)


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
