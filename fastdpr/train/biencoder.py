"""The dual encoder as a training task: its settings (:class:`BiEncoderArguments`), in-batch + hard negatives, the
fused loss, GradCache, a frozen passage tower with pool negatives, and DPR's validation (average rank, top-k
accuracy). The loop and its settings are the Trainer's (fastdpr/train/trainer.py)."""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastdpr.errors import InputError
from fastdpr.train import distributed
from fastdpr.train.data import Batch, BatchBuilder, Example
from fastdpr.train.grad_cache import GradCacheStep, length_sorted_chunks
from fastdpr.train.loss import LossFn, batch_loss, fused_inbatch_nll, place_columns
from fastdpr.train.task import Task

if TYPE_CHECKING:
    from fastdpr.train.trainer import Trainer, TrainingArguments

BEST_METRICS = ("avg_rank", "loss")  # lower is better; top<k> metrics (higher is better) need a corpus
#: the settings of the model itself: None keeps the starting point's
MODEL_SETTINGS = ("pooling", "similarity", "temperature", "shared", "max_question_length", "max_passage_length")


def topk_of(metric: str) -> int | None:
    """k of a ``top<k>`` metric name, else None."""
    if metric.startswith("top") and metric[3:].isdigit():
        return int(metric[3:])
    return None


@dataclass
class BiEncoderArguments:
    """Settings of dual-encoder training (the loop's are ``TrainingArguments``). Defaults follow DPR
    (docs/architecture.md §4.9): one hard negative per question, the first positive, the whole batch as negatives."""

    # the model, when the task loads it (None: the starting point's own)
    pooling: str | None = None  # cls | mean
    similarity: str | None = None  # dot | cosine
    temperature: float | None = None  # cosine scores are divided by it
    shared: bool | None = None  # one tower for questions and passages
    max_question_length: int | None = None
    max_passage_length: int | None = None
    # the batch: each question brings its positive, n_hard hard and n_random random negatives
    n_hard: int = 1
    n_random: int = 0
    sample_positive: bool = False  # DPR takes the first positive; True samples one per epoch
    shuffle: bool = True
    # > 0: each question's softmax covers only its group of this many consecutive questions of the batch (their
    # positives and hard negatives), the rest of the batch is not its negatives: the number of negatives can then
    # be varied at a fixed batch, encoding and step count (benchmarks/negatives_bench.py). 0: the whole batch
    group_size: int = 0
    bidirectional: bool = False  # add the passage-to-question loss (GTR)
    loss_backend: str = "auto"  # fastdpr.kernels.inbatch_nll backend: auto | triton | torch | reference
    grad_cache: bool = False
    # GradCache's own term (Gao et al., 2021): texts per encoder call; the loss's row chunks are `chunk_rows`
    chunk_size: int = 32
    gradient_checkpointing: bool = False
    freeze_word_embeddings: bool = False  # the vocabulary matrix is half of a small encoder's weights
    # query-side fine-tuning: the passage tower is frozen (a shared tower is untied first), so the vectors it
    # encoded stay valid and the index needs no re-encoding; `negatives_from` (a `fastdpr encode` output of this
    # model) adds that pool as negatives of every question: all of it (`pool_negatives` 0) or the union of each
    # question's `pool_negatives` best by its current vector (fastdpr/train/pool.py)
    freeze_passages: bool = False
    negatives_from: str | None = None
    pool_negatives: int = 0
    # validation
    best_metric: str = "avg_rank"  # avg_rank | loss | top<k> (top-k needs a corpus)
    dev_batch_size: int = 0  # 0: the training batch size
    dev_max_questions: int = 2000  # questions in the average-rank pool
    topk: tuple[int, ...] = (1, 5, 20, 100)

    def __post_init__(self) -> None:
        if self.pooling not in (None, "cls", "mean"):
            raise InputError(f"pooling must be cls or mean, got {self.pooling!r}")
        if self.similarity not in (None, "dot", "cosine"):
            raise InputError(f"similarity must be dot or cosine, got {self.similarity!r}")
        if self.temperature is not None and self.temperature <= 0:
            raise InputError(f"temperature must be > 0, got {self.temperature!r}")
        for name in ("max_question_length", "max_passage_length"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if int(self.chunk_size) < 1:
            raise InputError(f"chunk_size must be >= 1, got {self.chunk_size!r}")
        if int(self.group_size) < 0:
            raise InputError(f"group_size must be >= 0 (0: the whole batch), got {self.group_size!r}")
        if self.negatives_from and not self.freeze_passages:
            raise InputError("negatives_from needs freeze_passages: the pool's vectors are only valid while the "
                             "passage tower that encoded them stays as it is")
        if int(self.pool_negatives) < 0:
            raise InputError(f"pool_negatives must be >= 0 (0: the whole pool), got {self.pool_negatives!r}")
        if self.negatives_from and self.group_size:
            raise InputError("group_size and negatives_from cannot be combined: pool negatives belong to no group")
        if self.n_hard < 0 or self.n_random < 0:
            raise InputError("n_hard and n_random must be >= 0")
        if self.loss_backend not in ("auto", "triton", "torch", "reference"):
            raise InputError(f"loss_backend must be auto, triton, torch or reference, got {self.loss_backend!r}")
        if not (self.best_metric in BEST_METRICS or topk_of(self.best_metric)):
            raise InputError(f"best_metric must be avg_rank, loss or top<k>, got {self.best_metric!r}")

    def model_settings(self) -> dict:
        """The model settings given (not None), as ``BiEncoder.from_pretrained`` takes them."""
        return {name: getattr(self, name) for name in MODEL_SETTINGS if getattr(self, name) is not None}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def split_arguments(settings: dict) -> tuple["TrainingArguments", BiEncoderArguments]:
    """(``TrainingArguments``, :class:`BiEncoderArguments`) of one flat dict holding settings of both, each name
    going to the class that has it; a name of neither is an InputError."""
    from fastdpr.train.trainer import TrainingArguments

    loop = {f.name for f in dataclasses.fields(TrainingArguments)}
    task = {f.name for f in dataclasses.fields(BiEncoderArguments)}
    unknown = sorted(set(settings) - loop - task)
    if unknown:
        raise InputError(f"unknown training settings: {', '.join(unknown)}")
    return (TrainingArguments(**{k: v for k, v in settings.items() if k in loop}),
            BiEncoderArguments(**{k: v for k, v in settings.items() if k in task}))


def encode_length_sorted(tokens: dict, chunk_size: int, encode) -> torch.Tensor:
    """``encode`` over length-sorted chunks of ``tokens``, its rows back in batch order."""
    chunks, restore = length_sorted_chunks(tokens, chunk_size)
    return torch.cat([encode(t) for t in chunks])[restore]


class BiEncoderTask(Task):
    """Trains a ``BiEncoder`` on :class:`~fastdpr.train.data.Example` lists. ``model`` is a ``BiEncoder``, or the
    path of a starting point (a fastdpr, Hugging Face encoder or sentence-transformers directory) that the task
    loads with the model settings of ``args``. ``loss_fn`` defaults to the fused ``fastdpr.kernels.inbatch_nll``;
    ``dev_examples`` turn on validation, ``corpus`` (a ``fastdpr.data.Corpus`` or a path) adds top-k accuracy to
    it. The batches are the Trainer's ``batch_size`` questions, drawn with its ``seed``."""

    def __init__(self, model: torch.nn.Module | str | os.PathLike, train_examples: list[Example],
                 args: BiEncoderArguments | None = None, dev_examples: list[Example] | None = None, corpus=None,
                 loss_fn: LossFn | None = None):
        args = BiEncoderArguments() if args is None else args
        if not isinstance(args, BiEncoderArguments):
            raise InputError(f"args must be BiEncoderArguments, got {type(args).__name__}")
        if isinstance(model, (str, os.PathLike)):
            from fastdpr.models import BiEncoder

            model = BiEncoder.from_pretrained(model, **args.model_settings())
        elif args.model_settings():
            raise InputError(f"the model settings {', '.join(args.model_settings())} apply when the task loads "
                             "the model: give the path of the starting point instead of a loaded model")
        if topk_of(args.best_metric) and corpus is None:
            raise InputError(f"best_metric {args.best_metric!r} needs a corpus for top-k accuracy")
        self.model = model
        self.args = args
        self.train_examples = train_examples
        self.dev_examples = dev_examples or None
        self.corpus = corpus
        self.loss_fn = loss_fn
        self.last_parts = {}
        self.best_metric = args.best_metric
        self.higher_is_better = topk_of(args.best_metric) is not None
        self.builder: BatchBuilder | None = None  # made in prepare(), with the Trainer's batch size and seed
        self.batch_size = self.seed = None
        self.pool = None
        self._order: tuple[int, object] | None = None
        self._grad_cache: GradCacheStep | None = None

    @property
    def has_validation_data(self) -> bool:
        return bool(self.dev_examples)

    def arguments(self) -> dict:
        return self.args.to_dict()

    # ------------------------------------------------------------------ setup
    def prepare(self, trainer: "Trainer") -> None:
        args = self.args
        self.device = trainer.device
        self.batch_size, self.seed = trainer.args.batch_size, trainer.args.seed
        self.builder = BatchBuilder(
            self.train_examples, self.batch_size, n_hard=args.n_hard, n_random=args.n_random, seed=self.seed,
            shuffle=args.shuffle, sample_positive=args.sample_positive,
        )
        self.batches_per_epoch = self.builder.batches_per_epoch
        if self.batches_per_epoch == 0:
            raise InputError(f"{len(self.train_examples)} training questions make no full batch of "
                             f"{self.batch_size}; lower --batch-size")
        if self.loss_fn is None:
            self.loss_fn = functools.partial(fused_inbatch_nll(), backend=args.loss_backend)
        if args.freeze_passages:
            if trainer.world > 1:
                raise InputError("freeze_passages is not supported under torchrun yet: train on one device")
            self.model.untie()
            for module in (self.model.passage_encoder, self.model.passage_projection):
                for param in (module.parameters() if module is not None else ()):
                    param.requires_grad_(False)
            self.model.to(self.device)
        if args.negatives_from:
            from fastdpr.train.pool import PassagePool

            self.pool = PassagePool.load(args.negatives_from, self.model, self.device)
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # also in a single process, so that optimizer states (and checkpoints) do not depend on the world size
        self._freeze_unreached_parameters()
        if args.freeze_word_embeddings:
            for module in (self.model.question_encoder, self.model.passage_encoder):
                embeddings = getattr(getattr(module, "embeddings", None), "word_embeddings", None)
                if embeddings is not None:
                    embeddings.weight.requires_grad_(False)

    def _freeze_unreached_parameters(self) -> None:
        """Stop tracking parameters no output depends on (e.g. a BERT pooler the pooling ignores).

        DDP waits for a gradient of every tracked parameter and fails when one never comes. Such parameters get no
        gradient in single-process training either, so AdamW never moves them: freezing them changes nothing.
        The probe runs in eval mode with the generators forked, so it draws no random numbers of the run."""
        probe_q = self._to_device(self.model.tokenize_questions(["probe"]))
        probe_p = self._to_device(self.model.tokenize_passages([("probe", "probe")]))
        was_training = self.model.training
        self.model.eval()
        # enable_grad: the first call may come from validate(), which runs under no_grad
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), \
                torch.enable_grad():
            q, p = self.model(probe_q, probe_p)
            (q.sum() + p.sum()).backward()
        for param in self.model.parameters():
            if param.requires_grad and param.grad is None:
                param.requires_grad_(False)
            param.grad = None
        self.model.train(was_training)

    def _to_device(self, tokens: dict) -> dict:
        return {k: v.to(self.device) for k, v in tokens.items()}

    def grad_cache(self, trainer: "Trainer") -> GradCacheStep:
        # BiEncoder.forward(q_tokens, p_tokens) -> (q, p) runs both towers in one call, so DDP (which hooks
        # forward) sees every encoder call
        if self._grad_cache is None:
            cuda_devices = [self.device] if self.device.type == "cuda" else []
            self._grad_cache = GradCacheStep(trainer.encoder, autocast=trainer.autocast, cuda_devices=cuda_devices)
        return self._grad_cache

    # ------------------------------------------------------------------ batches
    def batch(self, epoch: int, position: int, step: int = 0) -> Batch:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.builder.order(epoch))
        return self.builder.batch(epoch, position, self._order[1])

    def examples_in(self, batch: Batch) -> int:
        return batch.size

    # ------------------------------------------------------------------ one step
    def tokens(self, local: Batch) -> tuple[dict, dict]:
        q = self.model.tokenize_questions(local.questions)
        p = self.model.tokenize_passages([(c["title"], c["text"]) for c in local.passages])
        return self._to_device(q), self._to_device(p)

    def step(self, trainer: "Trainer", batch: Batch) -> torch.Tensor:
        """Forward + backward of one global batch on this rank; returns the global loss."""
        local = batch.shard(trainer.rank, trainer.world) if trainer.world > 1 else batch
        scale = float(self.model.scale)
        world_scale = distributed.loss_scale()

        def loss_from_reps(q, p):
            loss = batch_loss(q, p, local, batch, scale=scale, loss_fn=self.loss_fn,
                              bidirectional=self.args.bidirectional, group_size=self.args.group_size or None)
            return loss * world_scale

        q_tokens, p_tokens = self.tokens(local)
        if self.args.freeze_passages:
            return self._question_side_step(trainer, local, batch, q_tokens, p_tokens, scale)
        if self.args.grad_cache:
            q_chunks, q_restore = length_sorted_chunks(q_tokens, self.args.chunk_size)
            p_chunks, p_restore = length_sorted_chunks(p_tokens, self.args.chunk_size)
            loss = self.grad_cache(trainer)(
                q_chunks, p_chunks, lambda q, p: loss_from_reps(q[q_restore], p[p_restore]), trainer.backward)
        else:
            with trainer.autocast():
                q, p = trainer.encoder(q_tokens, p_tokens)
            loss = loss_from_reps(q, p)
            trainer.backward(loss)
            loss = loss.detach()
        return loss / world_scale

    def _question_side_step(self, trainer: "Trainer", local: Batch, batch: Batch, q_tokens: dict, p_tokens: dict,
                            scale: float) -> torch.Tensor:
        """A step with the passage tower frozen: the batch's passages are encoded once without a graph (in eval
        mode, so exactly as the corpus was), the pool joins them as columns, and only questions get gradients."""
        self.model.passage_encoder.eval()
        chunk = self.args.chunk_size if self.args.grad_cache else max(1, p_tokens["input_ids"].shape[0])
        with torch.no_grad(), trainer.autocast():
            p_real = encode_length_sorted(p_tokens, chunk, lambda t: self.model(None, t)[1])

        def loss_from_reps(q, _p=None):
            p = place_columns(p_real.to(q.dtype), local.passage_columns, local.n_columns)
            ids, valid = batch.column_ids.to(q.device), batch.column_valid.to(q.device)
            if self.pool is not None:
                extra, keys = self.pool.columns(q, self.args.pool_negatives)
                p = torch.cat([p, extra.to(q.dtype)])
                ids = torch.cat([ids, keys])
                valid = torch.cat([valid, torch.ones(keys.shape[0], dtype=torch.bool, device=q.device)])
            kwargs = {"group_size": self.args.group_size} if self.args.group_size else {}
            return self.loss_fn(q, p, batch.targets.to(q.device), scale=scale, column_ids=ids, column_valid=valid,
                                bidirectional=self.args.bidirectional, **kwargs)

        if self.args.grad_cache:
            q_chunks, q_restore = length_sorted_chunks(q_tokens, self.args.chunk_size)
            return self.grad_cache(trainer)(q_chunks, [], lambda q, _p: loss_from_reps(q[q_restore]),
                                            trainer.backward)
        with trainer.autocast():
            q = trainer.encoder(q_tokens, None)[0]
        loss = loss_from_reps(q)
        trainer.backward(loss)
        return loss.detach()

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self, trainer: "Trainer") -> dict | None:
        """DPR's validation on the dev set: mean in-batch loss, and the average rank (0 = first) of each question's
        positive among all dev passages in the pool (positives + hard negatives of up to ``dev_max_questions``
        questions, each distinct passage once). With a corpus, also top-k accuracy of exact search over it."""
        if not self.dev_examples:
            return None
        args = self.args
        dev = self.dev_examples
        was_training = self.model.training
        self.model.eval()
        try:
            size = min(args.dev_batch_size or self.batch_size, len(dev))
            builder = BatchBuilder(dev, size, n_hard=args.n_hard, n_random=0, seed=self.seed, shuffle=False,
                                   sample_hard=False)
            losses, q_pool, p_pool, key_pool, pos_cols = [], [], [], [], []
            offset, pool_questions = 0, 0
            for position in range(builder.batches_per_epoch):
                batch = builder.batch(0, position)
                q_tokens, p_tokens = self.tokens(batch)
                q, p_real = self._encode_chunked(q_tokens, p_tokens)
                p = place_columns(p_real, batch.passage_columns, batch.n_columns)
                losses.append(float(self.loss_fn(
                    q, p, batch.targets.to(q.device), scale=float(self.model.scale),
                    column_ids=batch.column_ids.to(q.device), column_valid=batch.column_valid.to(q.device),
                    bidirectional=args.bidirectional)))
                if pool_questions < args.dev_max_questions:
                    q_pool.append(q)
                    p_pool.append(p_real)
                    keys = batch.column_ids[batch.passage_columns]
                    key_pool.append(keys)
                    # positive of question i = position of column i*g among the real passages of the batch
                    real_index = torch.full((batch.n_columns,), -1, dtype=torch.int64)
                    real_index[batch.passage_columns] = torch.arange(len(batch.passages))
                    pos_cols.append(real_index[batch.targets] + offset)
                    offset += len(batch.passages)
                    pool_questions += batch.size
            result = {"loss": float(np.mean(losses)), "avg_rank": self._average_rank(q_pool, p_pool, key_pool, pos_cols)}
            if self.corpus is not None:
                result.update(self._topk_accuracy(dev[: args.dev_max_questions]))
            return result
        finally:
            self.model.train(was_training)

    def _encode_chunked(self, q_tokens: dict, p_tokens: dict) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.args.chunk_size if self.args.grad_cache else max(q_tokens["input_ids"].shape[0], 1)
        qs = encode_length_sorted(q_tokens, c, lambda t: self.model(t, None)[0].float())
        c = self.args.chunk_size if self.args.grad_cache else max(p_tokens["input_ids"].shape[0], 1)
        ps = encode_length_sorted(p_tokens, c, lambda t: self.model(None, t)[1].float())
        return qs, ps

    def _average_rank(self, q_pool, p_pool, key_pool, pos_cols) -> float:
        q, p = torch.cat(q_pool), torch.cat(p_pool)
        keys, positives = torch.cat(key_pool).to(q.device), torch.cat(pos_cols).to(q.device)
        scores = (q @ p.t()) * float(self.model.scale)
        positive_score = scores.gather(1, positives[:, None])
        # each passage competes once, however many questions brought it into the pool, and never against itself
        first = torch.zeros_like(keys, dtype=torch.bool)
        order = torch.argsort(keys, stable=True)
        sorted_keys = keys[order]
        first[order] = torch.cat([sorted_keys.new_ones(1, dtype=torch.bool), sorted_keys[1:] != sorted_keys[:-1]])
        same = keys[None, :] == keys[positives][:, None]
        ahead = (scores > positive_score) & ~same & first[None, :]
        return float(ahead.sum(dim=1).float().mean())

    def _topk_accuracy(self, examples: list[Example]) -> dict:
        """DPR top-k accuracy of exact search over the corpus, encoded a block at a time (never held whole)."""
        from fastdpr.eval import topk_accuracy
        from fastdpr.eval.retrieval import ranking_hits
        from fastdpr.index.flat import TopK

        corpus = self.corpus
        if isinstance(corpus, (str, os.PathLike)):
            from fastdpr.data import Corpus

            corpus = self.corpus = Corpus.open(corpus)
        size = self.args.chunk_size if self.args.grad_cache else 64
        questions = self.model.encode_questions([e.question for e in examples], batch_size=size,
                                                device=self.device, show_progress=False)
        k = min(max(self.args.topk), len(corpus))
        top = TopK(len(examples), k)
        block = 4096
        for start in range(0, len(corpus), block):
            rows = [corpus[i] for i in range(start, min(start + block, len(corpus)))]
            vectors = self.model.encode_passages(rows, batch_size=size, device=self.device, show_progress=False)
            top.add(questions @ vectors.T, start)
        _, found = top.result()
        hits = ranking_hits(found, [e.answers for e in examples], corpus)
        return topk_accuracy(hits, ks=tuple(x for x in self.args.topk if x <= k))
