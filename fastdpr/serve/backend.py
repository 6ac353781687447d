"""What the server computes with: one copy of the retrievers, shared by every request, entered by one batch at a
time (the batcher's worker thread)."""
from __future__ import annotations

import json
import math
import sys
from functools import lru_cache
from typing import Any

from fastdpr.retrieve.base import found, passage_fields
from fastdpr.serve.files import WatchedFiles
from fastdpr.serve.requests import MODES


class Backend:
    """The retrievers a server answers with, by mode. ``hybrid`` alone is enough (its ``dense`` and ``sparse``
    sides serve those modes); ``dense`` is needed for ``/encode``, which answers its ``encode``: the vectors its
    search uses.

    ``run(key, questions)`` is the batcher's ``run_batch``: ``key`` is ``("search", mode, k)`` or
    ``("encode",)``, and the result one entry per question: the JSON text of its passage list (``[{"id", "title",
    "text", "score"}, ...]``, what ``retrieve`` returns), or its vector as a list of floats.

    A retriever with ``search`` and a ``corpus`` (every fastdpr retriever) is asked for rows and scores only; the
    JSON text of each passage is kept by row (the last ``cached_passages`` rows used), so that the passages a
    server answers with again and again are read from the corpus and encoded once, not on every request (parsing
    them on the worker thread delayed every batch). Anything else with ``retrieve(questions,
    k)`` is served through it.

    ``threads``: torch's thread count while a batch runs (set again at each batch, in the worker thread: libraries
    that run OpenMP loops there, numba's BM25 among them, may change the thread's own count); ``fastdpr serve``
    gives it every core (``fastdpr.commands.serve.worker_threads``: why).

    ``files``: by mode, the files its retriever reads while serving (a mapped index), checked before and after
    each of its batches (``fastdpr.serve.files``); a corpus opened from a file adds itself and its side file to
    every mode it serves. A changed file fails that mode's batches with :class:`FileChanged`."""

    def __init__(self, *, dense=None, sparse=None, hybrid=None, description: dict | None = None,
                 cached_passages: int = 1 << 16, threads: int | None = None, files: dict | None = None):
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
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        files = files or {}
        uses = {"dense": ("dense",), "sparse": ("sparse",), "hybrid": ("hybrid", "dense", "sparse")}
        self.files = {m: WatchedFiles([*_corpus_files(r), *(p for side in uses[m] for p in files.get(side, ()))])
                      for m, r in self.retrievers.items()}
        self._texts = {}  # id(corpus) -> row -> JSON text of the passage, without its score
        for r in self.retrievers.values():
            corpus = getattr(r, "corpus", None)
            if corpus is not None and hasattr(r, "search") and id(corpus) not in self._texts:
                self._texts[id(corpus)] = lru_cache(maxsize=cached_passages)(_passage_text(corpus))

    @property
    def can_encode(self) -> bool:
        return callable(getattr(self.retrievers.get("dense"), "encode", None))

    def run(self, key: tuple, questions: list[str]) -> list[Any]:
        if self.threads is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(self.threads)
        if key[0] == "search":
            _, mode, k = key
            self.files[mode].check()  # no read of a file seen changed
            answers = self._search(mode, questions, k)
            self.files[mode].check()  # no answer read from a file that changed meanwhile
            return answers
        if key[0] == "encode":
            return [row.tolist() for row in self.encode(questions)]
        raise ValueError(f"unknown batch key {key!r}")

    def _search(self, mode: str, questions: list[str], k: int) -> list[str]:
        retriever = self.retrievers[mode]
        text = self._texts.get(id(getattr(retriever, "corpus", None)))
        if text is None:
            return [json.dumps(passages, ensure_ascii=False, allow_nan=False)
                    for passages in retriever.retrieve(questions, k)]
        scores, rows = retriever.search(questions, k)
        return [_passages_json(text, srow, rrow) for srow, rrow in zip(scores.tolist(), rows.tolist())]

    def check_files(self) -> None:
        """:class:`FileChanged` when a file of any mode changed (``/readyz``)."""
        for watched in self.files.values():
            watched.check()

    def encode(self, questions: list[str]):
        return self.retrievers["dense"].encode(questions)

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


def _corpus_files(retriever) -> list:
    corpus = getattr(retriever, "corpus", None)
    return [getattr(corpus, "path", None), getattr(corpus, "index_path", None)]


def _passage_text(corpus):
    def text(row: int) -> str:
        return json.dumps(passage_fields(corpus, row), ensure_ascii=False)[:-1] + ', "score": '  # the score closes it
    return text


def _passages_json(text, scores: list[float], rows: list[int]) -> str:
    """``json.dumps(passages_from_rows(...)[i])`` of one question, from the cached passage texts."""
    parts = []
    for s, r in found(scores, rows):
        if not math.isfinite(s):
            raise ValueError(f"score {s} of corpus row {r} is not a finite number")
        parts.append(text(r) + repr(s) + "}")
    return "[" + ", ".join(parts) + "]"
