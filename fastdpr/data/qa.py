"""Question files and relevance judgements.

- DPR QA CSV/TSV: ``question \\t ["answer", ...]`` (an optional third column is the question id). The answer list
  is a Python/JSON literal parsed with :func:`ast.literal_eval` -- never ``eval``. Fields may be CSV-quoted.
- QA JSONL: ``{"question", "answers"}`` (also ``answer``, ``query``, ``qid``/``id``), e.g. Pyserini's DPR topics.
- BEIR ``queries.jsonl`` (``{"_id", "text"}``) and ``qrels/*.tsv`` (``query-id \\t corpus-id \\t score``); TREC
  qrels (``qid 0 docid rel``) too.

Each question is ``{"qid": str, "question": str, "answers": list[str]}``; without an id in the file the qid is the
question's 0-based position, so every reader and writer agrees on it.

Example::

    for q in iter_qa("nq-test.qa.csv"):
        q["qid"], q["question"], q["answers"]
"""
from __future__ import annotations

import ast
import csv
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from fastdpr.data._io import (
    BadRows,
    ReadStats,
    clean_id,
    numbered_lines,
    open_binary,
    open_output,
    output_format,
    resolve_directory,
    sniff_format,
    split_delimited,
)
from fastdpr.data._jsonstream import parse_json_object

QA_FORMATS = ("dpr", "jsonl")
_Q_KEYS = ("question", "query", "text")
_A_KEYS = ("answers", "answer")
_QID_KEYS = ("qid", "id", "_id", "query_id", "question_id")


def resolve_qa_path(path: str | os.PathLike) -> Path:
    """A BEIR dataset directory stands for its ``queries.jsonl``."""
    return resolve_directory(path, ("queries.jsonl", "queries.jsonl.gz"))


def detect_qa_format(path: str | os.PathLike) -> str:
    """``"dpr"`` (CSV/TSV) or ``"jsonl"``, as :func:`~fastdpr.data._io.sniff_format` decides."""
    return sniff_format(path, "dpr")


def parse_answers(field: str) -> list[str]:
    """The answer column of a DPR QA file: a list literal (``['a', "b"]``) or one quoted string, parsed with
    :func:`ast.literal_eval` (safe: literals only, nothing is executed)."""
    field = field.strip()
    try:
        value = ast.literal_eval(field)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(f"answers are not a list literal: {field[:60]!r}") from None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        return list(value)
    raise ValueError(f"answers must be a list of strings, got {field[:60]!r}")


def _answers_from_json(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and "text" in value:  # SQuAD-style {"text": [...], "answer_start": [...]}
        return _answers_from_json(value["text"])
    if isinstance(value, list):
        out = []
        for a in value:
            if isinstance(a, str):
                out.append(a)
            elif isinstance(a, dict) and isinstance(a.get("text"), str):
                out.append(a["text"])
            else:
                raise ValueError(f"answers must be strings, got {type(a).__name__}")
        return out
    raise ValueError(f"answers must be a list of strings, got {type(value).__name__}")


def iter_qa(
    path: str | os.PathLike, fmt: str = "auto", skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[dict]:
    """Stream questions from a DPR QA CSV/TSV, a QA JSONL or BEIR ``queries.jsonl`` (or a BEIR directory).

    Bad rows raise :class:`~fastdpr.errors.InputError` naming ``file:line``; ``skip_bad=True`` warns and counts.

    >>> next(iter_qa("nq-test.qa.csv"))  # doctest: +SKIP
    {'qid': '0', 'question': 'who got the first nobel prize in physics', 'answers': ['Wilhelm Conrad Röntgen']}
    """
    path = resolve_qa_path(path)
    fmt = detect_qa_format(path) if fmt == "auto" else fmt
    if fmt not in QA_FORMATS:
        raise ValueError(f"QA format must be one of {QA_FORMATS}, got {fmt!r}")
    bad = BadRows(path, skip_bad, stats)
    position = 0
    delimiter = None
    with open_binary(path) as fh:
        for lineno, line in numbered_lines(fh, bad):
            if fmt == "dpr" and delimiter is None:
                delimiter = "\t" if "\t" in line else ","
                if _is_qa_header(line, delimiter):
                    continue
            try:
                rec = _parse_dpr_qa(line, delimiter) if fmt == "dpr" else _parse_jsonl_qa(line)
            except ValueError as exc:
                bad(str(exc), lineno)
                position += 1
                continue
            if rec["qid"] is None:
                rec["qid"] = str(position)
            position += 1
            bad.stats.rows += 1
            yield rec
    bad.finish()


def _is_qa_header(line: str, delimiter: str) -> bool:
    fields = [f.strip().lower() for f in line.split(delimiter)]
    return len(fields) >= 2 and fields[0] in ("question", "query") and fields[1] in _A_KEYS


def _parse_dpr_qa(line: str, delimiter: str) -> dict:
    try:
        fields = split_delimited(line, delimiter)
    except (ValueError, csv.Error) as exc:
        raise ValueError(f"malformed quoting: {exc}") from None
    if len(fields) < 2:
        raise ValueError("missing the answers column (expected question<TAB>[answers])")
    if len(fields) > 3:
        raise ValueError(f"{len(fields)} columns, expected question<TAB>[answers] and an optional id")
    question = fields[0].strip()
    if not question:
        raise ValueError("empty question")
    qid = fields[2].strip() if len(fields) == 3 and fields[2].strip() else None
    return {"qid": qid, "question": question, "answers": parse_answers(fields[1])}


_GOLD_KEYS = ("gold_ids", "gold_passage_id", "gold_passage_ids", "positive_ctxs")


def _parse_jsonl_qa(line: str) -> dict:
    obj = parse_json_object(line)
    question = next((obj[k] for k in _Q_KEYS if isinstance(obj.get(k), str)), None)
    if question is None or not question.strip():
        raise ValueError("missing or empty field 'question'")
    answers = next((obj[k] for k in _A_KEYS if k in obj), None)
    qid = next((obj[k] for k in _QID_KEYS if obj.get(k) is not None), None)
    record = {
        "qid": None if qid is None else str(qid),
        "question": question.strip(),
        "answers": _answers_from_json(answers),
    }
    # gold-passage fields travel with the question: mining uses them as positives
    for key in _GOLD_KEYS:
        if obj.get(key) is not None:
            record[key] = obj[key]
    return record


def write_qa(path: str | os.PathLike, questions: Iterable[dict], fmt: str = "auto") -> int:
    """Write questions atomically as DPR TSV (``question \\t ["a", ...]`` plus the qid as a third column when it
    is not the row position) or as JSONL ``{"qid", "question", "answers"}``. Returns the number written."""
    fmt = output_format(path, fmt, QA_FORMATS, "QA")
    n = 0
    with open_output(path) as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        for i, q in enumerate(questions):
            question = " ".join(q["question"].split())
            answers = list(q.get("answers") or [])
            qid = q.get("qid")
            if fmt == "dpr":
                row = [question, json.dumps(answers, ensure_ascii=False)]
                if qid is not None and str(qid) != str(i):
                    row.append(str(qid))
                writer.writerow(row)
            else:
                rec = {"qid": str(i) if qid is None else str(qid), "question": question, "answers": answers}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_beir_queries(path: str | os.PathLike, questions: Iterable[dict]) -> int:
    """BEIR ``queries.jsonl``: ``{"_id", "text"}`` per line."""
    n = 0
    with open_output(path) as fh:
        for i, q in enumerate(questions):
            qid = q.get("qid")
            fh.write(json.dumps({"_id": str(i) if qid is None else str(qid), "text": q["question"]},
                                ensure_ascii=False) + "\n")
            n += 1
    return n


def read_qrels(path: str | os.PathLike, skip_bad: bool = False, stats: ReadStats | None = None) -> dict:
    """Relevance judgements ``{qid: {docid: grade}}`` from a BEIR qrels TSV (``query-id corpus-id score``, header
    optional) or a TREC qrels file (``qid 0 docid rel``). Doc ids lose a ``wiki:`` prefix like everywhere else."""
    path = Path(path)
    bad = BadRows(path, skip_bad, stats)
    qrels: dict[str, dict[str, int]] = {}
    first = True
    with open_binary(path) as fh:
        for lineno, line in numbered_lines(fh, bad):
            fields = line.split("\t") if "\t" in line else line.split()
            fields = [f.strip() for f in fields]
            is_first, first = first, False
            if len(fields) == 3:
                qid, docid, grade = fields
            elif len(fields) == 4:
                qid, _, docid, grade = fields
            else:
                bad(f"{len(fields)} columns, expected 'query-id corpus-id score' or 'qid 0 docid rel'", lineno)
                continue
            try:
                value = int(float(grade))
            except ValueError:
                if is_first:  # a header such as "query-id corpus-id score"
                    continue
                bad(f"relevance grade {grade!r} is not a number", lineno)
                continue
            if not qid or not docid:
                bad("empty query or document id", lineno)
                continue
            qrels.setdefault(qid, {})[clean_id(docid)] = value
            bad.stats.rows += 1
    bad.finish()
    return qrels


def write_qrels(path: str | os.PathLike, qrels: dict, fmt: str = "beir") -> None:
    """Write ``{qid: {docid: grade}}`` as BEIR TSV (with header) or TREC qrels, atomically."""
    if fmt not in ("beir", "trec"):
        raise ValueError(f"qrels format must be 'beir' or 'trec', got {fmt!r}")
    with open_output(path) as fh:
        if fmt == "beir":
            fh.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for docid, grade in docs.items():
                fh.write(f"{qid}\t{docid}\t{int(grade)}\n" if fmt == "beir" else f"{qid} 0 {docid} {int(grade)}\n")
