"""Token packing: a length-sorted batch as one row of tokens, sequences of equal length adjacent, with no
padding (and, for attention through padding on a GPU, the indices to lay it out padded)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Packed:
    """A batch as one row of tokens: sequences in ``groups`` order, each group ``(count, length)`` of equal
    lengths, contiguous."""

    input_ids: torch.Tensor  # (T,)
    token_type_ids: torch.Tensor  # (T,)
    position_ids: torch.Tensor  # (T,)
    groups: list[tuple[int, int]]
    seq_index: torch.Tensor | None = None  # (T,) the sequence of each token (for attention through padding)
    key_mask: torch.Tensor | None = None  # (B, 1, 1, longest) True at real tokens

    @property
    def count(self) -> int:
        return sum(n for n, _ in self.groups)


def pack(seqs: Sequence[tuple[list[int], list[int] | None]], device: torch.device,
         padded_attention: bool | None = None) -> Packed:
    """Pack sequences that are already sorted by length (equal lengths adjacent) into one token row, with the
    indices attention needs to run through padding when ``padded_attention`` (default: on CUDA)."""
    lengths = [len(ids) for ids, _ in seqs]
    groups = [(sum(1 for _ in run), length) for length, run in itertools.groupby(lengths)]
    ids = np.fromiter(itertools.chain.from_iterable(ids for ids, _ in seqs), dtype=np.int64, count=sum(lengths))
    if seqs and seqs[0][1] is not None:
        types = np.fromiter(itertools.chain.from_iterable(t for _, t in seqs), dtype=np.int64, count=len(ids))
    else:
        types = np.zeros(len(ids), dtype=np.int64)
    positions = np.concatenate([np.tile(np.arange(length, dtype=np.int64), n) for n, length in groups]) \
        if groups else np.zeros(0, dtype=np.int64)
    arrays = [ids, types, positions]
    if padded_attention is None:
        padded_attention = device.type == "cuda"
    padded_attention = padded_attention and len(groups) > 1
    if padded_attention:
        arrays.append(np.repeat(np.arange(len(lengths)), lengths))
        arrays.append(np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None])
    tensors = [torch.from_numpy(a) for a in arrays]
    if device.type == "cuda":  # pinned host memory lets the copy overlap the previous batch's kernels
        tensors = [t.pin_memory().to(device, non_blocking=True) for t in tensors]
    if padded_attention:
        return Packed(*tensors[:3], groups=groups, seq_index=tensors[3], key_mask=tensors[4][:, None, None, :])
    return Packed(*tensors, groups=groups)
