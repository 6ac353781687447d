"""What the server computes with: one copy of the retrievers, shared by every request, entered by one batch at a
time (the batcher's worker thread)."""
from __future__ import annotations

from typing import Any

from fastdpr.serve.requests import MODES


class Backend:
    """The retrievers a server answers with, by mode. ``hybrid`` alone is enough (its ``dense`` and ``sparse``
    sides serve those modes); ``dense`` is needed for ``/encode``.

    ``run(key, questions)`` is the batcher's ``run_batch``: ``key`` is ``("search", mode, k)`` or
    ``("encode",)``, and the result one entry per question (a passage list, or a vector as a list of floats)."""

    def __init__(self, *, dense=None, sparse=None, hybrid=None, description: dict | None = None):
        if hybrid is not None:
            dense = dense if dense is not None else hybrid.dense
            sparse = sparse if sparse is not None else hybrid.sparse
        self.retrievers = {m: r for m, r in (("dense", dense), ("sparse", sparse), ("hybrid", hybrid))
                           if r is not None}
        if not self.retrievers:
            raise ValueError("a server needs at least one retriever")
        self.modes = tuple(m for m in MODES if m in self.retrievers)
        self.default_mode = "hybrid" if "hybrid" in self.retrievers else self.modes[0]
        self.description = dict(description or {})

    @property
    def can_encode(self) -> bool:
        return "dense" in self.retrievers

    def run(self, key: tuple, questions: list[str]) -> list[Any]:
        if key[0] == "search":
            _, mode, k = key
            return self.retrievers[mode].retrieve(questions, k)
        if key[0] == "encode":
            return [row.tolist() for row in self.encode(questions)]
        raise ValueError(f"unknown batch key {key!r}")

    def encode(self, questions: list[str]):
        dense = self.retrievers["dense"]
        extra = {"precision": dense.precision} if getattr(dense, "precision", "auto") != "auto" else {}
        return dense.model.encode_questions(questions, batch_size=max(1, len(questions)), device=dense.device,
                                            show_progress=False, **extra)

    def warm_up(self) -> None:
        """One question and a small batch through every mode: the first call of a path builds what it caches
        (tokenizer, inference towers, compiled BM25 scoring), which should not fall on a client's request."""
        for mode in self.modes:
            self.run(("search", mode, 10), ["warm up"])
            self.run(("search", mode, 10), ["warm up the server", "a second question"])
        if self.can_encode:
            self.run(("encode",), ["warm up"])

    def passages(self) -> int | None:
        corpus = next(iter(self.retrievers.values())).corpus
        return len(corpus) if corpus is not None else None
