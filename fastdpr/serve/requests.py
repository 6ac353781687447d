"""What a request may hold, checked before anything is queued: every refusal is one line naming the field.

Status codes: 400 for a body that is not JSON (or nested deeper than ``MAX_DEPTH``, or a question that is not
text: a lone surrogate), 413 for one over the size limit or asking for more results than ``max_results``, 422 for
JSON that is not a valid request (wrong type, missing or unknown field, value out of range)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

MODES = ("dense", "sparse", "hybrid")
MODE_ALIASES = {"bm25": "sparse"}  # the name `fastdpr search --mode` uses
# arrays and objects inside one another at most: a request needs 2; the parser recurses per level, and a few
# kilobytes of brackets would otherwise end in a RecursionError
MAX_DEPTH = 32


@dataclass(frozen=True)
class Limits:
    max_k: int = 1000
    max_questions: int = 256  # per request
    max_question_chars: int = 2000
    max_body_bytes: int = 1 << 20
    # questions x k of one search: the answer is held until the client has read it, so this bounds what one
    # request can make the server hold (about 1 KB a passage of 100 words)
    max_results: int = 10_000
    max_answer_bytes: int = 32 << 20  # an answer larger than this (long passages) is refused, not sent

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class RequestError(Exception):
    """A refused request: HTTP ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.reason = reason  # the metrics' error reason, when not the status's own


@dataclass(frozen=True)
class Search:
    questions: list[str]
    k: int
    mode: str


def parse_json(body: bytes) -> Any:
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        raise RequestError(400, f"the body nests arrays and objects {depth} deep; at most {MAX_DEPTH}")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise RequestError(400, f"the body is not valid JSON ({_one_line(err)})") from None


def nesting_depth(body: bytes) -> int:
    """How deep arrays and objects nest in ``body`` (brackets inside strings not counted), in time linear in its
    size, before it is parsed. Exact for valid JSON; for anything else an estimate the parser then refuses."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:  # every request of a client that means well
        return 0
    import numpy as np

    b = np.frombuffer(body, dtype=np.uint8)
    at = np.arange(len(b))
    backslash = b == ord("\\")
    # a quote is escaped when an odd run of backslashes ends just before it
    last_other = np.maximum.accumulate(np.where(backslash, -1, at))
    run_before = np.concatenate([[0], (at - last_other)[:-1]])
    quote = (b == ord('"')) & (run_before % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0  # the opening quote counts as inside, the closing one as outside
    opens = (b == ord("[")) | (b == ord("{"))
    closes = (b == ord("]")) | (b == ord("}"))
    step = np.where(outside, opens.astype(np.int64) - closes, 0)
    return int(np.cumsum(step).max(initial=0))


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
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate (JSON allows "\ud800"): no tokenizer takes it
            raise RequestError(400, f"{name} is not valid text: {err.reason} at character {err.start}") from None
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
    if len(questions) * k > limits.max_results:
        raise RequestError(413, f"{len(questions)} questions x k={k} asks for {len(questions) * k} passages; at "
                                f"most {limits.max_results} a request (ask for fewer questions or a smaller k)")
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
