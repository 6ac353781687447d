"""Reader inputs: ``[CLS] question [SEP] title [SEP] passage [SEP]`` token rows, the range of passage tokens in
each row (answers may only come from there), character offsets to map a token span back to passage text, and
answer-span location for training."""
from __future__ import annotations

import re
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


def tokenize_pairs(
    tokenizer,
    questions: list[str],
    passages: list[dict],
    max_length: int = 256,
    max_question_length: int = 64,
    max_title_length: int = 32,
) -> ReaderInputs:
    """Tokenise row i as ``[CLS] questions[i] [SEP] title [SEP] text [SEP]``, truncating the question, the title
    and then the passage so the row fits ``max_length``.

    The pieces are tokenised apart (not as a text pair) so the passage token range and its character offsets are
    known exactly, whatever the tokenizer's own pair template is."""
    if len(questions) != len(passages):
        raise ValueError(f"{len(questions)} questions for {len(passages)} passages")
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    if cls_id is None or sep_id is None:
        raise InputError("the reader needs a tokenizer with [CLS]/[SEP]-like tokens (a BERT-family encoder)")
    pad_id = 0 if pad_id is None else pad_id
    # pieces are truncated below, so the "longer than the model maximum" warning would be noise
    plain = dict(add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False)
    q_tok = tokenizer(list(questions), **plain)["input_ids"]
    t_tok = tokenizer([str(p.get("title") or "") for p in passages], **plain)["input_ids"]
    p_enc = tokenizer([str(p["text"]) for p in passages], return_offsets_mapping=True, **plain)
    rows, types, starts, ends, offsets = [], [], [], [], []
    for q, t, p, off in zip(q_tok, t_tok, p_enc["input_ids"], p_enc["offset_mapping"]):
        head = [cls_id] + q[:max_question_length] + [sep_id]
        # the title never takes more than half of what the question leaves, so the passage always gets tokens
        title_room = min(max_title_length, (max_length - len(head) - 1) // 2 - 1)
        title = t[: max(0, title_room)] + [sep_id] if t and title_room > 0 else []
        room = max_length - len(head) - len(title) - 1
        if room < 1:
            raise InputError(f"max_length={max_length} leaves no room for passage tokens")
        p, off = p[:room], off[:room]
        start = len(head) + len(title)
        rows.append(head + title + p + [sep_id])
        types.append([0] * len(head) + [1] * (len(title) + len(p) + 1))
        starts.append(start)
        ends.append(start + len(p))
        offsets.append([(int(a), int(b)) for a, b in off])
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    token_types = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, tt) in enumerate(zip(rows, types)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        token_types[i, : len(tt)] = torch.tensor(tt)
    return ReaderInputs(
        input_ids, attention, token_types, torch.tensor(starts), torch.tensor(ends), offsets
    )


def locate_answer_spans(
    text: str, offsets: list[tuple[int, int]], answers: list[str], max_answer_length: int = 10
) -> list[tuple[int, int]]:
    """Token spans (start, end inclusive, indices into the passage tokens) covering each case-insensitive
    occurrence of each answer in ``text`` that lies fully inside the (possibly truncated) tokens and is at most
    ``max_answer_length`` tokens long."""
    if not offsets:
        return []
    covered_end = offsets[-1][1]
    spans = []
    for answer in answers:
        answer = answer.strip()
        if not answer:
            continue
        for match in re.finditer(re.escape(answer), text, flags=re.IGNORECASE):
            a, b = match.span()
            if b > covered_end:
                continue
            start = next((i for i, (s, e) in enumerate(offsets) if e > a), None)
            end = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < b), None)
            if start is None or end is None or end < start or end - start + 1 > max_answer_length:
                continue
            # whole words only: "paris" must not be found inside "parisian", nor "1961" inside "19612"
            if offsets[start][0] != a or offsets[end][1] != b:
                continue
            if (a > 0 and text[a - 1].isalnum() and text[a].isalnum()) or (
                b < len(text) and text[b].isalnum() and text[b - 1].isalnum()
            ):
                continue
            spans.append((start, end))
    return sorted(set(spans))
