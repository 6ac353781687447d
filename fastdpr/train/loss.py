"""The training loss of one batch: this rank's vectors placed in the interleaved layout, gathered across ranks,
and scored against the global batch with the fused in-batch NLL (``fastdpr.kernels.inbatch_nll``)."""
from __future__ import annotations

from typing import Callable

import torch

from fastdpr.train import distributed
from fastdpr.train.data import Batch

LossFn = Callable[..., torch.Tensor]


def fused_inbatch_nll() -> LossFn:
    """The fused loss (Triton on GPU, chunked torch fallback elsewhere); imported on first use."""
    from fastdpr.kernels import inbatch_nll

    return inbatch_nll


def place_columns(p_real: torch.Tensor, columns: torch.Tensor, n_columns: int) -> torch.Tensor:
    """Scatter the vectors of the real passages into the (n_columns, d) layout; padding rows stay zero (they are
    excluded from the softmax by ``column_valid``). Differentiable with respect to ``p_real``."""
    if p_real.shape[0] == n_columns:
        return p_real
    out = p_real.new_zeros((n_columns, p_real.shape[1]))
    return out.index_copy(0, columns.to(p_real.device), p_real)


def batch_loss(
    q_local: torch.Tensor,
    p_real_local: torch.Tensor,
    local: Batch,
    global_batch: Batch,
    *,
    scale: float,
    loss_fn: LossFn,
    bidirectional: bool = False,
    group_size: int | None = None,
) -> torch.Tensor:
    """Mean NLL over every question of the global batch, computed identically on every rank.

    ``local`` is this rank's shard of ``global_batch`` (the whole batch when not distributed). Vectors keep the
    encoder's precision: the fused loss accumulates scores and softmax in fp32 itself, so casting bf16/fp16 vectors
    up first would only double their memory and, on a GPU, lose the tensor cores. ``group_size`` (None: the whole
    batch) is passed on only when set, so loss functions without that argument keep working."""
    device = q_local.device
    dtype = torch.promote_types(q_local.dtype, p_real_local.dtype)
    p_local = place_columns(p_real_local.to(dtype), local.passage_columns, local.n_columns)
    q_all = distributed.gather_keep_local(q_local.to(dtype))
    p_all = distributed.gather_keep_local(p_local)
    if q_all.shape[0] != global_batch.size or p_all.shape[0] != global_batch.n_columns:
        raise RuntimeError(
            f"gathered {q_all.shape[0]} questions / {p_all.shape[0]} columns, expected "
            f"{global_batch.size} / {global_batch.n_columns}"
        )
    return loss_fn(
        q_all,
        p_all,
        global_batch.targets.to(device),
        scale=scale,
        column_ids=global_batch.column_ids.to(device),
        column_valid=global_batch.column_valid.to(device),
        bidirectional=bidirectional,
        **({} if group_size is None else {"group_size": group_size}),
    )
