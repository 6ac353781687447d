"""Retrieval runs: DPR retriever-results JSON and TREC run files.

DPR results are a JSON array of ``{"question", "answers", "ctxs": [{"id", "title", "text", "score",
"has_answer"}]}``; a TREC run has lines ``qid Q0 docid rank score tag``. :func:`read_run` reads either into the
DPR shape, each result also carrying a ``"qid"`` (a TREC run has no question text or answers: those are None,
and its ctxs hold only ``id`` and ``score``).

Example::

    write_trec("run.trec", {"q1": [("d7", 12.5), ("d3", 11.0)]}, tag="bm25")
    results = read_run("run.trec")          # [{"qid": "q1", "ctxs": [{"id": "d7", "score": 12.5}, ...], ...}]
"""
from __future__ import annotations

import json
import math
import os
from typing import Iterable, Iterator

from fastdpr.data._io import BadRows, ReadStats, clean_id, first_char, numbered_lines, open_binary, open_output
from fastdpr.data._jsonstream import iter_json_array
from fastdpr.errors import InputError


def _number(x) -> float:
    # numpy scalars and tensors' .item() values become plain floats that JSON can hold
    return float(x)


def write_dpr_results(path: str | os.PathLike, results: Iterable[dict]) -> int:
    """Write retrieval results in DPR's retriever-results JSON, streaming, atomically. Each result is
    ``{"question", "answers", "ctxs": [{"id", "title", "text", "score", "has_answer"}]}`` (``qid`` kept when
    given). Returns the number of questions written."""
    n = 0
    with open_output(path) as fh:
        fh.write("[")
        for res in results:
            ctxs = []
            for c in res.get("ctxs") or []:
                ctx = {"id": str(c["id"]), "title": c.get("title") or "", "text": c.get("text") or "",
                       "score": _number(c["score"])}
                if c.get("has_answer") is not None:
                    ctx["has_answer"] = bool(c["has_answer"])
                ctxs.append(ctx)
            out = {"question": res.get("question") or "", "answers": list(res.get("answers") or []), "ctxs": ctxs}
            if res.get("qid") is not None:
                out = {"qid": str(res["qid"]), **out}
            fh.write(("\n" if n == 0 else ",\n") + json.dumps(out, ensure_ascii=False))
            n += 1
        fh.write("\n]\n")
    return n


def _result(obj, position: int) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    ctxs_in = obj.get("ctxs")
    if not isinstance(ctxs_in, list):
        raise ValueError("missing 'ctxs' list")
    ctxs = []
    for i, c in enumerate(ctxs_in):
        if not isinstance(c, dict) or "id" not in c:
            raise ValueError(f"ctxs[{i}] has no 'id'")
        score = c.get("score")
        try:
            score = None if score is None else float(score)
        except (TypeError, ValueError):
            raise ValueError(f"ctxs[{i}] score {score!r} is not a number") from None
        ha = c.get("has_answer")
        ctxs.append({"id": clean_id(c["id"]), "title": c.get("title") or "", "text": c.get("text") or "",
                     "score": score, "has_answer": None if ha is None else bool(ha)})
    answers = obj.get("answers")
    qid = obj.get("qid", obj.get("id"))
    return {"qid": str(position) if qid is None else str(qid), "question": obj.get("question"),
            "answers": None if answers is None else list(answers), "ctxs": ctxs}


def read_dpr_results(path: str | os.PathLike, skip_bad: bool = False,
                     stats: ReadStats | None = None) -> Iterator[dict]:
    """Stream a DPR retriever-results JSON array. ``qid`` is the file's, else the 0-based position."""
    path = str(path)
    bad = BadRows(path, skip_bad, stats)
    with open_binary(path) as fh:
        for position, (lineno, obj) in enumerate(iter_json_array(fh, path)):
            try:
                res = _result(obj, position)
            except ValueError as exc:
                bad(str(exc), lineno)
                continue
            bad.stats.rows += 1
            yield res
    bad.finish()


def write_trec(path: str | os.PathLike, run: dict, tag: str = "fastdpr") -> int:
    """Write ``{qid: [(docid, score), ...]}`` as a TREC run, atomically. Each list is written best score first
    (stable, so ties keep the given order), with ranks 1..n. Returns the number of lines."""
    if not tag or any(c.isspace() for c in tag):
        raise ValueError(f"TREC run tag must be one word, got {tag!r}")
    n = 0
    with open_output(path) as fh:
        for qid, docs in run.items():
            qid = str(qid)
            if not qid or any(c.isspace() for c in qid):
                raise InputError(f"query id {qid!r} cannot be written to a TREC run (empty or has spaces)")
            ranked = sorted(((str(d), _number(s)) for d, s in docs), key=lambda x: -x[1])
            for rank, (docid, score) in enumerate(ranked, 1):
                if not docid or any(c.isspace() for c in docid):
                    raise InputError(f"doc id {docid!r} cannot be written to a TREC run (empty or has spaces)")
                if math.isnan(score):
                    raise InputError(f"score of {docid!r} for query {qid!r} is NaN")
                fh.write(f"{qid} Q0 {docid} {rank} {score!r} {tag}\n")
                n += 1
    return n


def read_trec(path: str | os.PathLike, skip_bad: bool = False, stats: ReadStats | None = None) -> dict:
    """A TREC run as ``{qid: [(docid, score), ...]}``, each list best score first (ties by rank). Queries keep the
    order of their first line."""
    path = str(path)
    bad = BadRows(path, skip_bad, stats)
    rows: dict[str, list[tuple[float, int, str]]] = {}
    with open_binary(path) as fh:
        for lineno, line in numbered_lines(fh, bad):
            fields = line.split()
            if len(fields) != 6:
                bad(f"{len(fields)} fields, expected 'qid Q0 docid rank score tag'", lineno)
                continue
            qid, _, docid, rank, score, _ = fields
            try:
                rank_i, score_f = int(rank), float(score)
            except ValueError:
                bad(f"rank {rank!r} / score {score!r} are not numbers", lineno)
                continue
            if math.isnan(score_f):
                bad("score is NaN", lineno)
                continue
            rows.setdefault(qid, []).append((score_f, rank_i, clean_id(docid)))
            bad.stats.rows += 1
    bad.finish()
    return {qid: [(d, s) for s, _, d in sorted(v, key=lambda x: (-x[0], x[1]))] for qid, v in rows.items()}


def detect_run_format(path: str | os.PathLike) -> str:
    """``"dpr"`` for a JSON array, else ``"trec"``."""
    return "dpr" if first_char(path) == "[" else "trec"


def read_run(path: str | os.PathLike, skip_bad: bool = False) -> list[dict]:
    """Read a DPR results JSON or a TREC run into a list of DPR-shaped results with ``qid``.

    >>> read_run("run.trec")[0]  # doctest: +SKIP
    {'qid': 'q1', 'question': None, 'answers': None, 'ctxs': [{'id': 'd7', 'score': 12.5}, ...]}
    """
    if detect_run_format(path) == "dpr":
        return list(read_dpr_results(path, skip_bad=skip_bad))
    run = read_trec(path, skip_bad=skip_bad)
    return [{"qid": qid, "question": None, "answers": None,
             "ctxs": [{"id": d, "score": s} for d, s in docs]} for qid, docs in run.items()]


def results_to_run(results: Iterable[dict]) -> dict:
    """``{qid: [(docid, score), ...]}`` from DPR-shaped results (qid = position where missing)."""
    run = {}
    for i, res in enumerate(results):
        qid = str(res.get("qid", i)) if res.get("qid") is not None else str(i)
        # a ctx without a score keeps its place through a rank-derived score (-1, -2, ...)
        run[qid] = [(str(c["id"]), float(c["score"]) if c.get("score") is not None else -float(rank))
                    for rank, c in enumerate(res.get("ctxs") or [], 1)]
    return run
