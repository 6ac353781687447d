"""Training batches for the dual encoder: questions, their passages in the interleaved layout, and loss masks.

A batch of B questions gives every question ``g = 1 + n_hard + n_random`` passage columns, laid out
``[pos_0, hn_0.., rn_0.., pos_1, hn_1.., ...]``, so question i's positive is column ``i * g``. A question with fewer
negatives than asked keeps its slots as padding (``column_valid`` False) rather than shifting later questions, which
keeps the layout fixed: under data parallelism every rank's slice of the global batch then has the same shape and
the global target of a local question is ``rank * B_local * g + i * g``.

Everything is a pure function of ``(seed, epoch, batch position)``, so a resumed run rebuilds exactly the batches an
uninterrupted run would have seen.

Usage::

    examples = load_examples("train.dpr.json")
    batches = BatchBuilder(examples, batch_size=128, n_hard=1, seed=12345)
    for position in range(batches.batches_per_epoch):
        batch = batches.batch(epoch=0, position=position)
"""
from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import torch

from fastdpr.errors import InputError


@dataclass
class Example:
    """One training question with its candidate passages (each a dict with title, text and a string id)."""

    question: str
    positives: list[dict]
    hard_negatives: list[dict] = field(default_factory=list)
    negatives: list[dict] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


def passage_key(ctx: dict) -> int:
    """A stable int64 id for a passage: from its ``passage_id`` (or ``id``) when given, else from title + text.

    Ranks and restarts must agree on ids without sharing a table, so the id is a hash rather than a counter;
    63 bits make a collision (which would only mask one negative) vanishingly unlikely."""
    pid = ctx.get("passage_id", ctx.get("id"))
    if pid not in (None, ""):
        key = "id\x00" + str(pid)
    else:
        key = "tx\x00" + str(ctx.get("title", "")) + "\x00" + str(ctx.get("text", ""))
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class NoPositiveWarning(UserWarning):
    """Training questions without a positive passage were skipped."""


def _ctx_list(record: dict, key: str, path: str, index: int) -> list:
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"record {index}: {key!r} must be a list of passages, got {type(value).__name__}", path=path)
    return value


def _ctx(raw: dict, path: str, index: int) -> dict:
    if not isinstance(raw, dict) or "text" not in raw:
        raise InputError(f"record {index}: a passage has no 'text' field", path=path)
    if not isinstance(raw["text"] or "", str) or not isinstance(raw.get("title") or "", str):
        raise InputError(f"record {index}: a passage's 'text' and 'title' must be strings", path=path)
    ctx = {"title": raw.get("title") or "", "text": raw["text"] or ""}
    ctx["key"] = passage_key(raw)
    return ctx


def examples_from_records(records: Iterable[dict], path: str = "<records>") -> list[Example]:
    """Turn DPR biencoder records (``question, positive_ctxs, hard_negative_ctxs, negative_ctxs``) into examples.

    Records without a positive passage cannot be trained on (DPR drops them too); they are skipped, and a
    ``NoPositiveWarning`` says how many (a file where most questions lack one was usually mined or mapped wrong)."""
    examples = []
    skipped, first_skipped = 0, None
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"record {index}: expected an object, got {type(record).__name__}", path=path)
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InputError(f"record {index}: missing or empty 'question'", path=path)
        positives = [_ctx(c, path, index) for c in _ctx_list(record, "positive_ctxs", path, index)]
        # a positive with no text teaches nothing: it counts as none
        positives = [c for c in positives if c["text"].strip()]
        if not positives:
            skipped += 1
            first_skipped = index if first_skipped is None else first_skipped
            continue
        examples.append(
            Example(
                question=question,
                positives=positives,
                hard_negatives=[_ctx(c, path, index) for c in _ctx_list(record, "hard_negative_ctxs", path, index)],
                negatives=[_ctx(c, path, index) for c in _ctx_list(record, "negative_ctxs", path, index)],
                answers=[str(a) for a in record.get("answers") or []],
            )
        )
    if skipped:
        warnings.warn(f"{path}: skipped {skipped} of {skipped + len(examples)} training questions without a positive "
                      f"passage (the first is record {first_skipped})", NoPositiveWarning, stacklevel=2)
    return examples


def load_examples(path: str, skip_bad: bool = False) -> list[Example]:
    """Read a DPR biencoder JSON or Tevatron JSONL training file (through ``fastdpr.data.read_training``)."""
    from fastdpr.data import read_training

    if not os.path.isfile(path):
        raise InputError("no such file", path=str(path))
    examples = examples_from_records(read_training(path, skip_bad=skip_bad), path=str(path))
    if not examples:
        raise InputError("no training question has a positive passage", path=str(path))
    return examples


@dataclass
class Batch:
    """A (global) batch. Passage tensors index the N = B * group columns; ``passages`` holds only the real ones.

    ``passage_columns[k]`` is the column of ``passages[k]``; padded columns have no passage and are invalid."""

    questions: list[str]
    passages: list[dict]
    passage_columns: torch.Tensor  # (M,) int64, strictly increasing
    group: int  # columns per question
    targets: torch.Tensor  # (B,) int64, column of each question's positive
    column_ids: torch.Tensor  # (N,) int64 passage ids; padding gets unique negative ids
    column_valid: torch.Tensor  # (N,) bool

    @property
    def size(self) -> int:
        return len(self.questions)

    @property
    def n_columns(self) -> int:
        return self.size * self.group

    def shard(self, rank: int, world_size: int) -> "Batch":
        """The questions of one rank and their columns; targets stay local (``i * group``)."""
        if self.size % world_size:
            raise ValueError(f"batch of {self.size} questions does not split over {world_size} ranks")
        per = self.size // world_size
        lo, hi = rank * per * self.group, (rank + 1) * per * self.group
        keep = (self.passage_columns >= lo) & (self.passage_columns < hi)
        rows = keep.nonzero().flatten().tolist()
        return Batch(
            questions=self.questions[rank * per : (rank + 1) * per],
            passages=[self.passages[k] for k in rows],
            passage_columns=self.passage_columns[keep] - lo,
            group=self.group,
            targets=torch.arange(per, dtype=torch.int64) * self.group,
            column_ids=self.column_ids[lo:hi].clone(),
            column_valid=self.column_valid[lo:hi].clone(),
        )


class BatchBuilder:
    """Deterministic batches over a list of examples.

    Each epoch shuffles the examples with ``(seed, epoch)``; each question samples ``n_hard`` of its mined hard
    negatives (and ``n_random`` of its random negatives, falling back to other questions' positives when it has
    none) with a generator seeded by ``(seed, epoch, example index)``. Incomplete final batches are dropped so
    every step has the same shape (needed for an even split across ranks)."""

    def __init__(
        self,
        examples: list[Example],
        batch_size: int,
        n_hard: int = 1,
        n_random: int = 0,
        seed: int = 12345,
        shuffle: bool = True,
        sample_positive: bool = False,
        sample_hard: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if n_hard < 0 or n_random < 0:
            raise ValueError("n_hard and n_random must be >= 0")
        self.examples = examples
        self.batch_size = batch_size
        self.n_hard = n_hard
        self.n_random = n_random
        self.seed = seed
        self.shuffle = shuffle
        self.sample_positive = sample_positive
        self.sample_hard = sample_hard
        self.group = 1 + n_hard + n_random

    @property
    def batches_per_epoch(self) -> int:
        return len(self.examples) // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.examples))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

    def batch(self, epoch: int, position: int, order: np.ndarray | None = None) -> Batch:
        if not 0 <= position < self.batches_per_epoch:
            raise IndexError(f"batch position {position} outside 0..{self.batches_per_epoch - 1}")
        if order is None:
            order = self.order(epoch)
        indices = order[position * self.batch_size : (position + 1) * self.batch_size]
        return self.collate([int(i) for i in indices], epoch)

    def collate(self, indices: list[int], epoch: int = 0) -> Batch:
        g = self.group
        n = len(indices) * g
        questions, passages, columns = [], [], []
        column_ids = torch.empty(n, dtype=torch.int64)
        column_valid = torch.zeros(n, dtype=torch.bool)
        for row, index in enumerate(indices):
            example = self.examples[index]
            rng = np.random.default_rng([self.seed, epoch, index])
            chosen = [self._pick(example.positives, 1, rng, self.sample_positive)[0]]
            hard = self._pick(example.hard_negatives, self.n_hard, rng, self.sample_hard)
            chosen += hard + [None] * (self.n_hard - len(hard))
            if self.n_random:
                pool = example.negatives
                if not pool:
                    pool = self._other_positives(index, rng)
                rand = self._pick(pool, self.n_random, rng, True)
                chosen += rand + [None] * (self.n_random - len(rand))
            questions.append(example.question)
            for slot, ctx in enumerate(chosen):
                col = row * g + slot
                if ctx is None:
                    column_ids[col] = -1 - col  # unique and never equal to a real (non-negative) id
                    continue
                column_ids[col] = ctx["key"]
                column_valid[col] = True
                passages.append(ctx)
                columns.append(col)
        return Batch(
            questions=questions,
            passages=passages,
            passage_columns=torch.tensor(columns, dtype=torch.int64),
            group=g,
            targets=torch.arange(len(indices), dtype=torch.int64) * g,
            column_ids=column_ids,
            column_valid=column_valid,
        )

    @staticmethod
    def _pick(pool: list[dict], k: int, rng: np.random.Generator, sample: bool) -> list[dict]:
        if k <= 0 or not pool:
            return []
        if not sample:
            return list(pool[:k])
        take = rng.choice(len(pool), size=min(k, len(pool)), replace=False)
        return [pool[int(i)] for i in take]

    def _other_positives(self, index: int, rng: np.random.Generator) -> list[dict]:
        n = len(self.examples)
        if n < 2:
            return []
        picks = rng.choice(n - 1, size=min(self.n_random, n - 1), replace=False)
        return [self.examples[int(i) + (int(i) >= index)].positives[0] for i in picks]
