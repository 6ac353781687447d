"""Pooling token states into one vector per sequence."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdpr.models.config import POOLINGS


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``hidden`` (B, L, H), ``attention_mask`` (B, L) of 0/1 -> (B, H).

    ``cls``: the raw last-layer state of the first token (DPR; not BERT's pooler). ``mean``: the average over
    real tokens (sentence-transformers' arithmetic: masked sum / count clamped at 1e-9).

    Example::

        vec = pool(model(**batch).last_hidden_state, batch["attention_mask"], "mean")
    """
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        if hidden.dtype in (torch.float16, torch.bfloat16):
            hidden = hidden.float()  # a 256-token sum in half precision loses digits
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        count = mask.sum(dim=1).clamp(min=1e-9)
        return summed / count
    raise ValueError(f"unknown pooling {mode!r}; expected one of {', '.join(POOLINGS)}")


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, p=2.0, dim=-1)


def pool_packed(hidden: torch.Tensor, groups: list[tuple[int, int]], mode: str) -> torch.Tensor:
    """(tokens, H) packed states -> (sequences, H) float32: first token (``cls``) or mean over each sequence."""
    out, start = [], 0
    for n, length in groups:
        g = hidden[start:start + n * length].view(n, length, -1)
        out.append(g[:, 0].float() if mode == "cls" else g.float().mean(dim=1))
        start += n * length
    return torch.cat(out) if len(out) > 1 else out[0]
