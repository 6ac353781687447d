"""Reader training as in DPR: each question brings one positive passage (retrieved, contains the answer, answer
span located in its tokens) and negatives (retrieved, no answer). The loss is

* span: −log Σ_{(s,e) ∈ answer spans of the positive} p_start(s)·p_end(e) — the marginal over every occurrence of
  every answer. With ``shared_normalization`` (the default) the start and end softmaxes run over the passage tokens
  of *all* the question's passages at once (Clark & Gardner 2018), so a negative passage's spans are pushed down
  too and span scores compare across passages; without it, over the positive passage's tokens only (DPR);
* selection: cross-entropy of the positive among the question's passages (relevance logits from [CLS]).

Why shared normalization: with per-passage softmaxes a span score only ranks spans within its own passage, and a
reader trained that way answered NQ test worse from the top-5 hybrid passages (EM .23) than from the top-1 (.58):
every distractor had some confident span.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from fastdpr.reader.features import answer_char_spans, locate_answer_spans
from fastdpr.train.task import Task


@dataclass
class _Group:
    question: str
    positives: list[tuple[dict, list[tuple[int, int]]]]  # passage, spans in passage-token indices
    negatives: list[dict]


def _fit_positive(reader, question: str, ctx: dict, answers: list[str], rng: random.Random):
    """(passage, spans) for a positive passage: the passage itself when its answer lies within the tokens a row
    holds, else a window of the passage around one answer occurrence (placed at random), as extractive readers
    are trained on long paragraphs. None when no answer span can be located."""
    text = str(ctx["text"])
    row = reader.encode([question], [ctx])[0]
    spans = locate_answer_spans(text, row.offsets, answers, reader.config.max_answer_length)
    if spans:
        return ctx, spans
    room = row.passage_end - row.passage_start
    occurrences = answer_char_spans(text, answers)
    if not occurrences:
        return None
    offsets = reader.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                               verbose=False)["offset_mapping"]
    if len(offsets) <= room:
        return None  # the answer is there but longer than max_answer_length
    a, b = rng.choice(occurrences)
    first = next(i for i, (_, e) in enumerate(offsets) if e > a)
    last = max(i for i, (s, _) in enumerate(offsets) if s < b)
    if last - first + 1 > min(room, reader.config.max_answer_length):
        return None
    # a window of `room` tokens containing tokens first..last, at a random place
    lo, hi = max(0, last - room + 1), min(first, len(offsets) - room)
    begin = rng.randint(lo, max(lo, hi))
    end = min(len(offsets), begin + room) - 1
    # a little slack (two tokens short of the room): re-tokenising the cut text can split its edges differently
    begin = min(begin + 1, first) if begin > 0 else begin
    end = max(end - 1, last) if end < len(offsets) - 1 else end
    cropped = {**ctx, "text": text[offsets[begin][0] : offsets[end][1]]}
    row = reader.encode([question], [cropped])[0]
    spans = locate_answer_spans(cropped["text"], row.offsets, answers, reader.config.max_answer_length)
    return (cropped, spans) if spans else None


def prepare_groups(reader, examples: list[dict], max_positives: int = 3, max_negatives: int = 30,
                   seed: int = 0) -> list[_Group]:
    """Turn retriever results ``{"question", "answers", "ctxs": [{title, text, has_answer?}, ...]}`` into training
    groups. ``has_answer`` is computed (DPR rules, passage text) where a ctx lacks it. A positive longer than a
    row is cut to a window around its answer. Questions without a positive whose answer span can be located are
    dropped, as in DPR."""
    from fastdpr.text.answers import has_answer

    rng = random.Random(seed)
    groups = []
    for ex in examples:
        answers = list(ex.get("answers") or [])
        ctxs = list(ex.get("ctxs") or [])
        hits = [c["has_answer"] if c.get("has_answer") is not None else has_answer(c["text"], answers)
                for c in ctxs]
        candidates = [c for c, hit in zip(ctxs, hits) if hit][:max_positives]
        negatives = [c for c, hit in zip(ctxs, hits) if not hit][:max_negatives]
        positives = [fit for fit in (_fit_positive(reader, ex["question"], c, answers, rng) for c in candidates)
                     if fit is not None]
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
    shared_normalization: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(span loss, selection loss), each a mean over questions.

    ``positive_rows`` (G,) is the row of each group's positive; ``spans[g]`` its spans as absolute token indices;
    ``group_of_row`` (N,) maps each row to its group (rows of a group are contiguous, positive first).
    ``shared_normalization``: span softmaxes over the allowed tokens of all the group's rows (else per row)."""
    neg = torch.finfo(start.dtype).min
    start = start.masked_fill(~allowed, neg)
    end = end.masked_fill(~allowed, neg)
    if shared_normalization:
        # log Z of each group: logsumexp over every allowed token of every row of the group
        rows_z_start, rows_z_end = start.logsumexp(-1), end.logsumexp(-1)  # (N,)
        z_start = torch.stack([rows_z_start[group_of_row == g].logsumexp(0) for g in range(n_groups)])
        z_end = torch.stack([rows_z_end[group_of_row == g].logsumexp(0) for g in range(n_groups)])
    span_terms = []
    for g, row in enumerate(positive_rows.tolist()):
        s = torch.tensor([a for a, _ in spans[g]], device=start.device)
        e = torch.tensor([b for _, b in spans[g]], device=start.device)
        if shared_normalization:
            log_p = start[row, s] - z_start[g] + end[row, e] - z_end[g]
        else:
            log_p = start[row].log_softmax(-1)[s] + end[row].log_softmax(-1)[e]
        span_terms.append(-torch.logsumexp(log_p, dim=0))
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


def _batches(groups: list[_Group], batch_size: int, rng: random.Random, bucket: int = 50) -> list[list[int]]:
    """One epoch of batches: shuffled, then sorted by length within runs of ``bucket`` batches, so each batch
    holds questions of similar length (less padding) while the order stays random."""
    order = list(range(len(groups)))
    rng.shuffle(order)
    size = lambda i: len(groups[i].question) + len(groups[i].positives[0][0]["text"])  # noqa: E731
    batches = []
    for begin in range(0, len(order), batch_size * bucket):
        run = sorted(order[begin : begin + batch_size * bucket], key=size)
        batches += [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
    tail = batches.pop() if batches and len(batches[-1]) < batch_size and len(batches) > 1 else None
    rng.shuffle(batches)
    return batches + ([tail] if tail else [])


class ReaderTask(Task):
    """The reader as a training task (:class:`fastdpr.train.task.Task`): each batch takes ``batch_size``
    questions × (1 positive + up to ``n_passages`` − 1 negatives, sampled from the retrieved ones)."""

    def __init__(self, reader, groups: list[_Group], batch_size: int, n_passages: int, seed: int = 0,
                 shared_normalization: bool = True, freeze_word_embeddings: bool = False):
        self.model = reader
        self.groups = groups
        self.batch_size = batch_size
        self.n_passages = n_passages
        self.seed = seed
        self.shared_normalization = shared_normalization
        self.freeze_word_embeddings = freeze_word_embeddings
        self.batches_per_epoch = math.ceil(len(groups) / batch_size)
        self.last_parts: dict = {}
        self._epoch: tuple[int, list[list[int]]] | None = None

    def prepare(self, trainer) -> None:
        if self.freeze_word_embeddings:
            # half of a MiniLM's parameters are its word embeddings: freezing them halves the optimizer's work and
            # skips their (dense) gradient, at little cost to a short fine-tuning
            self.model.encoder.get_input_embeddings().weight.requires_grad_(False)

    def batch(self, epoch: int, position: int, step: int) -> dict:
        if self._epoch is None or self._epoch[0] != epoch:
            # an epoch's order from its number alone, so a resumed run takes the same batches
            self._epoch = (epoch, _batches(self.groups, self.batch_size, random.Random(f"{self.seed}/{epoch}")))
        groups = [self.groups[i] for i in self._epoch[1][position]]
        # a generator per step: a resumed run samples the same negatives as an uninterrupted one
        step_rng = random.Random(f"{self.seed}/steps/{step}")
        questions, passages, group_of_row, positive_rows, positive_spans = [], [], [], [], []
        for g, group in enumerate(groups):
            positive, spans = step_rng.choice(group.positives)
            negatives = step_rng.sample(group.negatives, min(self.n_passages - 1, len(group.negatives)))
            positive_rows.append(len(passages))
            positive_spans.append(spans)
            for p in [positive] + negatives:
                questions.append(group.question)
                passages.append(p)
                group_of_row.append(g)
        return {"questions": questions, "passages": passages, "group_of_row": group_of_row,
                "positive_rows": positive_rows, "positive_spans": positive_spans, "n_groups": len(groups)}

    def examples_in(self, batch: dict) -> int:
        return batch["n_groups"]

    def step(self, trainer, batch: dict) -> torch.Tensor:
        reader = self.model
        inputs = reader.tokenize(batch["questions"], batch["passages"])
        with trainer.autocast():
            start, end, relevance = reader(inputs)
        start, end, relevance = start.float(), end.float(), relevance.float()
        allowed = inputs.allowed_mask().to(start.device)
        first = inputs.passage_start.tolist()
        absolute = [[(a + first[r], b + first[r]) for a, b in spans]
                    for r, spans in zip(batch["positive_rows"], batch["positive_spans"])]
        span_loss, select_loss = reader_loss(
            start, end, relevance, allowed, torch.tensor(batch["positive_rows"]), absolute,
            torch.tensor(batch["group_of_row"], device=start.device), batch["n_groups"], self.shared_normalization,
        )
        loss = span_loss + select_loss
        trainer.backward(loss)
        self.last_parts = {"span": float(span_loss.detach()), "select": float(select_loss.detach())}
        return loss.detach()


def train_reader(
    reader,
    examples: list[dict],
    epochs: float | None = 1.0,
    batch_size: int = 4,
    n_passages: int = 4,
    lr: float = 2e-5,
    warmup_fraction: float = 0.1,
    weight_decay: float = 0.0,
    grad_clip: float = 2.0,
    max_steps: int | None = None,
    time_budget_s: float | None = None,
    bf16: bool = False,
    freeze_word_embeddings: bool = False,
    shared_normalization: bool = True,
    attention_dropout: float | None = 0.0,
    seed: int = 0,
    device: str | torch.device | None = None,
    show_progress: bool | None = True,
    log: list | None = None,
    checkpoint_dir=None,
    checkpoint_every_s: float = 300.0,
    callback=None,
    callback_every: int = 0,
) -> dict:
    """Fine-tune ``reader`` in place on retriever results; return ``{"steps", "questions", "examples_seen",
    "loss", "seconds", "cpu_seconds", "stopped_by"}`` (seconds of training, wall clock and this process's CPU).

    Each step takes ``batch_size`` questions × (1 positive + up to ``n_passages`` − 1 negatives, sampled from the
    retrieved ones). AdamW, linear warm-up then linear decay, gradient clipping (DPR's recipe): the project's one
    training loop, :class:`fastdpr.train.trainer.Trainer`, runs the steps.

    Length of training: ``max_steps``, else ``epochs`` over the questions; with ``time_budget_s`` training stops
    when that many seconds of training have passed, and the learning-rate schedule follows elapsed time instead of
    steps, so a run of any speed ends with the rate decayed to zero. ``bf16`` trains under bfloat16 autocast;
    ``shared_normalization`` normalises span scores over all the passages of a question (see the module
    docstring); ``freeze_word_embeddings`` leaves the word embeddings as they are. ``attention_dropout`` replaces
    the encoder's dropout on attention probabilities (``None`` keeps it): at 0, the default, torch's fused CPU
    attention runs (the fused kernel has no dropout, so with dropout every attention call takes the unfused path);
    hidden dropout stays. ``checkpoint_dir`` saves the state there every ``checkpoint_every_s`` seconds of wall
    clock and resumes from the latest one it holds. ``callback(stats, reader)`` runs every ``callback_every`` steps
    (its time is not counted as training time); ``log`` receives every step's loss, its parts and the rate."""
    import dataclasses

    from fastdpr.train import checkpoint as ckpt
    from fastdpr.train.trainer import Trainer, TrainingArguments

    if n_passages < 1:
        raise ValueError(f"n_passages must be >= 1, got {n_passages!r}")
    # the loop's settings are checked (by TrainingArguments) before the groups are prepared, which takes long; the
    # number of steps, which needs the groups, is filled in after
    args = TrainingArguments(
        output_dir=None if checkpoint_dir is None else str(checkpoint_dir), batch_size=batch_size, epochs=0,
        max_steps=1, time_budget_s=time_budget_s, lr=lr, warmup_steps=warmup_fraction,
        weight_decay=weight_decay, max_grad_norm=grad_clip or 0.0, precision="bf16" if bf16 else "fp32",
        attention_dropout=attention_dropout, seed=seed, save_every_s=checkpoint_every_s, save_total_limit=1,
        device=str(device if device is not None else reader.span_head.weight.device), show_progress=show_progress,
        logging_steps=1,
    )
    torch.manual_seed(seed)
    groups = prepare_groups(reader, examples, seed=seed)
    if not groups:
        raise ValueError("no training question has a retrieved passage containing its answer")
    task = ReaderTask(reader, groups, batch_size, n_passages, seed=seed, shared_normalization=shared_normalization,
                      freeze_word_embeddings=freeze_word_embeddings)
    if max_steps is not None:
        steps = max_steps
    elif time_budget_s is not None and epochs is None:
        steps = 0  # bounded by time only
    else:
        steps = max(1, int(round((1.0 if epochs is None else epochs) * task.batches_per_epoch)))
    args = dataclasses.replace(args, max_steps=steps)

    def report(trainer, record: dict) -> None:
        if log is not None:
            log.append({"step": record["step"] - 1, "loss": record["loss"], "span": record["span"],
                        "select": record["select"], "lr": record["lr"]})
        if callback is not None and callback_every and record["step"] % callback_every == 0:
            state = trainer.state
            callback({"step": state["step"], "elapsed": state["elapsed"], "cpu": state["cpu"], "seen": state["seen"],
                      "epoch": state["epoch"], "batch": state["position"], "loss": record["loss"]}, reader)

    trainer = Trainer(task, args, callbacks=[report])
    resume = checkpoint_dir is not None and ckpt.latest_checkpoint(checkpoint_dir) is not None
    try:
        result = trainer.train(resume=resume)
    finally:
        reader.train(False)
    return {"steps": result["step"], "questions": len(groups), "examples_seen": result["examples_seen"],
            "loss": result["loss"], "seconds": round(result["seconds"], 1),
            "cpu_seconds": round(result["cpu_seconds"], 1), "stopped_by": result["stopped_by"]}
