"""Training files: DPR biencoder JSON (one big array) and Tevatron JSONL, read as one record shape.

A record is ``{"question": str, "answers": [str], "positive_ctxs": [ctx], "negative_ctxs": [ctx],
"hard_negative_ctxs": [ctx]}`` (plus ``"qid"`` when the file has one); a ctx is ``{"title", "text",
"passage_id"}`` with ``passage_id`` a string without DPR's ``wiki:`` prefix, or None when the file gives none.

Example::

    from fastdpr.data import read_training, write_tevatron
    write_tevatron("train.tevatron.jsonl", read_training("nq-train.json"))
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

from fastdpr.data._io import BadRows, ReadStats, clean_id, first_char, numbered_lines, open_binary, open_output
from fastdpr.data._jsonstream import iter_json_array, parse_json_object
from fastdpr.errors import InputError

_CTX_ID_KEYS = ("passage_id", "psg_id", "docid", "id", "_id")


def _ctx(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a passage must be an object, got {type(obj).__name__}")
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: missing or empty 'text'")
    title = obj.get("title") or ""
    if not isinstance(title, str):
        raise ValueError(f"{where}: 'title' must be a string")
    pid = next((obj[k] for k in _CTX_ID_KEYS if obj.get(k) not in (None, "")), None)
    return {"title": title, "text": text, "passage_id": None if pid is None else clean_id(pid)}


def _ctx_list(obj: dict, key: str) -> list[dict]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"'{key}' must be a list")
    return [_ctx(c, f"{key}[{i}]") for i, c in enumerate(value)]


def _answers(obj: dict) -> list[str]:
    answers = obj.get("answers", [])
    if answers is None:
        return []
    if isinstance(answers, str):
        return [answers]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ValueError("'answers' must be a list of strings")
    return answers


def normalize_training_record(obj) -> dict:
    """One DPR or Tevatron record in the common shape; ``ValueError`` says what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "positive_passages" in obj or ("query" in obj and "question" not in obj):  # Tevatron
        query = obj.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("missing or empty 'query'")
        rec = {
            "question": query,
            "answers": _answers(obj),
            "positive_ctxs": _ctx_list(obj, "positive_passages"),
            "negative_ctxs": [],
            "hard_negative_ctxs": _ctx_list(obj, "negative_passages"),
        }
        qid = obj.get("query_id")
    else:
        question = obj.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("missing or empty 'question'")
        rec = {
            "question": question,
            "answers": _answers(obj),
            "positive_ctxs": _ctx_list(obj, "positive_ctxs"),
            "negative_ctxs": _ctx_list(obj, "negative_ctxs"),
            "hard_negative_ctxs": _ctx_list(obj, "hard_negative_ctxs"),
        }
        qid = obj.get("qid", obj.get("id"))
    if qid is not None:
        rec["qid"] = str(qid)
    return rec


def read_training(
    path: str | os.PathLike, skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[dict]:
    """Stream training records from a DPR biencoder JSON array or a JSONL file of DPR or Tevatron records.

    The JSON array is parsed one element at a time (memory = one record, not the file). Bad records raise
    :class:`~fastdpr.errors.InputError` naming ``file:line`` (the line where the record starts); with
    ``skip_bad=True`` they are skipped, warned about and counted. Malformed JSON syntax always raises: past it the
    array cannot be followed.

    >>> rec = next(read_training("nq-train.json"))  # doctest: +SKIP
    >>> rec["question"], rec["positive_ctxs"][0]["passage_id"]  # doctest: +SKIP
    """
    path = str(path)
    bad = BadRows(path, skip_bad, stats)
    with open_binary(path) as fh:
        if first_char(path) == "[":
            yield from bad.parsed(iter_json_array(fh, path), normalize_training_record)
        else:
            yield from bad.parsed(numbered_lines(fh, bad), _jsonl_record)


def _jsonl_record(line: str) -> dict:
    return normalize_training_record(parse_json_object(line))


def _dpr_ctx(c: dict) -> dict:
    out = {"title": c.get("title") or "", "text": c["text"]}
    pid = c.get("passage_id", c.get("id"))
    if pid is not None:
        out["passage_id"] = str(pid)
    return out


def write_dpr_biencoder(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write records as a DPR biencoder JSON array, streaming (records may be a generator), atomically.
    Returns the number written."""
    n = 0
    with open_output(path) as fh:
        fh.write("[")
        for rec in records:
            out = {
                "question": rec["question"],
                "answers": list(rec.get("answers") or []),
                "positive_ctxs": [_dpr_ctx(c) for c in rec.get("positive_ctxs") or []],
                "negative_ctxs": [_dpr_ctx(c) for c in rec.get("negative_ctxs") or []],
                "hard_negative_ctxs": [_dpr_ctx(c) for c in rec.get("hard_negative_ctxs") or []],
            }
            if rec.get("qid") is not None:
                out["qid"] = str(rec["qid"])
            fh.write(("\n" if n == 0 else ",\n") + json.dumps(out, ensure_ascii=False))
            n += 1
        fh.write("\n]\n")
    return n


def _tevatron_passage(c: dict) -> dict:
    pid = c.get("passage_id", c.get("id"))
    return {"docid": "" if pid is None else str(pid), "title": c.get("title") or "", "text": c["text"]}


def write_tevatron(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write records as Tevatron JSONL (``query_id, query, positive_passages, negative_passages``), atomically.

    Tevatron has one negative list: it gets the hard negatives (DPR's random ``negative_ctxs`` are not written).
    The answers ride along as an extra ``answers`` field, which Tevatron ignores. Returns the number written."""
    n = 0
    with open_output(path) as fh:
        for i, rec in enumerate(records):
            if not rec.get("question"):
                raise InputError(f"training record {i} has no question")
            out = {
                "query_id": str(rec.get("qid", i)),
                "query": rec["question"],
                "answers": list(rec.get("answers") or []),
                "positive_passages": [_tevatron_passage(c) for c in rec.get("positive_ctxs") or []],
                "negative_passages": [_tevatron_passage(c) for c in rec.get("hard_negative_ctxs") or []],
            }
            fh.write(json.dumps(out, ensure_ascii=False) + "\n")
            n += 1
    return n
