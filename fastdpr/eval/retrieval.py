"""Retrieval metrics: DPR's top-k accuracy, and MRR/nDCG/recall over relevance judgements through ir-measures.

Top-k accuracy counts a question as answered at k when one of its first k passages has the answer: the rank r
(0-based) of the first hit counts for every k > r, and questions with no hit stay in the denominator.

Example::

    >>> topk_accuracy([[False, True, False], [False, False, False]], ks=(1, 2, 3))
    {'top1': 0.0, 'top2': 0.5, 'top3': 0.5}
"""
from __future__ import annotations

from typing import Iterable, Sequence

from fastdpr.text.answers import AnswerMatcher

DEFAULT_KS = (1, 5, 20, 100)


def _check_ks(ks: Iterable[int]) -> list[int]:
    ks = [int(k) for k in ks]
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"cut-offs k must be positive integers, got {ks}")
    return ks


def first_hit_ranks(hits: Iterable[Sequence[bool]]) -> list[int | None]:
    """For each question, the 0-based rank of its first hit, or None."""
    out = []
    for flags in hits:
        out.append(next((r for r, flag in enumerate(flags) if flag), None))
    return out


def topk_accuracy(hits: Sequence[Sequence[bool]], ks: Iterable[int] = DEFAULT_KS) -> dict[str, float]:
    """Fraction of questions with a hit in their top k, keyed ``"top1"``, ``"top5"``, ... (values 0..1).

    ``hits[i][r]`` says whether question i's passage at rank r (0-based) has an answer. A question with fewer
    than k passages and no hit among them is a miss at k.
    """
    ks = _check_ks(ks)
    firsts = first_hit_ranks(hits)
    if not firsts:
        raise ValueError("no questions to evaluate")
    n = len(firsts)
    return {f"top{k}": sum(1 for r in firsts if r is not None and r < k) / n for k in ks}


def ranking_hits(rankings, answers: Sequence[Sequence[str]], passages=None, *, mode: str = "string",
                 memo: list[dict] | None = None) -> list[list[bool]]:
    """DPR ``has_answer`` of every ranked passage: ``hits[i][r]`` for question i's passage at rank r (0-based),
    ready for :func:`topk_accuracy`. The one place a ranking is checked against answers.

    ``rankings[i]`` lists question i's passages best first, each given as a corpus row (int; a negative row,
    an index's "no result", is skipped), a passage id (str), a ``(row or id, score)`` pair, or a passage dict
    with ``"text"`` (and ``"id"``). Rows and ids are looked up in ``passages``: a :class:`fastdpr.data.Corpus`,
    or anything with ``[row]`` and ``.get(id)`` returning ``{"text", ...}``. Only the passage text is searched,
    never its title.

    ``memo``: one dict per question (``[{} for _ in questions]``), kept across calls on the same question set
    so that a passage several retrievers list is read and matched once -- their top-100 lists overlap a lot.

    >>> ranking_hits([[{"id": "a", "text": "Lyon"}, {"id": "b", "text": "Paris, France"}]], [["Paris"]])
    [[False, True]]
    """
    import numpy as np

    if isinstance(rankings, np.ndarray):
        rankings = rankings.tolist()
    if len(rankings) != len(answers):
        raise ValueError(f"{len(rankings)} rankings but {len(answers)} answer lists")
    if memo is not None and len(memo) != len(rankings):
        raise ValueError(f"the memo holds {len(memo)} questions but there are {len(rankings)} rankings")
    out = []
    for i, (ranking, ans) in enumerate(zip(rankings, answers)):
        seen = memo[i] if memo is not None else {}
        matcher = None
        flags = []
        for item in ranking:
            key, text = _key_and_text(item)
            if key is not None and isinstance(key, int) and key < 0:
                continue
            if key is None or key not in seen:
                if matcher is None:
                    matcher = AnswerMatcher([ans] if isinstance(ans, str) else ans, mode)
                if text is None:
                    text = _passage_text(passages, key)
                verdict = matcher(text)
                if key is None:
                    flags.append(verdict)
                    continue
                seen[key] = verdict
            flags.append(seen[key])
        out.append(flags)
    return out


def _key_and_text(item):
    """(memo key, text or None) of one ranked item."""
    if isinstance(item, dict):
        text = item.get("text")
        if text is None:
            raise ValueError(f"passage {item.get('id')!r} has no text to check answers in")
        pid = item.get("id")
        return (None if pid is None else str(pid)), text
    if isinstance(item, (tuple, list)):
        item = item[0]
    if isinstance(item, str):
        return item, None
    return int(item), None


def _passage_text(passages, key) -> str:
    if passages is None:
        raise ValueError("rankings of rows or ids need the passages (a Corpus) to read texts from")
    if isinstance(key, int):
        return passages[key].get("text", "")
    try:
        return passages.get(key)["text"]
    except KeyError:
        raise ValueError(f"passage {key!r} is not in the corpus") from None


def result_hits(results: Iterable[dict], mode: str = "string", recompute: bool = False) -> list[list[bool]]:
    """``has_answer`` flags of DPR-shaped results. A ctx's stored ``has_answer`` is used unless it is missing or
    ``recompute`` is set; then it is computed from the ctx's *text* (never its title) and the result's answers."""
    hits = []
    for i, res in enumerate(results):
        ctxs = res.get("ctxs") or []
        todo = [c for c in ctxs if recompute or c.get("has_answer") is None]
        if not todo:
            hits.append([bool(c["has_answer"]) for c in ctxs])
            continue
        answers = res.get("answers")
        if answers is None:
            raise ValueError(f"result {i} (qid {res.get('qid')}) has no answers to check passages against")
        try:
            computed = iter(ranking_hits([[{"text": c.get("text")} for c in todo]], [answers], mode=mode)[0])
        except ValueError:
            missing = next(c for c in todo if c.get("text") is None)
            raise ValueError(f"result {i} (qid {res.get('qid')}): passage {missing.get('id')!r} has no text") \
                from None
        hits.append([next(computed) if (recompute or c.get("has_answer") is None) else bool(c["has_answer"])
                     for c in ctxs])
    return hits


def _rank_scored_run(results) -> dict[str, dict[str, float]]:
    """The run as ir-measures wants it. Scores are replaced by descending rank-derived values, so the metrics
    see exactly the order top-k accuracy sees (trec_eval would otherwise re-sort ties by doc id); a passage
    listed twice counts at its first rank."""
    if isinstance(results, dict):
        items = ((str(q), [d for d, _ in docs]) for q, docs in results.items())
    else:
        items = ((str(r.get("qid", i)) if r.get("qid") is not None else str(i), [c["id"] for c in r.get("ctxs") or []])
                 for i, r in enumerate(results))
    run = {}
    for qid, docs in items:
        scored: dict[str, float] = {}
        for rank, d in enumerate(docs):
            scored.setdefault(str(d), float(len(docs) - rank))
        run[qid] = scored
    return run


def ir_metrics(results, qrels: dict, ks: Iterable[int] = DEFAULT_KS) -> dict[str, float]:
    """``mrr@k``, ``ndcg@k`` and ``recall@k`` for each k, averaged over the queries of ``qrels`` (a query the run
    lacks scores 0), computed by ir-measures (pytrec_eval). ``results``: DPR-shaped results or
    ``{qid: [(docid, score), ...]}`` in ranked order."""
    import ir_measures
    from ir_measures import R, RR, nDCG

    ks = _check_ks(ks)
    measures = {}
    for k in ks:
        measures[f"mrr@{k}"] = RR @ k
        measures[f"ndcg@{k}"] = nDCG @ k
        measures[f"recall@{k}"] = R @ k
    qrels = {str(q): {str(d): int(g) for d, g in docs.items()} for q, docs in qrels.items()}
    if not qrels:
        raise ValueError("the relevance judgements are empty")
    run = _rank_scored_run(results)
    agg = ir_measures.calc_aggregate(list(measures.values()), qrels, run)
    return {name: float(agg.get(m, 0.0)) for name, m in measures.items()}


def evaluate_retrieval(results, ks: Iterable[int] = DEFAULT_KS, qrels: dict | None = None, mode: str = "string",
                       recompute: bool = False) -> dict:
    """Evaluate a run: top-k accuracy from ``has_answer`` flags (DPR results, answers known) and, given
    ``qrels`` ``{qid: {docid: grade}}``, MRR@k / nDCG@k / recall@k through ir-measures.

    ``results`` is a list of DPR-shaped results (``{"qid"?, "question", "answers", "ctxs": [{"id", "text",
    "has_answer"?, "score"}]}``) or, with qrels only, a run ``{qid: [(docid, score), ...]}``.

    >>> res = [{"answers": ["Paris"], "ctxs": [{"id": "1", "text": "Lyon"}, {"id": "2", "text": "Paris, France"}]}]
    >>> evaluate_retrieval(res, ks=(1, 2))
    {'questions': 1, 'top1': 0.0, 'top2': 1.0}
    """
    ks = _check_ks(ks)
    out: dict = {}
    if isinstance(results, dict):
        if qrels is None:
            raise ValueError("a run without passages and answers can only be evaluated against qrels")
        out["questions"] = len(results)
    else:
        results = list(results)
        out["questions"] = len(results)
        # top-k accuracy needs answers, or stored has_answer flags we may trust; with qrels alone it is skipped
        checkable = all(
            r.get("answers") is not None
            or (not recompute and all(c.get("has_answer") is not None for c in r.get("ctxs") or []))
            for r in results
        )
        if results and (qrels is None or checkable):
            out.update(topk_accuracy(result_hits(results, mode, recompute), ks))
    if qrels is not None:
        out.update(ir_metrics(results, qrels, ks))
    return out
