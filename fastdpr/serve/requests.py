"""What a request may hold, checked before anything is queued: every refusal is one line naming the field.

Status codes: 400 for a body that is not JSON, 413 for one over the size limit, 422 for JSON that is not a valid
request (wrong type, missing or unknown field, value out of range)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

MODES = ("dense", "sparse", "hybrid")
MODE_ALIASES = {"bm25": "sparse"}  # the name `fastdpr search --mode` uses


@dataclass(frozen=True)
class Limits:
    max_k: int = 1000
    max_questions: int = 256  # per request
    max_question_chars: int = 2000
    max_body_bytes: int = 1 << 20

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class RequestError(Exception):
    """A refused request: HTTP ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True)
class Search:
    questions: list[str]
    k: int
    mode: str


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise RequestError(400, f"the body is not valid JSON ({_one_line(err)})") from None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _object(payload: Any, allowed: set[str]) -> dict:
    if not isinstance(payload, dict):
        raise RequestError(422, f"the body must be a JSON object, got {_json_type(payload)}")
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(allowed))}")
    return payload


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def questions_of(payload: dict, limits: Limits) -> list[str]:
    """The questions of ``{"questions": [...]}`` or ``{"question": "..."}``, each checked."""
    if ("questions" in payload) == ("question" in payload):
        raise RequestError(422, 'give either "questions" (an array of strings) or "question" (a string)')
    if "question" in payload:
        items, where = [payload["question"]], "question"
        if not isinstance(items[0], str):
            raise RequestError(422, f'"question" must be a string, got {_json_type(items[0])}')
    else:
        items, where = payload["questions"], "questions"
        if not isinstance(items, list):
            raise RequestError(422, f'"questions" must be an array of strings, got {_json_type(items)}')
        if not items:
            raise RequestError(422, '"questions" is empty')
        if len(items) > limits.max_questions:
            raise RequestError(422, f'"questions" holds {len(items)} questions; at most {limits.max_questions} '
                                    "a request")
    for i, q in enumerate(items):
        name = where if where == "question" else f"questions[{i}]"
        if not isinstance(q, str):
            raise RequestError(422, f"{name} must be a string, got {_json_type(q)}")
        if not q.strip():
            raise RequestError(422, f"{name} is empty")
        if len(q) > limits.max_question_chars:
            raise RequestError(422, f"{name} has {len(q)} characters; at most {limits.max_question_chars}")
    return list(items)


def parse_search(payload: Any, limits: Limits, modes: tuple[str, ...], default_mode: str) -> Search:
    payload = _object(payload, {"questions", "question", "k", "mode"})
    questions = questions_of(payload, limits)
    k = payload.get("k", 10)
    if not isinstance(k, int) or isinstance(k, bool):
        raise RequestError(422, f'"k" must be an integer, got {_json_type(k)}')
    if not 1 <= k <= limits.max_k:
        raise RequestError(422, f'"k" must be between 1 and {limits.max_k}, got {k}')
    mode = payload.get("mode", default_mode)
    if not isinstance(mode, str):
        raise RequestError(422, f'"mode" must be a string, got {_json_type(mode)}')
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        raise RequestError(422, f'"mode" must be one of {", ".join(MODES)}, got {mode!r}')
    if mode not in modes:
        raise RequestError(422, f'mode {mode!r} is not served here (the server loaded {", ".join(modes)})')
    return Search(questions, k, mode)


def parse_encode(payload: Any, limits: Limits) -> list[str]:
    return questions_of(_object(payload, {"questions", "question"}), limits)
