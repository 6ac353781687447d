"""Best-span decoding: the highest ``start_logit[s] + end_logit[e]`` with s ≤ e < s + max_answer_length and both
ends on allowed (passage) tokens."""
from __future__ import annotations

import torch


def best_spans(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    allowed: torch.Tensor,
    max_answer_length: int = 10,
    top_n: int = 1,
) -> list[list[tuple[int, int, float]]]:
    """For each row, the ``top_n`` best (start, end, score) spans, end inclusive, best first.

    ``start_logits``/``end_logits``/``allowed`` are (N, L). A row without any allowed token gets ``[]``.

    >>> s = torch.tensor([[0., 5., 1., 0.]]); e = torch.tensor([[0., 0., 1., 6.]])
    >>> best_spans(s, e, torch.tensor([[False, True, True, True]]), max_answer_length=2)
    [[(1, 2, 6.0)]]
    """
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length must be >= 1, got {max_answer_length}")
    n, length = start_logits.shape
    s = start_logits.detach().float()
    e = end_logits.detach().float()
    idx = torch.arange(length)
    # band[s, e]: e in [s, s + max_answer_length)
    band = (idx.unsqueeze(0) >= idx.unsqueeze(1)) & (idx.unsqueeze(0) < idx.unsqueeze(1) + max_answer_length)
    out = []
    for i in range(n):
        valid = band & allowed[i].unsqueeze(1) & allowed[i].unsqueeze(0)
        if not bool(valid.any()):
            out.append([])
            continue
        scores = (s[i].unsqueeze(1) + e[i].unsqueeze(0)).masked_fill(~valid, float("-inf"))
        k = min(top_n, int(valid.sum()))
        values, flat = scores.flatten().topk(k)
        out.append([(int(f) // length, int(f) % length, float(v)) for v, f in zip(values, flat)])
    return out
