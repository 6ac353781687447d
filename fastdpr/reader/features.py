"""Reader inputs: ``[CLS] question [SEP] title [SEP] passage [SEP]`` token rows, the range of passage tokens in
each row (answers may only come from there), character offsets to map a token span back to passage text, and
answer-span location for training."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from fastdpr.errors import InputError


@dataclass
class ReaderInputs:
    """A batch of (question, passage) rows.

    ``passage_start[i]``/``passage_end[i]`` bound the passage tokens of row i (end exclusive); ``offsets[i]`` holds
    the (char_start, char_end) in the passage text of each of those tokens, in order."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    passage_start: torch.Tensor
    passage_end: torch.Tensor
    offsets: list[list[tuple[int, int]]]

    def allowed_mask(self) -> torch.Tensor:
        """(N, L) bool: True on passage tokens, the only places an answer span may start or end."""
        positions = torch.arange(self.input_ids.shape[1]).unsqueeze(0)
        return (positions >= self.passage_start.unsqueeze(1)) & (positions < self.passage_end.unsqueeze(1))


@dataclass
class Row:
    """One unpadded (question, passage) row: token ids, token types, the passage token range, its offsets."""

    ids: list[int]
    types: list[int]
    passage_start: int
    passage_end: int
    offsets: list[tuple[int, int]]


def encode_rows(
    tokenizer,
    questions: list[str],
    passages: list[dict],
    max_length: int = 256,
    max_question_length: int = 64,
    max_title_length: int = 32,
) -> list[Row]:
    """Tokenise row i as ``[CLS] questions[i] [SEP] title [SEP] text [SEP]``, truncating the question, the title
    and then the passage so the row fits ``max_length``.

    The pieces are tokenised apart (not as a text pair) so the passage token range and its character offsets are
    known exactly, whatever the tokenizer's own pair template is. Each distinct question, title and text is
    tokenised once: in open-domain reading the same question meets many passages."""
    if len(questions) != len(passages):
        raise ValueError(f"{len(questions)} questions for {len(passages)} passages")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise InputError("the reader needs a tokenizer with [CLS]/[SEP]-like tokens (a BERT-family encoder)")
    # pieces are truncated below, so the "longer than the model maximum" warning would be noise
    plain = dict(add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False)

    def unique_tokens(texts: list[str], offsets: bool = False):
        distinct = list(dict.fromkeys(texts))
        if not distinct:
            return {}, {}
        enc = tokenizer(distinct, return_offsets_mapping=offsets, **plain)
        ids = dict(zip(distinct, enc["input_ids"]))
        if not offsets:
            return ids, None
        return ids, dict(zip(distinct, enc["offset_mapping"]))

    titles = [str(p.get("title") or "") for p in passages]
    texts = [str(p["text"]) for p in passages]
    q_tok, _ = unique_tokens(list(questions))
    t_tok, _ = unique_tokens(titles)
    p_tok, p_off = unique_tokens(texts, offsets=True)
    rows = []
    for question, title_text, text in zip(questions, titles, texts):
        head = [cls_id] + q_tok[question][:max_question_length] + [sep_id]
        t = t_tok[title_text]
        # the title never takes more than half of what the question leaves, so the passage always gets tokens
        title_room = min(max_title_length, (max_length - len(head) - 1) // 2 - 1)
        title = t[: max(0, title_room)] + [sep_id] if t and title_room > 0 else []
        room = max_length - len(head) - len(title) - 1
        if room < 1:
            raise InputError(f"max_length={max_length} leaves no room for passage tokens")
        p, off = p_tok[text][:room], p_off[text][:room]
        start = len(head) + len(title)
        rows.append(Row(head + title + p + [sep_id], [0] * len(head) + [1] * (len(title) + len(p) + 1),
                        start, start + len(p), [(int(a), int(b)) for a, b in off]))
    return rows


def collate(rows: list[Row], pad_id: int = 0) -> ReaderInputs:
    """Pad rows to the longest one into a :class:`ReaderInputs` batch."""
    width = max(len(r.ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    token_types = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row.ids)] = torch.tensor(row.ids)
        attention[i, : len(row.ids)] = 1
        token_types[i, : len(row.types)] = torch.tensor(row.types)
    return ReaderInputs(
        input_ids, attention, token_types, torch.tensor([r.passage_start for r in rows]),
        torch.tensor([r.passage_end for r in rows]), [r.offsets for r in rows],
    )


def tokenize_pairs(
    tokenizer,
    questions: list[str],
    passages: list[dict],
    max_length: int = 256,
    max_question_length: int = 64,
    max_title_length: int = 32,
) -> ReaderInputs:
    """:func:`encode_rows` padded into one batch."""
    rows = encode_rows(tokenizer, questions, passages, max_length, max_question_length, max_title_length)
    pad_id = tokenizer.pad_token_id
    return collate(rows, 0 if pad_id is None else pad_id)


def _word_runs(text: str, alnum_only: bool) -> tuple[list[str], list[tuple[int, int]]]:
    """DPR tokens of ``text`` (runs of letters/digits/marks, or one other visible character), lowercased and
    NFD-folded for comparison, with their character spans in ``text`` itself. ``alnum_only`` drops punctuation
    tokens, so "Washington, D.C." and "Washington D.C." compare equal."""
    import unicodedata

    from fastdpr.text.answers import _TOKEN_RE

    words, spans = [], []
    for match in _TOKEN_RE.finditer(text):
        word = match.group()
        if alnum_only and not any(ch.isalnum() for ch in word):
            continue
        words.append(unicodedata.normalize("NFD", word).lower())
        spans.append(match.span())
    return words, spans


def _occurrences(words: list[str], run: list[str]) -> list[int]:
    n = len(run)
    return [i for i in range(len(words) - n + 1) if words[i] == run[0] and words[i : i + n] == run]


def answer_char_spans(text: str, answers: list[str]) -> list[tuple[int, int]]:
    """Character spans (start, end exclusive) of every occurrence of every answer in ``text``.

    Matching is on DPR's tokens (the rule ``has_answer`` uses): case- and whitespace-insensitive, whole tokens
    only, so "paris" is not found inside "parisian". An answer with no exact token match is tried again with
    punctuation ignored on both sides ("Washington, D.C." in "Washington D.C.")."""
    found: set[tuple[int, int]] = set()
    strict = loose = None
    for answer in answers:
        for alnum_only in (False, True):
            if alnum_only:
                loose = loose or _word_runs(text, True)
                words, spans = loose
            else:
                strict = strict or _word_runs(text, False)
                words, spans = strict
            run, _ = _word_runs(str(answer), alnum_only)
            if not run:
                continue
            hits = _occurrences(words, run)
            for i in hits:
                found.add((spans[i][0], spans[i + len(run) - 1][1]))
            if hits:
                break
    return sorted(found)


def locate_answer_spans(
    text: str, offsets: list[tuple[int, int]], answers: list[str], max_answer_length: int = 10
) -> list[tuple[int, int]]:
    """Token spans (start, end inclusive, indices into the passage tokens) covering each occurrence of each answer
    in ``text`` (see :func:`answer_char_spans`) that lies fully inside the (possibly truncated) tokens and is at
    most ``max_answer_length`` tokens long."""
    if not offsets:
        return []
    covered_end = offsets[-1][1]
    starts = [s for s, _ in offsets]
    ends = [e for _, e in offsets]
    spans = set()
    for a, b in answer_char_spans(text, answers):
        if b > covered_end:
            continue
        # first token ending after a, last token starting before b (tokens never straddle a DPR token boundary
        # for BERT-family tokenizers, which split on the same punctuation and whitespace)
        start = bisect.bisect_right(ends, a)
        end = bisect.bisect_left(starts, b) - 1
        if start >= len(offsets) or end < start or end - start + 1 > max_answer_length:
            continue
        spans.add((start, end))
    return sorted(spans)
