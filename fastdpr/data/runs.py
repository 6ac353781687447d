"""Retrieval runs in the formats the field uses, read into one shape and written back out.

- ``dpr``: DPR's retriever-results JSON, an array of ``{"question", "answers", "ctxs": [{"id", "title", "text",
  "score", "has_answer"}]}`` (DPR writes scores as strings; both are read).
- ``pyserini``: pyserini's DPR run, ``{qid: {"question"?, "answers", "contexts": [{"docid", "score"?, "text"?,
  "has_answer"}]}}``, ``text`` being ``"title\\ntext"`` as pyserini stores it. This is the shape pyserini's
  ``evaluate_dpr_retrieval`` reads, so a run written here is scored by pyserini as it is by fastdpr.
- ``trec``: lines ``qid Q0 docid rank score tag``.
- ``beir``: BEIR's results JSON, ``{qid: {docid: score}}``.
- ``compact``: ``{qid: [[docid, score, has_answer], ...]}`` in rank order (the quickstart's ``runs/*.json``).

:func:`read_run` tells them apart by content (not by file name) and gives a list of results ``{"qid", "question",
"answers", "ctxs": [{"id", "title", "text", "score", "has_answer"}]}``; what a format does not carry is None
(a TREC run has no question text, answers or passage texts). :func:`write_run` writes any of them.

Example::

    write_trec("run.trec", {"q1": [("d7", 12.5), ("d3", 11.0)]}, tag="bm25")
    results = read_run("run.trec")          # [{"qid": "q1", "ctxs": [{"id": "d7", "score": 12.5, ...}, ...], ...}]
    write_run("run.pyserini.json", results, "pyserini")
"""
from __future__ import annotations

import json
import math
import os
from typing import Iterable, Iterator

from fastdpr.data._io import (
    BadRows,
    ReadStats,
    clean_id,
    first_char,
    numbered_lines,
    open_binary,
    open_output,
    peek,
)
from fastdpr.data._jsonstream import iter_json_array
from fastdpr.errors import InputError


def _number(x) -> float | None:
    # numpy scalars and tensors' .item() values become plain floats that JSON can hold
    return None if x is None else float(x)


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
                       "score": _number(c.get("score"))}
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


RUN_FORMATS = ("dpr", "pyserini", "trec", "beir", "compact")
_DESCRIBED = {
    "dpr": "DPR retriever results (a JSON array of {question, answers, ctxs})",
    "pyserini": "pyserini DPR run (a JSON object {qid: {answers, contexts: [{docid, ...}]}})",
    "beir": "BEIR results (a JSON object {qid: {docid: score}})",
    "compact": "compact run (a JSON object {qid: [[docid, score, has_answer], ...]})",
    "trec": "TREC run (lines 'qid Q0 docid rank score tag')",
}


def _not_a_run(path, why: str) -> InputError:
    tried = "; ".join(_DESCRIBED[f] for f in RUN_FORMATS)
    return InputError(f"not a run in any format fastdpr reads ({why}); tried: {tried}", str(path))


def _object_format(value) -> str | None:
    """The format of a JSON-object run, from one of its values."""
    if isinstance(value, dict):
        if "contexts" in value or "answers" in value:
            return "pyserini"
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            return "beir"
    if isinstance(value, list) and all(isinstance(x, list) and 2 <= len(x) <= 3 for x in value):
        return "compact"
    return None


def _load_object(path) -> dict:
    with open_binary(path) as fh:
        raw = fh.read()
    try:
        obj = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_a_run(path, f"starts with '{{' but is not one JSON object: {exc}") from None
    if not isinstance(obj, dict):
        raise _not_a_run(path, f"a JSON {type(obj).__name__}")
    return obj


def detect_run_format(path: str | os.PathLike) -> str:
    """The run format of ``path`` (one of :data:`RUN_FORMATS`), from its content. A file that fits none raises
    :class:`InputError` naming the formats tried."""
    c = first_char(path)
    if c == "[":
        return "dpr"
    if c == "{":
        obj = _load_object(path)
        fmt = next((f for f in map(_object_format, obj.values()) if f is not None), None) if obj else "compact"
        if fmt is None:
            raise _not_a_run(path, "a JSON object whose values are none of the shapes below")
        return fmt
    head = peek(path).decode("utf-8", errors="replace").splitlines()
    line = next((x for x in head if x.strip()), "")
    fields = line.split()
    if len(fields) == 6:
        try:
            int(fields[3]), float(fields[4])
            return "trec"
        except ValueError:
            pass
    shown = f"first line {line[:60]!r}" if line else "empty file"
    raise _not_a_run(path, shown)


def _ctx(docid, score=None, has_answer=None, title=None, text=None) -> dict:
    try:
        score = None if score is None else float(score)
    except (TypeError, ValueError):
        raise ValueError(f"score {score!r} of passage {docid!r} is not a number") from None
    return {"id": clean_id(docid), "title": title, "text": text, "score": score,
            "has_answer": None if has_answer is None else bool(has_answer)}


def _pyserini_ctx(c) -> dict:
    if not isinstance(c, dict) or "docid" not in c:
        raise ValueError("a context without 'docid'")
    title = text = None
    if c.get("text") is not None:
        # pyserini stores "title\ntext" (its evaluator reads the line after the title)
        title, sep, text = str(c["text"]).partition("\n")
        title, text = (title, text) if sep else ("", title)
    return _ctx(c["docid"], c.get("score"), c.get("has_answer"), title, text)


def _from_object(obj: dict, fmt: str, path) -> list[dict]:
    out = []
    for qid, value in obj.items():
        try:
            if fmt == "pyserini":
                if not isinstance(value, dict) or not isinstance(value.get("contexts", []), list):
                    raise ValueError("expected {answers, contexts: [...]}")
                answers = value.get("answers")
                if isinstance(answers, str):
                    answers = [answers]
                ctxs = [_pyserini_ctx(c) for c in value.get("contexts", [])]
                out.append({"qid": str(qid), "question": value.get("question"),
                            "answers": None if answers is None else list(answers), "ctxs": ctxs})
                continue
            if fmt == "beir":
                if not isinstance(value, dict):
                    raise ValueError("expected {docid: score}")
                ranked = sorted(value.items(), key=lambda x: -float(x[1]))  # stable: ties keep file order
                ctxs = [_ctx(d, s) for d, s in ranked]
            else:
                if not isinstance(value, list) or not all(isinstance(x, list) and 2 <= len(x) <= 3 for x in value):
                    raise ValueError("expected [[docid, score, has_answer], ...]")
                ctxs = [_ctx(x[0], x[1], x[2] if len(x) == 3 else None) for x in value]
        except ValueError as exc:
            raise InputError(f"query {qid!r}: {exc} ({_DESCRIBED[fmt]})", str(path)) from None
        out.append({"qid": str(qid), "question": None, "answers": None, "ctxs": ctxs})
    return out


def read_run(path: str | os.PathLike, skip_bad: bool = False, fmt: str = "auto") -> list[dict]:
    """Read a run in any of :data:`RUN_FORMATS` (detected from the content with ``fmt="auto"``) into a list of
    DPR-shaped results with ``qid``; fields the format lacks are None.

    >>> read_run("run.trec")[0]  # doctest: +SKIP
    {'qid': 'q1', 'question': None, 'answers': None, 'ctxs': [{'id': 'd7', 'score': 12.5, ...}, ...]}
    """
    if fmt == "auto":
        fmt = detect_run_format(path)
    if fmt not in RUN_FORMATS:
        raise ValueError(f"run format must be one of {', '.join(RUN_FORMATS)}; got {fmt!r}")
    if fmt == "dpr":
        return list(read_dpr_results(path, skip_bad=skip_bad))
    if fmt == "trec":
        run = read_trec(path, skip_bad=skip_bad)
        return [{"qid": qid, "question": None, "answers": None,
                 "ctxs": [_ctx(d, s) for d, s in docs]} for qid, docs in run.items()]
    return _from_object(_load_object(path), fmt, path)


def _qid(res: dict, position: int) -> str:
    return str(res["qid"]) if res.get("qid") is not None else str(position)


def write_pyserini_run(path: str | os.PathLike, results: Iterable[dict]) -> int:
    """Write results as pyserini's DPR run JSON, streaming, atomically: ``{qid: {"question", "answers",
    "contexts": [{"docid", "score", "text": "title\\ntext", "has_answer"}]}}`` (qid = position where missing).
    Returns the number of questions."""
    n = 0
    seen: set[str] = set()
    with open_output(path) as fh:
        fh.write("{")
        for position, res in enumerate(results):
            qid = _qid(res, position)
            if qid in seen:
                raise InputError(f"query id {qid!r} occurs twice; a pyserini run is keyed by query id")
            seen.add(qid)
            contexts = []
            for c in res.get("ctxs") or []:
                ctx = {"docid": str(c["id"])}
                if c.get("score") is not None:
                    ctx["score"] = _number(c["score"])
                if c.get("text") is not None:
                    ctx["text"] = f"{c.get('title') or ''}\n{c['text']}"
                if c.get("has_answer") is not None:
                    ctx["has_answer"] = bool(c["has_answer"])
                contexts.append(ctx)
            value = {"question": res.get("question") or "", "answers": list(res.get("answers") or []),
                     "contexts": contexts}
            fh.write(("\n" if n == 0 else ",\n") + json.dumps(qid) + ": " + json.dumps(value, ensure_ascii=False))
            n += 1
        fh.write("\n}\n")
    return n


def write_run(path: str | os.PathLike, results: Iterable[dict], fmt: str, tag: str = "fastdpr") -> int:
    """Write DPR-shaped results (``{"qid"?, "question", "answers", "ctxs": [...]}``) in run format ``fmt``
    (one of :data:`RUN_FORMATS`), atomically. Returns the number of questions."""
    from fastdpr.atomic import write_json

    if fmt == "dpr":
        return write_dpr_results(path, results)
    if fmt == "pyserini":
        return write_pyserini_run(path, results)
    if fmt not in RUN_FORMATS:
        raise ValueError(f"run format must be one of {', '.join(RUN_FORMATS)}; got {fmt!r}")
    results = list(results)
    if fmt == "compact":
        run = {}
        for position, res in enumerate(results):
            run[_qid(res, position)] = [[str(c["id"]), _number(c["score"])]
                                        + ([bool(c["has_answer"])] if c.get("has_answer") is not None else [])
                                        for c in res.get("ctxs") or []]
        write_json(path, run, indent=None)
        return len(run)
    run = results_to_run(results)
    if len(run) != len(results):
        raise InputError(f"query ids repeat; a {fmt} run is keyed by query id")
    if fmt == "trec":
        write_trec(path, run, tag=tag)
    else:
        beir: dict[str, dict[str, float]] = {}
        for qid, docs in run.items():
            scored = beir[qid] = {}
            for docid, score in docs:
                scored.setdefault(docid, score)  # a passage listed twice keeps its first, best score
        write_json(path, beir, indent=None)
    return len(run)


def results_to_run(results: Iterable[dict]) -> dict:
    """``{qid: [(docid, score), ...]}`` from DPR-shaped results (qid = position where missing)."""
    run = {}
    for i, res in enumerate(results):
        qid = str(res.get("qid", i)) if res.get("qid") is not None else str(i)
        # a ctx without a score keeps its place through a rank-derived score (-1, -2, ...)
        run[qid] = [(str(c["id"]), float(c["score"]) if c.get("score") is not None else -float(rank))
                    for rank, c in enumerate(res.get("ctxs") or [], 1)]
    return run


def attach_answers(results: list[dict], questions) -> None:
    """Give each result its question's text and answers, in place, from QA records ``{qid, question, answers}``
    (or a QA file's path), matched by qid -- or by position when the run's ids are not the file's (DPR results
    carry no ids) and both hold the same number of questions. A question text that disagrees with the run's is
    an :class:`InputError`: the two do not belong together."""
    from fastdpr.data.qa import iter_qa

    source = str(questions) if isinstance(questions, (str, os.PathLike)) else None
    questions = list(iter_qa(questions)) if source is not None else list(questions)
    by_qid = {q["qid"]: q for q in questions}
    if all(res["qid"] in by_qid for res in results):
        matched = [by_qid[res["qid"]] for res in results]
    elif len(questions) == len(results):
        matched = questions
    else:
        missing = next(res["qid"] for res in results if res["qid"] not in by_qid)
        raise InputError(f"query id {missing!r} of the run is not in the QA file, and the two hold different "
                         f"numbers of questions ({len(results)} vs {len(questions)})", source)
    for res, q in zip(results, matched):
        if res.get("question") and " ".join(res["question"].split()) != " ".join(q["question"].split()):
            raise InputError(f"question {res['qid']!r} differs between the run ({res['question'][:50]!r}) and "
                             f"the QA file ({q['question'][:50]!r})", source)
        res["question"] = q["question"]
        res["answers"] = q["answers"]


def attach_texts(results: list[dict], corpus) -> None:
    """Fill, in place, the title and text of ctxs that lack a text (TREC, BEIR and compact runs) from a corpus
    (a :class:`~fastdpr.data.Corpus` or a passage file's path). A passage the corpus lacks is an
    :class:`InputError`."""
    from fastdpr.data.corpus import Corpus

    source = str(corpus) if isinstance(corpus, (str, os.PathLike)) else None
    if source is not None:
        corpus = Corpus.open(source)
    for res in results:
        for c in res["ctxs"]:
            if not c.get("text"):
                p = corpus.get(c["id"], None)
                if p is None:
                    raise InputError(f"passage {c['id']!r} of query {res['qid']!r} is not in the corpus", source)
                c["title"], c["text"] = p.get("title", ""), p["text"]
