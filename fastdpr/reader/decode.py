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
    if n == 0:
        return []
    width = min(max_answer_length, length)
    s = start_logits.detach().float().masked_fill(~allowed, float("-inf"))
    e = end_logits.detach().float().masked_fill(~allowed, float("-inf"))
    # scores[i, a, w]: span from a to a + w; ends past the row are padded with -inf. O(N·L·max_answer_length)
    # instead of the full L×L table.
    e_padded = torch.nn.functional.pad(e, (0, width - 1), value=float("-inf"))
    scores = s.unsqueeze(2) + e_padded.unfold(1, width, 1)
    flat = scores.reshape(n, -1)
    k = min(top_n, flat.shape[1])
    values, index = flat.topk(k, dim=1)
    values, index = values.tolist(), index.tolist()
    out = []
    for row_values, row_index in zip(values, index):
        out.append([(f // width, f // width + f % width, v) for v, f in zip(row_values, row_index)
                    if v != float("-inf")])
    return out
