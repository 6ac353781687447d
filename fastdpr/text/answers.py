"""Answer matching for retrieval: DPR's ``has_answer``, behind top-k accuracy, mining and reader training. (The
reader's SQuAD EM/F1 are in :mod:`fastdpr.eval.qa`.)

``has_answer`` follows DPR's evaluation exactly (docs/architecture.md §4.1): both sides are NFD-normalised (accents
kept as combining marks), split into tokens by ``([\\p{L}\\p{N}\\p{M}]+)|([^\\p{Z}\\p{C}])`` -- runs of
letters/digits/marks, or any single other visible character -- and each token is lowercased. An answer hits when its
token list occurs as a contiguous run of the passage's tokens. Only the passage *text* is searched, never its title.
So ``"U.S."`` is ``["u", ".", "s", "."]`` and matches ``"the U.S. army"`` but not ``"the US army"``.

Regex mode (CuratedTREC, whose answers are patterns): NFD both sides, ``regex.search`` with
IGNORECASE|UNICODE|MULTILINE; a pattern that does not compile is a miss, not an error.

Mining calls ``has_answer`` millions of times, so answer tokenisations and compiled answer patterns are cached,
and :class:`AnswerMatcher` lets a caller prepare one question's answers once and test many passages.

Example::

    >>> has_answer("Paris is the capital of France.", ["paris"])
    True
    >>> has_answer("born in the U.S. in 1961", ["U.S."])
    True
    >>> has_answer("the US", ["U.S."])
    False
    >>> has_answer("Barack Obama was born in 1961", [r"19[56]\\d"], mode="regex")
    True
"""
from __future__ import annotations

import functools
import unicodedata
from typing import Iterable, Sequence

import regex

__all__ = ["TOKEN_PATTERN", "AnswerMatcher", "has_answer", "tokenize"]

#: DPR's SimpleTokenizer pattern: a run of letters, numbers and combining marks, or one non-space, non-control char.
TOKEN_PATTERN = r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])"
_REGEX_FLAGS = regex.IGNORECASE | regex.UNICODE | regex.MULTILINE
# The same alternation without capture groups: identical tokens (a match is group 0 either way), and findall then
# returns plain strings, with no match object built and read per token as finditer + group() needs.
_TOKEN_RE = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=_REGEX_FLAGS)


def _nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def tokenize(text: str) -> list[str]:
    """DPR tokens of ``text``: NFD-normalised, split by :data:`TOKEN_PATTERN`, each token lowercased.

    Tokens are lowercased one by one (as DPR does), not the whole string, so context-dependent case mappings such as
    Greek final sigma come out exactly as in DPR.
    """
    return [t.lower() for t in _TOKEN_RE.findall(_nfd(text))]


@functools.lru_cache(maxsize=1 << 16)
def _answer_tokens(answer: str) -> tuple[str, ...]:
    return tuple(tokenize(answer))


def _fold_sigma(s: str) -> str:
    return s.replace("\u03c2", "\u03c3")  # final sigma -> sigma


@functools.lru_cache(maxsize=1 << 16)
def _answer_plan(answer: str) -> tuple[tuple[str, ...], str] | None:
    """(token run, probe) of an answer, or None when it has no tokens. The probe is the run's longest token."""
    run = _answer_tokens(answer)
    return (run, _fold_sigma(max(run, key=len))) if run else None


def _string_match(text: str, plans: list[tuple[tuple[str, ...], str]]) -> bool:
    """Whether one of the answer runs occurs in ``text``'s tokens.

    Most passages hold none of the answers, so a cheap necessary test comes first: every token of a run is a
    slice of the NFD text, and lowercasing is per character in Python except for Greek final sigma, so each
    answer token -- sigma folded -- must be a substring of the lowercased, sigma-folded NFD text. Only answers
    passing it pay for tokenisation (most candidate passages of mining never reach the regex). The property test in
    ``tests/test_answers.py`` checks this equals the plain tokenise-and-match on adversarial unicode.
    """
    nfd = _nfd(text)
    low = _fold_sigma(nfd.lower())
    live = [run for run, probe in plans if probe in low]
    if not live:
        return False
    tokens = [t.lower() for t in _TOKEN_RE.findall(nfd)]
    return any(_contains_run(tokens, run) for run in live)


@functools.lru_cache(maxsize=1 << 14)
def _answer_regex(pattern: str):
    try:
        return regex.compile(_nfd(pattern), flags=_REGEX_FLAGS)
    except Exception:  # any compile failure (regex.error, OverflowError, RecursionError...) means "no match"
        return None


def _contains_run(tokens: Sequence[str], run: tuple[str, ...]) -> bool:
    """Whether ``run`` occurs contiguously in ``tokens``. Jumps between occurrences of the first token with
    ``list.index`` (C speed) instead of comparing a slice at every position."""
    n = len(run)
    if n == 0:
        return False
    first = run[0]
    last_start = len(tokens) - n
    start = 0
    while start <= last_start:
        try:
            i = tokens.index(first, start, last_start + 1)
        except ValueError:
            return False
        if n == 1 or tuple(tokens[i : i + n]) == run:
            return True
        start = i + 1
    return False


class AnswerMatcher:
    """One question's answers, prepared once, tested against many passages.

    >>> m = AnswerMatcher(["Eiffel Tower"])
    >>> m("The Eiffel tower is in Paris."), m("A tower in Paris.")
    (True, False)
    """

    __slots__ = ("mode", "_plans", "_patterns")

    def __init__(self, answers: Iterable[str], mode: str = "string"):
        if mode not in ("string", "regex"):
            raise ValueError(f"has_answer mode must be 'string' or 'regex', got {mode!r}")
        self.mode = mode
        answers = [answers] if isinstance(answers, str) else list(answers)
        if mode == "string":
            # an answer with no tokens (empty or whitespace) would match every passage; it matches none instead
            self._plans = [p for p in (_answer_plan(a) for a in answers) if p is not None]
            self._patterns = []
        else:
            self._plans = []
            self._patterns = [p for p in (_answer_regex(a) for a in answers) if p is not None]

    def __call__(self, text: str) -> bool:
        return _string_match(text, self._plans) if self.mode == "string" else self.matches_regex(text)

    def matches_tokens(self, tokens: list[str]) -> bool:
        """String mode on a passage already tokenised with :func:`tokenize` (saves re-tokenising)."""
        return any(_contains_run(tokens, run) for run, _ in self._plans)

    def matches_regex(self, text: str) -> bool:
        if not self._patterns:
            return False
        text = _nfd(text)
        return any(p.search(text) is not None for p in self._patterns)


def has_answer(text: str, answers: Iterable[str], mode: str = "string") -> bool:
    """Whether passage ``text`` contains one of ``answers`` under DPR's rules (see module doc).

    Pass the passage text only: a match in the title does not count.
    """
    if mode == "string":
        if isinstance(answers, str):
            answers = [answers]
        plans = [p for p in (_answer_plan(a) for a in answers) if p is not None]
        return bool(plans) and _string_match(text, plans)
    return AnswerMatcher(answers, mode)(text)


# The SQuAD scores (EM/F1) live in fastdpr.eval.qa; these names were importable from here and still are, with a
# warning, until callers have moved.
_MOVED_TO_EVAL_QA = ("normalize_answer", "exact_match_score", "f1_score", "max_over_ground_truths",
                     "best_exact_match", "best_f1")


def __getattr__(name: str):
    if name in _MOVED_TO_EVAL_QA:
        import warnings

        from fastdpr.eval import qa

        warnings.warn(f"fastdpr.text.answers.{name} moved to fastdpr.eval.qa.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(qa, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
