"""Cross-device negatives: every rank scores its questions against the whole global batch.

Each rank encodes only its slice of the global batch. ``gather_keep_local`` all-gathers the vectors of every rank
and puts the rank's own tensor back in its slot, so the local slice keeps its autograd graph while the other
ranks' vectors are constants. Every rank then computes the loss over the *global* batch (all questions against all
passages, targets in the interleaved layout of the global batch, so rank r's question i has target
``r · B_local · (1 + n_hard + n_random) + i · (1 + n_hard + n_random)``; every rank builds the same global batch, so
targets, passage ids and padding masks need no communication). The gradient that reaches a rank's parameters is
then exactly the global loss's gradient through that rank's own vectors; summing over ranks gives the full
gradient, and since DDP averages, the loss is multiplied by the world size before backward (``loss_scale``).

This needs no collective in the backward pass, which is what lets GradCache cache the gradient of the gathered
representations and replay each rank's chunks locally.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def init_from_env(device: torch.device | None = None) -> bool:
    """Join the process group described by torchrun's environment (``WORLD_SIZE``, ``RANK``, ...), if any.

    nccl when training on CUDA, gloo on the CPU. Returns True when running distributed."""
    if is_distributed():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    use_cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return True


@torch.no_grad()
def _all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def gather_keep_local(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank along dim 0; this rank's slice is ``tensor`` itself (with its graph).

    All ranks must pass the same shape (the fixed interleaved layout guarantees it)."""
    if not is_distributed() or world_size() == 1:
        return tensor
    parts = _all_gather(tensor.detach())
    parts[rank()] = tensor
    return torch.cat(parts, dim=0)


def loss_scale() -> float:
    """Factor that undoes DDP's gradient mean for a loss computed identically on every rank."""
    return float(world_size())


def barrier() -> None:
    if is_distributed():
        dist.barrier()
