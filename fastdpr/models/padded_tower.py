"""The padded tower: any encoder the packed tower does not read, through its own ``transformers`` forward, padded
per length-sorted batch, in the compute precision or int8."""
from __future__ import annotations

import copy

import torch
from torch import nn

from fastdpr.models.int8 import quantize_linears
from fastdpr.models.packing import Packed
from fastdpr.models.precision import DTYPES


class PaddedTower(nn.Module):
    """Any other encoder, padded per length-sorted batch, its weights in the compute precision."""

    def __init__(self, encoder: nn.Module, pad_id: int):
        super().__init__()
        self.encoder = copy.deepcopy(encoder)
        self.pad_id = pad_id
        self.compute_dtype = torch.float32

    def one_vector(self, seq, pooling: str, normalize: bool) -> None:
        return None  # no numpy path: pack and call the tower

    def set_precision(self, precision: str) -> "PaddedTower":
        if precision in ("bf16", "fp16"):
            self.encoder.to(DTYPES[precision])
            self.compute_dtype = DTYPES[precision]
        elif precision == "int8":
            quantize_linears(self.encoder)
        return self

    def forward(self, batch: Packed) -> torch.Tensor:
        """Packed in, packed out: padding lives only inside this call."""
        hidden_rows, start = [], 0
        n_seqs = batch.count
        longest = max(length for _, length in batch.groups)
        ids = torch.full((n_seqs, longest), self.pad_id, dtype=torch.long, device=batch.input_ids.device)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        row = 0
        for n, length in batch.groups:
            rows = n * length
            ids[row:row + n, :length] = batch.input_ids[start:start + rows].view(n, length)
            types[row:row + n, :length] = batch.token_type_ids[start:start + rows].view(n, length)
            mask[row:row + n, :length] = 1
            row, start = row + n, start + rows
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if getattr(self.encoder.config, "type_vocab_size", 0):
            kwargs["token_type_ids"] = types
        hidden = self.encoder(**kwargs, return_dict=True).last_hidden_state
        row = 0
        for n, length in batch.groups:
            hidden_rows.append(hidden[row:row + n, :length].reshape(n * length, -1))
            row += n
        return torch.cat(hidden_rows)
