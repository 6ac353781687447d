"""Answer-aware BM25 hard-negative mining (DPR's training-data recipe).

For every question: the positive is the gold passage when the input names one, otherwise the highest-ranked BM25
passage whose text contains an answer. A gold id may name a document rather than a passage (questions are written
about documents; ``fastdpr split`` cuts them into passages): with the document map of the split (``doc_map``, see
:func:`fastdpr.data.split.gold_passages`) it stands for that document's passages that contain an answer. Gold ids
found nowhere are counted and warned about, and their questions fall back to BM25 positives. Hard negatives are
the top BM25 passages whose text contains no answer (the same ``has_answer`` rule evaluation uses); random
negatives are optional. Questions with no positive within
the searched depth are dropped and counted. Questions are processed in batches, so memory stays bounded by the
batch, not the dataset.

Example::

    from fastdpr.sparse import BM25, mine_hard_negatives
    mined = mine_hard_negatives(fastdpr.data.iter_qa("train.jsonl"), BM25.load("bm25/"),
                                fastdpr.data.Corpus.open("passages.tsv"), n_hard=30)
    fastdpr.data.write_dpr_biencoder("train.dpr.json", mined)
    print(mined.stats)
"""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from typing import Any, Iterable, Iterator

import numpy as np

from fastdpr._renamed import renamed
from fastdpr.errors import InputError


class GoldIdsNotFound(UserWarning):
    """Gold ids of the training questions matched no passage (and no document of the document map)."""


@dataclasses.dataclass
class MiningStats:
    """Counts of one mining run (filled while the records are consumed)."""

    questions: int = 0
    kept: int = 0
    dropped_no_positive: int = 0
    positives_gold: int = 0
    positives_bm25: int = 0
    gold_not_in_corpus: int = 0  # gold ids that are neither passages of the corpus nor documents of the map
    gold_documents: int = 0  # gold ids that were documents, mapped to their passages
    gold_documents_without_answer: int = 0  # of those, documents none of whose passages holds an answer
    hard_negatives: int = 0
    random_negatives: int = 0
    short_of_hard_negatives: int = 0  # kept questions with fewer than n_hard hard negatives

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        kept_pct = 100.0 * self.kept / self.questions if self.questions else 0.0
        return (
            f"{self.questions} questions: {self.kept} kept ({kept_pct:.1f}%), {self.dropped_no_positive} dropped "
            f"(no positive); positives: {self.positives_gold} gold, {self.positives_bm25} from BM25; "
            f"{self.hard_negatives} hard and {self.random_negatives} random negatives; "
            f"{self.short_of_hard_negatives} questions short of hard negatives; "
            f"{self.gold_not_in_corpus} gold ids not in the corpus; {self.gold_documents} gold documents mapped "
            f"to passages ({self.gold_documents_without_answer} with no passage holding an answer)"
        )


class MinedRecords:
    """A one-pass iterable of DPR biencoder records; :attr:`stats` counts what has been yielded so far."""

    def __init__(self, records: Iterator[dict], stats: MiningStats):
        self._records = records
        self.stats = stats

    def __iter__(self) -> Iterator[dict]:
        return self._records


def _ctx(passage: dict, score: float | None = None) -> dict:
    ctx = {"title": passage.get("title", ""), "text": passage.get("text", ""), "passage_id": str(passage["id"])}
    if score is not None:
        ctx["score"] = float(score)
    return ctx


def gold_ids(record: dict) -> list[str]:
    """The gold passage or document ids a QA record names: ``gold_passage_ids``, ``gold_ids`` or
    ``gold_passage_id`` (what ``fastdpr.data.sources`` loaders and QA JSONL files give)."""
    ids = (record.get("gold_passage_ids") or record.get("gold_ids")
           or ([record["gold_passage_id"]] if record.get("gold_passage_id") else []))
    return [str(i) for i in ([ids] if isinstance(ids, (str, int)) else ids)]


def _gold_positives(record: dict, corpus, stats: MiningStats, doc_map, match: str) -> list[dict]:
    """Positive ctxs given by the input: ``positive_ctxs`` (DPR), or the passages that :func:`gold_ids` name,
    directly or through the document map, looked up in the corpus."""
    given = record.get("positive_ctxs") or []
    positives = []
    for ctx in given:
        pid = ctx.get("passage_id", ctx.get("id"))
        if pid is None:
            # a gold passage without an id: keep it, it simply cannot be excluded from the negatives by id
            positives.append({"title": ctx.get("title", ""), "text": ctx.get("text", ""), "passage_id": None})
        else:
            positives.append({"title": ctx.get("title", ""), "text": ctx.get("text", ""), "passage_id": str(pid)})
    ids = gold_ids(record)
    if doc_map and any(g in doc_map for g in ids):
        from fastdpr.data.split import gold_passages

        mapped: list[str] = []
        for g in ids:
            if g in doc_map:
                found = gold_passages([g], record.get("answers") or [], doc_map, corpus, mode=match)
                stats.gold_documents += 1
                stats.gold_documents_without_answer += not found
                mapped.extend(found)
            else:
                mapped.append(g)
        ids = list(dict.fromkeys(mapped))
    for pid in ids:
        try:
            passage = corpus.get(str(pid))
        except KeyError:
            passage = None
        if passage is None:
            stats.gold_not_in_corpus += 1
            continue
        positives.append(_ctx(passage))
    return positives


def mine_hard_negatives(
    qa_records: Iterable[dict],
    bm25,
    corpus,
    *,
    n_hard: int = 30,
    n_random: int = 0,
    depth: int = 100,
    match: str = "string",
    batch_size: int = 512,
    threads: int | None = None,
    n_threads: int | None = None,
    seed: int = 0,
    show_progress: bool = True,
    total: int | None = None,
    doc_map: dict | None = None,
) -> MinedRecords:
    """Mine positives and hard negatives for every question with BM25.

    ``qa_records``: dicts with ``question`` and ``answers`` (and optionally ``qid``, ``positive_ctxs``,
    ``gold_passage_id`` / ``gold_ids``, passage ids or -- with ``doc_map`` ``{doc id: [passage ids]}``, e.g.
    :func:`fastdpr.data.split.read_docmap` of the split -- document ids); ``bm25``: a :class:`fastdpr.sparse.BM25`
    over ``corpus`` (anything with ``get(passage_id) -> dict``; also ``len()`` and ``[row]`` when ``n_random > 0``). ``match``: ``"string"`` or
    ``"regex"`` (CuratedTREC answers). Returns an iterable of DPR biencoder records (each ctx
    ``{title, text, passage_id, score}``) whose ``stats`` attribute is filled as it is consumed.

    Example: ``for rec in mine_hard_negatives(qa, bm25, corpus, n_hard=1): ...``"""
    if n_hard < 0 or n_random < 0 or depth < 1:
        raise ValueError(f"need n_hard >= 0, n_random >= 0, depth >= 1 (got {n_hard}, {n_random}, {depth})")
    if match not in ("string", "regex"):
        raise ValueError(f"match must be 'string' or 'regex', got {match!r}")
    stats = MiningStats()
    records = _mine(
        qa_records, bm25, corpus, stats, n_hard=n_hard, n_random=n_random, depth=depth, match=match,
        batch_size=batch_size, threads=renamed("threads", threads, "n_threads", n_threads, "mine_hard_negatives"),
        seed=seed, show_progress=show_progress, total=total,
        doc_map=doc_map,
    )
    return MinedRecords(records, stats)


def _mine(qa_records, bm25, corpus, stats: MiningStats, *, n_hard, n_random, depth, match, batch_size, threads,
          seed, show_progress, total, doc_map) -> Iterator[dict]:
    from fastdpr.progress import progress

    from fastdpr.text.answers import has_answer

    if total is None and hasattr(qa_records, "__len__"):
        total = len(qa_records)
    bar = progress(total=total, desc="mining", unit="q", enabled=show_progress)
    records = iter(qa_records)
    number = 0
    try:
        while True:
            batch = list(itertools.islice(records, batch_size))
            if not batch:
                break
            questions = []
            for rec in batch:
                if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
                    raise InputError(f"QA record #{number + len(questions)} has no 'question' string: {rec!r:.80}")
                questions.append(rec["question"])
            scores, ids = bm25.search(questions, k=depth, threads=threads)
            for rec, row_scores, row_ids in zip(batch, scores, ids):
                out = _mine_one(rec, row_scores, row_ids, corpus, stats, has_answer, n_hard=n_hard,
                                n_random=n_random, match=match, rng=np.random.default_rng([seed, number]),
                                doc_map=doc_map)
                number += 1
                if out is not None:
                    yield out
            bar.update(len(batch))
            bar.set_postfix(kept=stats.kept, dropped=stats.dropped_no_positive, refresh=False)
    finally:
        bar.close()
    if stats.gold_not_in_corpus:
        warnings.warn(f"{stats.gold_not_in_corpus} gold ids are neither passages of the corpus nor documents of "
                      f"the document map{'' if doc_map else ' (none given)'}: their questions fell back to BM25 "
                      "positives", GoldIdsNotFound, stacklevel=2)


def _mine_one(rec, row_scores, row_ids, corpus, stats: MiningStats, has_answer, *, n_hard, n_random, match, rng,
              doc_map):
    stats.questions += 1
    answers = rec.get("answers") or []
    if isinstance(answers, str):
        answers = [answers]
    positives = _gold_positives(rec, corpus, stats, doc_map, match)
    from_gold = bool(positives)
    used = {p["passage_id"] for p in positives if p["passage_id"] is not None}
    hard: list[dict] = []
    # has_answer passage by passage rather than fastdpr.eval.ranking_hits over the whole list: the scan stops as
    # soon as it holds a positive and n_hard negatives, and most of the searched depth is never read
    for score, pid in zip(row_scores, row_ids):
        if score <= 0:
            break  # bm25s fills the tail with passages sharing no term with the question: not BM25 negatives
        if positives and len(hard) >= n_hard:
            break
        pid = str(pid)
        if pid in used:
            continue
        passage = corpus.get(pid)
        if has_answer(passage.get("text", ""), answers, mode=match):
            if not positives:
                positives.append(_ctx(passage, score))
                used.add(pid)
            continue  # a passage holding an answer is never a negative
        if len(hard) < n_hard:
            hard.append(_ctx(passage, score))
            used.add(pid)
    if not positives:
        stats.dropped_no_positive += 1
        return None
    randoms = _random_negatives(corpus, answers, used, n_random, match, rng, has_answer) if n_random else []
    stats.kept += 1
    stats.positives_gold += from_gold
    stats.positives_bm25 += not from_gold
    stats.hard_negatives += len(hard)
    stats.random_negatives += len(randoms)
    stats.short_of_hard_negatives += len(hard) < n_hard
    out: dict[str, Any] = {}
    if "qid" in rec:
        out["qid"] = rec["qid"]
    out.update(question=rec["question"], answers=list(answers), positive_ctxs=positives,
               negative_ctxs=randoms, hard_negative_ctxs=hard)
    return out


def _random_negatives(corpus, answers, used: set, n_random: int, match: str, rng, has_answer) -> list[dict]:
    size = len(corpus)
    chosen: list[dict] = []
    # a bounded number of draws: on a tiny corpus there may not be n_random answer-free passages left
    for row in rng.integers(0, size, size=4 * n_random + 8):
        passage = corpus[int(row)]
        pid = str(passage["id"])
        if pid in used or has_answer(passage.get("text", ""), answers, mode=match):
            continue
        used.add(pid)
        chosen.append(_ctx(passage))
        if len(chosen) == n_random:
            break
    return chosen


__all__ = ["mine_hard_negatives", "MiningStats", "MinedRecords", "GoldIdsNotFound", "gold_ids"]
