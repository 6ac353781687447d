"""Retrieval results as run files: DPR retriever-results records (with ``has_answer``) and TREC runs."""
from __future__ import annotations

from typing import Sequence


def dpr_results(questions: Sequence[str], answers: Sequence[Sequence[str]], retrieved: Sequence[list[dict]],
                *, match: str = "string", qids: Sequence[str] | None = None) -> list[dict]:
    """DPR retriever-results records ``{question, answers, ctxs: [{id, title, text, score, has_answer}]}``
    (with ``qid`` first when ``qids`` are given).

    ``has_answer`` follows DPR's rule on the passage text (``match="regex"`` for CuratedTREC).

    Example: ``write_dpr_results("run.json", dpr_results(qs, answers, retriever.retrieve(qs, 100)))``"""
    from fastdpr.text.answers import has_answer

    if not (len(questions) == len(answers) == len(retrieved)):
        raise ValueError(f"{len(questions)} questions, {len(answers)} answer lists, {len(retrieved)} results")
    if qids is not None and len(qids) != len(questions):
        raise ValueError(f"{len(qids)} query ids for {len(questions)} questions")
    out = []
    for i, (question, ans, passages) in enumerate(zip(questions, answers, retrieved)):
        ans = [ans] if isinstance(ans, str) else list(ans)
        ctxs = [
            {"id": p["id"], "title": p.get("title", ""), "text": p.get("text", ""), "score": float(p["score"]),
             "has_answer": bool(has_answer(p.get("text", ""), ans, mode=match))}
            for p in passages
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
    """Per-question ``has_answer`` flags of DPR results records, for ``fastdpr.eval.topk_accuracy``."""
    return [[bool(c["has_answer"]) for c in r["ctxs"]] for r in results]


RUN_FORMATS = {".json": "dpr", ".trec": "trec", ".run": "trec", ".txt": "trec", ".tsv": "trec"}


def run_format(path, fmt: str = "auto") -> str:
    """``"dpr"`` or ``"trec"``: given, or from the output file's extension."""
    from pathlib import Path

    from fastdpr.errors import InputError

    if fmt != "auto":
        if fmt not in ("dpr", "trec"):
            raise InputError(f"run format must be 'dpr' or 'trec', got {fmt!r}")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in RUN_FORMATS:
        raise InputError(f"cannot tell the run format from the extension {suffix!r}: use .json (DPR results) or "
                         ".trec, or pass --format", path=str(path))
    return RUN_FORMATS[suffix]


def search_to_run(retriever, qa: Sequence[dict], path, k: int, *, fmt: str = "auto", match: str = "string",
                  tag: str = "fastdpr", chunk_size: int = 1024, show_progress: bool = False) -> int:
    """Retrieve top-``k`` for QA records ``{qid, question, answers}`` and write the run, atomically: DPR results
    JSON (with ``has_answer``) or TREC, by ``fmt`` or the file extension. Questions go through the retriever
    ``chunk_size`` at a time and DPR records are streamed out, so passage texts of only one chunk are held.
    Returns the number of questions written.

    Example: ``search_to_run(SparseRetriever(bm25, corpus), list(iter_qa("test.qa.csv")), "run.json", 100)``"""
    from tqdm.auto import tqdm

    from fastdpr.data import write_dpr_results, write_trec

    fmt = run_format(path, fmt)
    bar = tqdm(total=len(qa), desc="search", unit="q", disable=not show_progress, mininterval=1.0)

    def chunks():
        for start in range(0, len(qa), chunk_size):
            part = qa[start : start + chunk_size]
            questions = [q["question"] for q in part]
            if fmt == "trec":
                yield part, retriever.ranked_ids(questions, k)
            else:
                yield part, retriever.retrieve(questions, k)
            bar.update(len(part))

    try:
        if fmt == "trec":
            run = {}
            for part, ranked in chunks():
                run.update(trec_run([q["qid"] for q in part], ranked))
            if len(run) != len(qa):
                raise ValueError("query ids repeat in the QA file; TREC runs need unique query ids")
            write_trec(path, run, tag=tag)
            return len(qa)

        def records():
            for part, retrieved in chunks():
                yield from dpr_results([q["question"] for q in part], [q.get("answers") or [] for q in part],
                                       retrieved, match=match, qids=[q["qid"] for q in part])

        return write_dpr_results(path, records())
    finally:
        bar.close()
