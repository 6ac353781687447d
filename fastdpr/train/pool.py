"""Negatives past the batch: passage vectors already encoded (a ``fastdpr encode`` output), scored by every question.

With the passage tower frozen (``BiEncoderArguments(freeze_passages=True)``) the vectors of the corpus never go
stale, so each question can meet the whole pool as negatives at the cost of one product with the pool: the fused loss
never builds the B×N score matrix, so N can be the corpus. ``k`` instead keeps only the k best pool passages of each
question by its current vector (the union over the batch, so every question sees at least its own k best).

A pool passage with the id of a question's positive is masked for that question (the loss's ``column_ids``), so
the training file must name its passages' ids (``fastdpr mine`` writes them as ``passage_id``).

Usage::

    pool = PassagePool.load("vectors/", model)           # refuses vectors of another passage tower
    vectors, keys = pool.columns(q.detach(), k=1000)      # (M, d) and (M,) int64 ids for the loss
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastdpr.errors import InputError
from fastdpr.train.data import passage_key

#: pool rows scored per block when picking each question's k best (bounds the temporary B x block scores)
SELECT_BLOCK = 65536


class PassagePool:
    """The pool's vectors (float32, on the training device) and the int64 passage key of each row."""

    def __init__(self, vectors: torch.Tensor, keys: torch.Tensor, source: str = "<vectors>"):
        if vectors.dim() != 2 or keys.shape != (vectors.shape[0],):
            raise ValueError(f"pool vectors must be (n, d) with one key per row; got {tuple(vectors.shape)} and "
                             f"{tuple(keys.shape)}")
        self.vectors = vectors
        self.keys = keys
        self.source = source

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @classmethod
    def load(cls, directory: str | Path, model, device: torch.device | str = "cpu") -> "PassagePool":
        """The vectors of a ``fastdpr encode`` output directory, checked against ``model``'s passage tower."""
        from fastdpr.encode import load_vectors, read_manifest
        from fastdpr.encode.fingerprint import model_fingerprint

        directory = Path(directory)
        manifest = read_manifest(directory)
        theirs, ours = manifest.get("model_fingerprint"), model_fingerprint(model)
        if theirs != ours:
            raise InputError(f"these vectors were encoded by another passage tower (fingerprint {theirs}, the "
                             f"model's {ours}): encode the corpus with this model first", path=str(directory))
        vectors, ids = load_vectors(directory)
        if vectors.shape[0] == 0:
            raise InputError("no vectors to use as negatives", path=str(directory))
        if vectors.shape[1] != model.dim:
            raise InputError(f"vectors of width {vectors.shape[1]}, the model's are {model.dim}", path=str(directory))
        keys = torch.from_numpy(np.fromiter((passage_key({"id": pid}) for pid in ids), dtype=np.int64,
                                            count=len(ids)))
        tensor = torch.from_numpy(np.array(vectors, dtype=np.float32)).to(device)  # a copy: the shards are mmapped read-only
        return cls(tensor, keys.to(device), source=str(directory))

    def columns(self, q: torch.Tensor | None = None, k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """All pool rows (``k == 0``), or the union of the ``k`` best rows of every question in ``q`` (B, d)."""
        if k <= 0 or k >= len(self):
            return self.vectors, self.keys
        if q is None:
            raise ValueError("choosing the k best pool passages needs the question vectors")
        q = q.detach().to(self.vectors.dtype)
        best_scores = best_rows = None
        for start in range(0, len(self), SELECT_BLOCK):
            block = q @ self.vectors[start:start + SELECT_BLOCK].t()
            scores, rows = block.topk(min(k, block.shape[1]), dim=1)
            rows = rows + start
            if best_scores is not None:
                scores = torch.cat([best_scores, scores], dim=1)
                rows = torch.cat([best_rows, rows], dim=1)
                scores, keep = scores.topk(k, dim=1)
                rows = rows.gather(1, keep)
            best_scores, best_rows = scores, rows
        chosen = torch.unique(best_rows.reshape(-1))
        return self.vectors.index_select(0, chosen), self.keys.index_select(0, chosen)
