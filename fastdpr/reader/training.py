"""Reader training as in DPR: each question brings one positive passage (retrieved, contains the answer, answer
span located in its tokens) and negatives (retrieved, no answer). The loss is

* span: −log Σ_{(s,e) ∈ answer spans of the positive} p_start(s)·p_end(e) — the marginal over every occurrence of
  every answer, start and end softmaxes taken over the passage tokens;
* selection: cross-entropy of the positive among the question's passages (relevance logits from [CLS]).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from fastdpr.reader.features import locate_answer_spans


@dataclass
class _Group:
    question: str
    positives: list[tuple[dict, list[tuple[int, int]]]]  # passage, spans in passage-token indices
    negatives: list[dict]


def prepare_groups(reader, examples: list[dict], max_positives: int = 3, max_negatives: int = 30) -> list[_Group]:
    """Turn retriever results ``{"question", "answers", "ctxs": [{title, text, has_answer?}, ...]}`` into training
    groups. ``has_answer`` is computed (DPR rules, passage text) where a ctx lacks it. Questions without a positive
    whose answer span survives tokenisation are dropped, as in DPR."""
    from fastdpr.text.answers import has_answer

    groups = []
    for ex in examples:
        answers = list(ex.get("answers") or [])
        ctxs = list(ex.get("ctxs") or [])
        hits = [c["has_answer"] if c.get("has_answer") is not None else has_answer(c["text"], answers)
                for c in ctxs]
        candidates = [c for c, hit in zip(ctxs, hits) if hit][:max_positives]
        negatives = [c for c, hit in zip(ctxs, hits) if not hit][:max_negatives]
        positives = []
        if candidates:
            inputs = reader.tokenize([ex["question"]] * len(candidates), candidates)
            for j, ctx in enumerate(candidates):
                spans = locate_answer_spans(
                    str(ctx["text"]), inputs.offsets[j], answers, reader.config.max_answer_length
                )
                if spans:
                    positives.append((ctx, spans))
        if positives:
            groups.append(_Group(ex["question"], positives, negatives))
    return groups


def reader_loss(
    start: torch.Tensor,
    end: torch.Tensor,
    relevance: torch.Tensor,
    allowed: torch.Tensor,
    positive_rows: torch.Tensor,
    spans: list[list[tuple[int, int]]],
    group_of_row: torch.Tensor,
    n_groups: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(span loss, selection loss), each a mean over questions.

    ``positive_rows`` (G,) is the row of each group's positive; ``spans[g]`` its spans as absolute token indices;
    ``group_of_row`` (N,) maps each row to its group (rows of a group are contiguous, positive first)."""
    neg = torch.finfo(start.dtype).min
    log_p_start = start.masked_fill(~allowed, neg).log_softmax(-1)
    log_p_end = end.masked_fill(~allowed, neg).log_softmax(-1)
    span_terms = []
    for g, row in enumerate(positive_rows.tolist()):
        s = torch.tensor([a for a, _ in spans[g]], device=start.device)
        e = torch.tensor([b for _, b in spans[g]], device=start.device)
        span_terms.append(-torch.logsumexp(log_p_start[row, s] + log_p_end[row, e], dim=0))
    span_loss = torch.stack(span_terms).mean()
    # selection: softmax over each group's rows, the positive is its first row
    per_group = max(int((group_of_row == g).sum()) for g in range(n_groups))
    table = relevance.new_full((n_groups, per_group), float("-inf"))
    slot = torch.zeros_like(group_of_row)
    for g in range(n_groups):
        rows = (group_of_row == g).nonzero().squeeze(1)
        slot[rows] = torch.arange(len(rows), device=slot.device)
    table = table.index_put((group_of_row, slot), relevance)
    select_loss = torch.nn.functional.cross_entropy(table, torch.zeros(n_groups, dtype=torch.long, device=table.device))
    return span_loss, select_loss


def train_reader(
    reader,
    examples: list[dict],
    epochs: float = 1.0,
    batch_size: int = 4,
    n_passages: int = 4,
    lr: float = 2e-5,
    warmup_fraction: float = 0.1,
    weight_decay: float = 0.0,
    grad_clip: float = 2.0,
    max_steps: int | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    show_progress: bool = True,
    log: list | None = None,
) -> dict:
    """Fine-tune ``reader`` in place on retriever results; return ``{"steps", "questions", "loss"}``.

    Each step takes ``batch_size`` questions × (1 positive + up to ``n_passages`` − 1 negatives, sampled from the
    retrieved ones). AdamW, linear warm-up then linear decay, gradient clipping (DPR's recipe)."""
    from tqdm.auto import tqdm

    if n_passages < 1 or batch_size < 1:
        raise ValueError("batch_size and n_passages must be >= 1")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    groups = prepare_groups(reader, examples)
    if not groups:
        raise ValueError("no training question has a retrieved passage containing its answer")
    steps_per_epoch = math.ceil(len(groups) / batch_size)
    total = max_steps if max_steps is not None else max(1, int(round(epochs * steps_per_epoch)))
    if device is not None:
        reader.to(device)
    decay, no_decay = [], []
    for name, param in reader.named_parameters():
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "bias" in name else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    warmup = int(warmup_fraction * total)
    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    reader.train(True)
    order: list[int] = []
    last = float("nan")
    bar = tqdm(range(total), disable=not show_progress, desc="train reader", leave=False)
    for step in bar:
        if len(order) < batch_size:
            fresh = list(range(len(groups)))
            rng.shuffle(fresh)
            order += fresh
        batch = [groups[i] for i in order[:batch_size]]
        del order[:batch_size]
        questions, passages, group_of_row, positive_rows, positive_spans = [], [], [], [], []
        for g, group in enumerate(batch):
            positive, spans = rng.choice(group.positives)
            negatives = rng.sample(group.negatives, min(n_passages - 1, len(group.negatives)))
            positive_rows.append(len(passages))
            positive_spans.append(spans)
            for p in [positive] + negatives:
                questions.append(group.question)
                passages.append(p)
                group_of_row.append(g)
        inputs = reader.tokenize(questions, passages)
        start, end, relevance = reader(inputs)
        allowed = inputs.allowed_mask().to(start.device)
        first = inputs.passage_start.tolist()
        absolute = [[(a + first[r], b + first[r]) for a, b in spans]
                    for r, spans in zip(positive_rows, positive_spans)]
        span_loss, select_loss = reader_loss(
            start, end, relevance, allowed, torch.tensor(positive_rows), absolute,
            torch.tensor(group_of_row, device=start.device), len(batch),
        )
        loss = span_loss + select_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(reader.parameters(), grad_clip)
        optimizer.step()
        schedule.step()
        last = float(loss.detach())
        if log is not None:
            log.append({"step": step, "loss": last, "span": float(span_loss.detach()), "select": float(select_loss.detach())})
        bar.set_postfix(loss=f"{last:.3f}")
    reader.train(False)
    return {"steps": total, "questions": len(groups), "loss": last}
