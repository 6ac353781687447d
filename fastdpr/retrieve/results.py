"""Retrieval results as run files: DPR retriever-results records (with ``has_answer``), pyserini, TREC, BEIR and
compact runs (see :mod:`fastdpr.data.runs` for the formats).

Questions without an id in their file (DPR's QA CSV/TSV) are known by their 0-based position among the file's
questions, header excluded -- the numbering pyserini's DPR topics use -- so a TREC run written from a TSV file
and that same file always agree on query ids."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fastdpr.data.runs import RUN_FORMATS


def dpr_results(questions: Sequence[str], answers: Sequence[Sequence[str]], retrieved: Sequence[list[dict]],
                *, match: str = "string", qids: Sequence[str] | None = None) -> list[dict]:
    """DPR retriever-results records ``{question, answers, ctxs: [{id, title, text, score, has_answer}]}``
    (with ``qid`` first when ``qids`` are given).

    ``has_answer`` follows DPR's rule on the passage text (``match="regex"`` for CuratedTREC).

    Example: ``write_dpr_results("run.json", dpr_results(qs, answers, retriever.retrieve(qs, 100)))``"""
    from fastdpr.eval.retrieval import ranking_hits

    if not (len(questions) == len(answers) == len(retrieved)):
        raise ValueError(f"{len(questions)} questions, {len(answers)} answer lists, {len(retrieved)} results")
    if qids is not None and len(qids) != len(questions):
        raise ValueError(f"{len(qids)} query ids for {len(questions)} questions")
    answers = [[a] if isinstance(a, str) else list(a) for a in answers]
    flags = ranking_hits([[{"text": p.get("text", "")} for p in passages] for passages in retrieved], answers,
                         mode=match)
    out = []
    for i, (question, ans, passages, hit) in enumerate(zip(questions, answers, retrieved, flags)):
        ctxs = [
            {"id": p["id"], "title": p.get("title", ""), "text": p.get("text", ""), "score": float(p["score"]),
             "has_answer": h}
            for p, h in zip(passages, hit)
        ]
        record = {"question": question, "answers": ans, "ctxs": ctxs}
        out.append({"qid": str(qids[i]), **record} if qids is not None else record)
    return out


def trec_run(qids: Sequence[str], retrieved: Sequence[list[dict] | list[tuple[str, float]]]) -> dict:
    """``{qid: [(docid, score), ...]}`` for ``fastdpr.data.write_trec`` from passage dicts or (id, score) pairs."""
    if len(qids) != len(retrieved):
        raise ValueError(f"{len(qids)} query ids but {len(retrieved)} result lists")
    run = {}
    for qid, ranking in zip(qids, retrieved):
        if str(qid) in run:
            raise ValueError(f"query id {qid!r} occurs twice; TREC runs need unique query ids")
        run[str(qid)] = [
            (p["id"], float(p["score"])) if isinstance(p, dict) else (str(p[0]), float(p[1])) for p in ranking
        ]
    return run


def hits(results: Sequence[dict]) -> list[list[bool]]:
    """Per-question ``has_answer`` flags of DPR results records, for ``fastdpr.eval.topk_accuracy`` (stored flags;
    missing ones computed: :func:`fastdpr.eval.result_hits`)."""
    from fastdpr.eval.retrieval import result_hits

    return result_hits(results)


EXTENSIONS = {".json": "dpr", ".trec": "trec", ".run": "trec", ".txt": "trec", ".tsv": "trec"}
_NEEDS_TEXT = ("dpr", "pyserini")  # formats that store passage texts
_NEEDS_ANSWERS = ("dpr", "pyserini", "compact")  # formats that store has_answer


def run_format(path, fmt: str = "auto") -> str:
    """One of :data:`fastdpr.data.runs.RUN_FORMATS`: given, or from the output file's extension (``.json``: DPR
    results; ``.trec``, ``.run``, ``.txt``, ``.tsv``: TREC)."""
    from fastdpr.errors import InputError

    if fmt != "auto":
        if fmt not in RUN_FORMATS:
            raise InputError(f"run format must be one of {', '.join(RUN_FORMATS)}; got {fmt!r}")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        raise InputError(f"cannot tell the run format from the extension {suffix!r}: use .json (DPR results) or "
                         f".trec, or pass --format ({', '.join(RUN_FORMATS)})", path=str(path))
    return EXTENSIONS[suffix]


def search_to_run(retriever, qa: Sequence[dict], path, k: int, *, fmt: str = "auto", match: str = "string",
                  tag: str = "fastdpr", chunk_size: int = 1024, show_progress: bool = False) -> int:
    """Retrieve top-``k`` for QA records ``{qid, question, answers}`` and write the run, atomically, in ``fmt``
    (or by the file extension): the DPR and pyserini formats carry passage texts and ``has_answer``, the compact
    run ``has_answer``, TREC and BEIR ids and scores only. Questions go through the retriever ``chunk_size`` at a
    time and records are streamed out, so passage texts of only one chunk are held. Returns the number of
    questions written.

    Example: ``search_to_run(SparseRetriever(bm25, corpus), list(iter_qa("test.qa.csv")), "run.json", 100)``"""
    from fastdpr.progress import progress

    from fastdpr.data.runs import write_run

    fmt = run_format(path, fmt)
    if fmt not in _NEEDS_TEXT + _NEEDS_ANSWERS and len({q["qid"] for q in qa}) != len(qa):
        raise ValueError("query ids repeat in the QA file; TREC and BEIR runs need unique query ids")
    bar = progress(total=len(qa), desc="search", unit="q", enabled=show_progress)

    def records():
        for start in range(0, len(qa), chunk_size):
            part = qa[start : start + chunk_size]
            questions = [q["question"] for q in part]
            if fmt in _NEEDS_TEXT:
                results = dpr_results(questions, [q.get("answers") or [] for q in part],
                                      retriever.retrieve(questions, k), match=match, qids=[q["qid"] for q in part])
            elif fmt in _NEEDS_ANSWERS:
                results = _ranked_with_hits(retriever, part, k, match)
            else:
                results = [{"qid": q["qid"], "question": q["question"], "answers": q.get("answers") or [],
                            "ctxs": [{"id": pid, "score": s} for pid, s in ranking]}
                           for q, ranking in zip(part, retriever.ranked_ids(questions, k))]
            yield from results
            bar.update(len(part))

    try:
        return write_run(path, records(), fmt, tag=tag)
    finally:
        bar.close()


def _ranked_with_hits(retriever, part: Sequence[dict], k: int, match: str) -> list[dict]:
    """Results with ids, scores and ``has_answer`` but no texts: rows from the search, ids and texts read once."""
    from fastdpr.eval.retrieval import ranking_hits
    from fastdpr.retrieve.base import ranked_from_rows

    answers = [q.get("answers") or [] for q in part]
    scores, rows = retriever.search([q["question"] for q in part], k)
    flags = ranking_hits(rows, answers, retriever.corpus, mode=match)
    return [{"qid": q["qid"], "question": q["question"], "answers": a,
             "ctxs": [{"id": pid, "score": s, "has_answer": h} for (pid, s), h in zip(ranking, f)]}
            for q, a, ranking, f in zip(part, answers, ranked_from_rows(retriever.corpus, scores, rows), flags)]
