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


class _Checkpoint:
    """Training state in ``directory/state`` (reader + optimizer + schedule + counters), replaced atomically: the
    new state is written beside the old one and swapped in by renames, so a kill at any moment leaves one
    complete state to resume from."""

    def __init__(self, directory):
        from pathlib import Path

        self.dir = Path(directory)

    def load(self, reader, optimizer, schedule) -> dict | None:
        for name in ("state", "state.old"):
            path = self.dir / name
            if (path / "done.json").is_file():
                from safetensors.torch import load_file

                from fastdpr.errors import InputError

                try:
                    reader.load_state_dict(load_file(str(path / "model.safetensors")))
                    extra = torch.load(path / "optimizer.pt", weights_only=False)
                    optimizer.load_state_dict(extra["optimizer"])
                    schedule.load_state_dict(extra["schedule"])
                except (RuntimeError, ValueError, KeyError) as err:
                    raise InputError(f"this checkpoint is not a state of the training asked for (another model or "
                                     f"other settings: {err}); remove it or choose another checkpoint directory",
                                     path=str(path)) from err
                return extra["counters"]
        return None

    def save(self, reader, optimizer, schedule, counters: dict) -> None:
        import json
        import shutil

        from safetensors.torch import save_file

        tmp, current, old = self.dir / "state.tmp", self.dir / "state", self.dir / "state.old"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in reader.state_dict().items()}, str(tmp / "model.safetensors"))
        torch.save({"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "counters": counters},
                   tmp / "optimizer.pt")
        (tmp / "done.json").write_text(json.dumps({"step": counters["step"]}))
        shutil.rmtree(old, ignore_errors=True)
        if current.exists():
            current.rename(old)
        tmp.rename(current)
        shutil.rmtree(old, ignore_errors=True)


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
    retrieved ones). AdamW, linear warm-up then linear decay, gradient clipping (DPR's recipe).

    Length of training: ``max_steps``, else ``epochs`` over the questions; with ``time_budget_s`` training stops
    when that many seconds of training have passed, and the learning-rate schedule follows elapsed time instead of
    steps, so a run of any speed ends with the rate decayed to zero. ``bf16`` trains under bfloat16 autocast
    (about 2× faster on CPUs with AMX); ``shared_normalization`` normalises span scores over all the passages of a
    question (see the module docstring); ``freeze_word_embeddings`` leaves the word embeddings as they are (a
    third less work per step on MiniLM). ``attention_dropout`` replaces the encoder's dropout on attention
    probabilities (``None`` keeps it): at 0, the default, torch's fused CPU attention runs, 1.6× faster steps on
    CPU (the fused kernel has no dropout, so with dropout every attention call takes the unfused path); hidden
    dropout stays. ``checkpoint_dir`` saves the state every ``checkpoint_every_s`` seconds and
    resumes from it. ``callback(stats, reader)`` runs every ``callback_every`` steps (its time is not counted as
    training time)."""
    import time

    from fastdpr.progress import progress
    from fastdpr.reader.model import autocast

    if n_passages < 1 or batch_size < 1:
        raise ValueError("batch_size and n_passages must be >= 1")
    if attention_dropout is not None and not 0.0 <= attention_dropout < 1.0:
        raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout!r}")
    if time_budget_s is not None and time_budget_s <= 0:
        raise ValueError(f"time_budget_s must be > 0, got {time_budget_s}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    groups = prepare_groups(reader, examples, seed=seed)
    if not groups:
        raise ValueError("no training question has a retrieved passage containing its answer")
    steps_per_epoch = math.ceil(len(groups) / batch_size)
    if max_steps is not None:
        total = max_steps
    elif time_budget_s is not None and epochs is None:
        total = None
    else:
        total = max(1, int(round(epochs * steps_per_epoch)))
    if device is not None:
        reader.to(device)
    if attention_dropout is not None:
        from fastdpr.train.trainer import set_attention_dropout

        set_attention_dropout(reader.encoder, attention_dropout)
    if bf16:
        from fastdpr.models.attention import use_fp32_cpu_attention

        use_fp32_cpu_attention(reader.encoder)  # bf16 attention backward is the slow part of a CPU step
    if freeze_word_embeddings:
        # half of a MiniLM's parameters are its word embeddings: freezing them halves the optimizer's work and
        # skips their (dense) gradient, at little cost to a short fine-tuning
        reader.encoder.get_input_embeddings().weight.requires_grad_(False)
    decay, no_decay = [], []
    for name, param in reader.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "bias" in name else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    counters = {"step": 0, "elapsed": 0.0, "cpu": 0.0, "seen": 0, "epoch": 0, "batch": 0, "loss": float("nan")}

    def fraction() -> float:
        """How far training is, 0..1: by steps, by time, or by whichever is further along."""
        parts = []
        if total is not None:
            parts.append(counters["step"] / total)
        if time_budget_s is not None:
            parts.append(counters["elapsed"] / time_budget_s)
        return max(parts)

    def lr_factor(_: int) -> float:
        f = fraction()
        if warmup_fraction > 0 and f < warmup_fraction:
            return max(f, 1e-3) / warmup_fraction
        return max(0.0, (1.0 - f) / max(1e-9, 1.0 - warmup_fraction))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    checkpoint = _Checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    if checkpoint is not None:
        restored = checkpoint.load(reader, optimizer, schedule)
        if restored is not None:
            counters.update(restored)
    device_of = reader.span_head.weight.device
    reader.train(True)
    epoch_rng = lambda epoch: random.Random(f"{seed}/{epoch}")  # noqa: E731 - resumable: an epoch's order from its number
    batches = _batches(groups, batch_size, epoch_rng(counters["epoch"]))
    last_save = time.perf_counter()
    bar_total = total if total is not None else None
    with progress(total=bar_total, desc="train reader", unit="step", enabled=show_progress,
                  initial=counters["step"]) as bar:
        while fraction() < 1.0:
            if counters["batch"] >= len(batches):
                counters["epoch"] += 1
                counters["batch"] = 0
                batches = _batches(groups, batch_size, epoch_rng(counters["epoch"]))
            batch = [groups[i] for i in batches[counters["batch"]]]
            counters["batch"] += 1
            began, began_cpu = time.perf_counter(), time.process_time()
            # a generator per step: a resumed run samples the same negatives as an uninterrupted one
            step_rng = random.Random(f"{seed}/steps/{counters['step']}")
            questions, passages, group_of_row, positive_rows, positive_spans = [], [], [], [], []
            for g, group in enumerate(batch):
                positive, spans = step_rng.choice(group.positives)
                negatives = step_rng.sample(group.negatives, min(n_passages - 1, len(group.negatives)))
                positive_rows.append(len(passages))
                positive_spans.append(spans)
                for p in [positive] + negatives:
                    questions.append(group.question)
                    passages.append(p)
                    group_of_row.append(g)
            inputs = reader.tokenize(questions, passages)
            with autocast(device_of, bf16):
                start, end, relevance = reader(inputs)
            start, end, relevance = start.float(), end.float(), relevance.float()
            allowed = inputs.allowed_mask().to(start.device)
            first = inputs.passage_start.tolist()
            absolute = [[(a + first[r], b + first[r]) for a, b in spans]
                        for r, spans in zip(positive_rows, positive_spans)]
            span_loss, select_loss = reader_loss(
                start, end, relevance, allowed, torch.tensor(positive_rows), absolute,
                torch.tensor(group_of_row, device=start.device), len(batch), shared_normalization,
            )
            loss = span_loss + select_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(reader.parameters(), grad_clip)
            optimizer.step()
            counters["step"] += 1
            counters["seen"] += len(batch)
            counters["elapsed"] += time.perf_counter() - began
            counters["cpu"] += time.process_time() - began_cpu
            schedule.step()
            counters["loss"] = float(loss.detach())
            if log is not None:
                log.append({"step": counters["step"] - 1, "loss": counters["loss"],
                            "span": float(span_loss.detach()), "select": float(select_loss.detach()),
                            "lr": optimizer.param_groups[0]["lr"]})
            bar.update(1)
            bar.set_postfix(loss=f"{counters['loss']:.3f}")
            if callback is not None and callback_every and counters["step"] % callback_every == 0:
                callback(dict(counters), reader)
                reader.train(True)
            if checkpoint is not None and time.perf_counter() - last_save >= checkpoint_every_s:
                checkpoint.save(reader, optimizer, schedule, counters)
                last_save = time.perf_counter()
    if checkpoint is not None:
        checkpoint.save(reader, optimizer, schedule, counters)
    reader.train(False)
    return {"steps": counters["step"], "questions": len(groups), "examples_seen": counters["seen"],
            "loss": counters["loss"], "seconds": round(counters["elapsed"], 1),
            "cpu_seconds": round(counters.get("cpu", 0.0), 1),
            "stopped_by": "time" if time_budget_s is not None and counters["elapsed"] >= time_budget_s else "steps"}
