"""Reading DPR retriever-results JSON for the reader: ``[{"question", "answers", "ctxs": [{id, title, text, ...}]}]``."""
from __future__ import annotations

import json
import os

from fastdpr.errors import InputError


def load_retriever_results(path: str | os.PathLike) -> list[dict]:
    """Load and check a DPR retriever-results file (the output of ``fastdpr search``)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError as err:
        raise InputError("file not found", path=str(path)) from err
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON: {err.msg}", path=str(path), line=err.lineno) from err
    if not isinstance(data, list):
        raise InputError("expected a JSON list of {question, answers, ctxs} records", path=str(path))
    for i, record in enumerate(data):
        if not isinstance(record, dict) or "question" not in record or not isinstance(record.get("ctxs"), list):
            raise InputError(f"record {i} lacks 'question' or a 'ctxs' list", path=str(path))
        if not isinstance(record.get("answers", []), list):
            raise InputError(f"record {i}: 'answers' must be a list", path=str(path))
        for j, ctx in enumerate(record["ctxs"]):
            if not isinstance(ctx, dict) or "text" not in ctx:
                raise InputError(f"record {i} ctx {j} has no 'text'", path=str(path))
    return data
