"""Token lists -> length-sorted, dynamically padded batches.

Tokenising once without padding, sorting by token count and padding each batch only to its own longest member
is where most of the encoding speed comes from: a batch of 200-token passages never pays for a 256-token one.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# one tokenised sequence: (input_ids, token_type_ids or None)
TokenSeq = tuple[list[int], "list[int] | None"]


class TokenLists(list):
    """A list of :data:`TokenSeq` that also records how many inputs were longer than the limit (``truncated``)."""

    truncated: int = 0


def pad_batch(seqs: Sequence[TokenSeq], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of this batch; returns input_ids, attention_mask (and token_type_ids)."""
    if not seqs:
        raise ValueError("cannot pad an empty batch")
    longest = max(len(ids) for ids, _ in seqs)
    ids = np.full((len(seqs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    with_types = seqs[0][1] is not None
    types = np.zeros((len(seqs), longest), dtype=np.int64) if with_types else None
    for row, (seq, seq_types) in enumerate(seqs):
        n = len(seq)
        ids[row, :n] = seq
        mask[row, :n] = 1
        if with_types:
            types[row, :n] = seq_types
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if with_types:
        out["token_type_ids"] = torch.from_numpy(types)
    return out


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Index arrays of batches, longest first (a memory problem shows on the first batch, not the last)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


# Padding sequences are at most this long: far inside any BERT's position table.
_PAD_SEQUENCE = 128


def bucket_padding(tokens: int, above: int) -> list[int]:
    """Lengths of padding sequences that bring a packed batch of ``tokens`` tokens (when more than ``above``) to
    the next multiple of an eighth of its power of two (at least 16): at most 12.5% more rows.

    oneDNN compiles a kernel for every new number of rows of a linear layer and keeps the last 1,024 it made; a
    server's or an encoder's batches have any total length, so nearly every batch paid a compilation. With
    buckets a tower sees about 8 row counts per doubling, compiled once. A padding sequence only attends to
    itself, so the real sequences' results are those of their own rows."""
    if tokens <= above:
        return []
    step = max(16, (1 << (tokens.bit_length() - 1)) // 8)
    pad = -tokens % step
    return [_PAD_SEQUENCE] * (pad // _PAD_SEQUENCE) + ([pad % _PAD_SEQUENCE] if pad % _PAD_SEQUENCE else [])


def token_runs(lengths: Sequence[int], budget: int | None) -> list[slice]:
    """Consecutive runs of sequences with at most ``budget`` tokens each (a longer sequence runs alone); one run
    of everything when ``budget`` is None."""
    if budget is None or sum(lengths) <= budget:
        return [slice(0, len(lengths))]
    runs, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if tokens and tokens + n > budget:
            runs.append(slice(start, i))
            start, tokens = i, 0
        tokens += n
    runs.append(slice(start, len(lengths)))
    return runs
