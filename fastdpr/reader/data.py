"""Reader training data from the published QA sets, with every test question and paragraph held out.

Training questions are the ``train`` splits of new Wikipedia (SQuADShifts) and QED (Natural Questions with their
paragraphs): crowd-sourced or annotated questions with the answer in the paragraph. Each becomes a DPR
retriever-results record: its own paragraph as the positive and BM25 hits from the same source that do not
contain an answer as negatives.

Held out (never a question, a positive or a negative in training), compared by folded paragraph text so the same
paragraph under another id is caught too: every paragraph a ``test`` question of any prepared set was written
about. That is all of XQuAD (SQuAD dev), Reddit and Amazon (test-only sets), and the test articles of QED and new
Wikipedia (their splits group questions by article; this check stays as the guard).

Usage::

    from fastdpr.reader.data import build_training_examples
    examples, stats = build_training_examples()          # from the prepared cache (`fastdpr data fetch`)
    reader.fit(examples, ...)
"""
from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

#: training sources (their ``train`` splits)
TRAIN_SOURCES = ("new_wiki", "qed")
#: sets that must be prepared: the test split of each is held out (of any other prepared set as well)
HELD_OUT = ("qed", "xquad", "new_wiki", "reddit", "amazon")


def text_key(text: str) -> str:
    """A paragraph's identity for hold-out checks: its whitespace-folded, lower-cased text (ids differ between
    sources: SQuAD dev and SQuADShifts prefix them by set)."""
    return hashlib.sha1(" ".join(str(text).split()).lower().encode("utf-8")).hexdigest()


def _prepared(cache: Path, name: str) -> Path:
    from fastdpr.errors import InputError

    folder = cache / "prepared" / name
    if not (folder / "counts.json").is_file():
        raise InputError(f"prepared data set {name!r} missing: run `fastdpr data fetch` first", path=str(folder))
    return folder


def held_out_paragraphs(cache: str | os.PathLike | None = None) -> set[str]:
    """:func:`text_key` of every test paragraph: the gold paragraphs of the test questions of every prepared set
    (those of ``HELD_OUT`` at least)."""
    from fastdpr.data import sources

    cache = Path(cache) if cache is not None else sources.default_cache()
    keys: set[str] = set()
    for name in HELD_OUT:
        _prepared(cache, name)
    for folder in sorted((cache / "prepared").iterdir()):
        name = folder.name
        if not (folder / "counts.json").is_file():
            continue
        passages = {p["id"]: p["text"] for p in sources.read_jsonl(folder / "passages.jsonl")}
        for q in sources.read_jsonl(folder / "test.jsonl"):
            keys.update(text_key(passages[g]) for g in q["gold_ids"] if g in passages)
    return keys


def _source_questions(cache: Path, name: str) -> tuple[list[dict], list[dict]]:
    """(passages, training questions) of one source: its prepared ``train`` split (dev and test stay out)."""
    from fastdpr.data import sources
    from fastdpr.errors import InputError

    folder = _prepared(cache, name)
    if not (folder / "train.jsonl").is_file():
        raise InputError(f"{name!r} has no training split (a test-only set)", path=str(folder))
    return list(sources.read_jsonl(folder / "passages.jsonl")), list(sources.read_jsonl(folder / "train.jsonl"))


def build_training_examples(
    cache: str | os.PathLike | None = None,
    train_sources: tuple[str, ...] = TRAIN_SOURCES,
    per_source: int | dict | None = None,
    n_negatives: int = 3,
    depth: int = 10,
    seed: int = 0,
    bm25_backend: str = "auto",
) -> tuple[list[dict], dict]:
    """DPR retriever-results records ``{"qid", "source", "question", "answers", "ctxs"}`` for reader training, and
    counts. ``ctxs`` = the question's own paragraph (``has_answer`` True) followed by up to ``n_negatives`` BM25
    hits among the source's top ``depth`` that hold no answer. Sources are interleaved in a seeded random order;
    ``per_source`` caps the questions taken from each source (one cap, or ``{source: cap or None}``).
    ``bm25_backend`` is bm25s's (``numba`` when installed, else ``numpy``; numba compiles on first use)."""
    from fastdpr.data import sources
    from fastdpr.sparse import BM25
    from fastdpr.text.answers import AnswerMatcher

    cache = Path(cache) if cache is not None else sources.default_cache()
    held_out = held_out_paragraphs(cache)
    rng = random.Random(seed)
    examples: list[dict] = []
    stats: dict = {"held_out_paragraphs": len(held_out), "sources": {}}
    for name in train_sources:
        passages, questions = _source_questions(cache, name)
        by_id = {p["id"]: p for p in passages}
        pool = [p for p in passages if text_key(p["text"]) not in held_out]
        kept = [q for q in questions
                if q["gold_ids"] and all(g in by_id and text_key(by_id[g]["text"]) not in held_out
                                         for g in q["gold_ids"])]
        rng.shuffle(kept)
        dropped = len(questions) - len(kept)
        cap = per_source.get(name) if isinstance(per_source, dict) else per_source
        if cap is not None:
            kept = kept[:cap]
        counts = {"questions": len(questions), "dropped_test_paragraph": dropped, "taken": len(kept),
                  "pool": len(pool)}
        bm25 = BM25.from_corpus(pool, show_progress=False, backend=bm25_backend) if pool and n_negatives else None
        negatives: list[list[str]] = [[] for _ in kept]
        if bm25 is not None and kept:
            _, ids = bm25.search([q["question"] for q in kept], k=min(depth, len(pool)))
            negatives = [list(row) for row in ids]
        for q, hits in zip(kept, negatives):
            match = AnswerMatcher(q["answers"])
            gold = [by_id[g] for g in q["gold_ids"]]
            gold_ids = set(q["gold_ids"])
            negs = [by_id[h] for h in hits if h and h not in gold_ids and not match(by_id[h]["text"])][:n_negatives]
            examples.append({
                "qid": q["qid"], "source": name, "question": q["question"], "answers": q["answers"],
                "ctxs": [{**p, "has_answer": True} for p in gold] + [{**p, "has_answer": False} for p in negs],
            })
        stats["sources"][name] = counts
    rng.shuffle(examples)
    stats["examples"] = len(examples)
    return examples, stats


def check_held_out(examples: list[dict], held_out: set[str]) -> int:
    """How many training passages (positives or negatives) are test paragraphs; 0 for a clean training set."""
    return sum(text_key(c["text"]) in held_out for ex in examples for c in ex["ctxs"])


__all__ = ["TRAIN_SOURCES", "HELD_OUT", "text_key", "held_out_paragraphs", "build_training_examples",
           "check_held_out"]
