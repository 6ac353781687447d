"""The dual-encoder training loop: in-batch + hard negatives, GradCache, mixed precision, DDP, exact resume.

Usage::

    from fastdpr.models import BiEncoder
    from fastdpr.train import Trainer, TrainingArguments, load_examples

    model = BiEncoder.from_pretrained("bert-base-uncased-dir")
    args = TrainingArguments(output_dir="model/", batch_size=128, n_hard=1, epochs=40, grad_cache=True,
                             chunk_size=32, precision="bf16")
    Trainer(model, args, load_examples("train.dpr.json"), dev_examples=load_examples("dev.dpr.json")).train()

Under ``torchrun --nproc-per-node K`` the same code trains data-parallel: ``batch_size`` is the *global* batch (the
negatives pool), split evenly over the ranks, and every rank scores its questions against all of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from fastdpr.errors import InputError
from fastdpr.train import checkpoint as ckpt
from fastdpr.train import distributed
from fastdpr.train.data import Batch, BatchBuilder, Example
from fastdpr.train.grad_cache import GradCacheStep, split_tokens
from fastdpr.train.loss import LossFn, batch_loss, fused_inbatch_nll, place_columns

PRECISIONS = ("fp32", "bf16", "fp16")
BEST_METRICS = {"avg_rank": False, "loss": False}  # name -> higher is better (top-k metrics added: True)


@dataclass
class TrainingArguments:
    """Settings of a training run. Defaults follow DPR (docs/architecture.md §4.9): batch 128 with one hard negative per question,
    lr 2e-5 with linear warm-up then decay, gradient clipping at 2.0, Adam(W), 40 epochs.

    ``batch_size`` is the global number of questions per optimizer step (across all ranks); ``warmup_steps``
    below 1 is read as a fraction of the total steps."""

    output_dir: str
    batch_size: int = 128
    n_hard: int = 1
    n_random: int = 0
    epochs: int = 40
    max_steps: int = 0  # > 0 stops early (and sizes the schedule) at this many optimizer steps
    lr: float = 2e-5
    warmup_steps: float = 0
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 2.0
    precision: str = "fp32"
    grad_cache: bool = False
    # GradCache's own term (Gao et al., 2021): texts per encoder call; the loss's row chunks are `chunk_rows`
    chunk_size: int = 32
    gradient_checkpointing: bool = False
    bidirectional: bool = False
    # > 0: each question's softmax covers only its group of this many consecutive questions of the batch (their
    # positives and hard negatives), the rest of the batch is not its negatives: the number of negatives can then
    # be varied at a fixed batch, encoding and step count (benchmarks/negatives_bench.py). 0: the whole batch
    group_size: int = 0
    # query-side fine-tuning: the passage tower is frozen (a shared tower is untied first), so the vectors it
    # encoded stay valid and the index needs no re-encoding; `negatives_from` (a `fastdpr encode` output of this
    # model) adds that pool as negatives of every question: all of it (`pool_negatives` 0) or the union of each
    # question's `pool_negatives` best by its current vector (fastdpr/train/pool.py)
    freeze_passages: bool = False
    negatives_from: str | None = None
    pool_negatives: int = 0
    # < 1: every saved or validated model is start + interpolate·(trained − start), the trained weights averaged
    # with the starting ones (WiSE-FT, Wortsman et al., CVPR 2022): fine-tuning a pretrained retriever on a few
    # thousand questions keeps most of its gain on the new data and forgets much less of what it knew
    interpolate: float = 1.0
    freeze_word_embeddings: bool = False  # the vocabulary matrix is half of a small encoder's weights
    # dropout on attention probabilities while training (None: the encoder's own). On a CPU torch's fused
    # attention has no dropout, so any value above 0 runs every attention unfused: a step of the recipe took
    # 1.6x as long with the encoder's 0.1 (MiniLM, batch 32, bf16, one thread)
    attention_dropout: float | None = None
    loss_backend: str = "auto"  # fastdpr.kernels.inbatch_nll backend: auto | triton | torch
    sample_positive: bool = False  # DPR takes the first positive; True samples one per epoch
    shuffle: bool = True
    seed: int = 12345
    logging_steps: int = 10
    eval_steps: int = 0  # 0: validate at the end of every epoch (when a dev set is given)
    save_steps: int = 0  # 0: checkpoint at the end of every epoch
    save_total_limit: int = 2  # periodic checkpoints kept (the best one is kept apart in <output_dir>/best)
    best_metric: str = "avg_rank"  # avg_rank | loss | top<k> (top-k needs a corpus)
    dev_batch_size: int = 0  # 0: same as batch_size
    dev_max_questions: int = 2000  # questions in the average-rank pool
    topk: tuple[int, ...] = (1, 5, 20, 100)
    device: str | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for name in ("batch_size", "epochs", "chunk_size", "logging_steps"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)!r}")
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
        if not 0.0 <= self.interpolate <= 1.0:
            raise InputError(f"interpolate must be between 0 and 1, got {self.interpolate!r}")
        if self.attention_dropout is not None and not 0.0 <= self.attention_dropout < 1.0:
            raise InputError(f"attention_dropout must be in [0, 1), got {self.attention_dropout!r}")
        if self.lr <= 0:
            raise InputError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise InputError(f"warmup must be >= 0, got {self.warmup_steps}")
        if not (self.best_metric in BEST_METRICS or _topk_of(self.best_metric)):
            raise InputError(f"best_metric must be avg_rank, loss or top<k>, got {self.best_metric!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _topk_of(metric: str) -> int | None:
    if metric.startswith("top") and metric[3:].isdigit():
        return int(metric[3:])
    return None


def trim_padding(tokens: dict) -> dict:
    """Drop trailing columns that are padding in every row (right-padded input), so a chunk costs its own length."""
    mask = tokens["attention_mask"]
    width = int(mask.sum(dim=1).max()) if mask.numel() else 0
    if width == mask.shape[1]:
        return tokens
    return {k: (v[:, :width] if v.dim() == 2 and v.shape[1] == mask.shape[1] else v) for k, v in tokens.items()}


class Trainer:
    """Trains a ``BiEncoder`` on :class:`~fastdpr.train.data.Example` lists.

    ``loss_fn`` defaults to the fused ``fastdpr.kernels.inbatch_nll``; ``callbacks`` are called as
    ``fn(trainer, record)`` after every optimizer step (``record`` holds step, epoch, loss, lr).
    ``corpus`` (a ``fastdpr.data.Corpus`` or a path) turns on top-k accuracy during validation."""

    def __init__(
        self,
        model: torch.nn.Module,
        args: TrainingArguments,
        train_examples: list[Example],
        dev_examples: list[Example] | None = None,
        corpus=None,
        loss_fn: LossFn | None = None,
        callbacks: Iterable[Callable[["Trainer", dict], None]] = (),
    ):
        self.model = model
        self.args = args
        self.train_examples = train_examples
        self.dev_examples = dev_examples or None
        self.corpus = corpus
        self.loss_fn = loss_fn
        self.callbacks = list(callbacks)
        self.output_dir = Path(args.output_dir)
        # <output_dir>/model: the final model; /best: the best by validation; /checkpoints; metrics.jsonl
        self.final_model_dir = self.output_dir / "model"
        self.best_model_dir = self.output_dir / "best"
        self.builder = BatchBuilder(
            train_examples, args.batch_size, n_hard=args.n_hard, n_random=args.n_random, seed=args.seed,
            shuffle=args.shuffle, sample_positive=args.sample_positive,
        )
        if self.builder.batches_per_epoch == 0:
            raise InputError(
                f"{len(train_examples)} training questions make no full batch of {args.batch_size}; "
                "lower --batch-size"
            )
        if _topk_of(args.best_metric) and corpus is None:
            raise InputError(f"best_metric {args.best_metric!r} needs a corpus for top-k accuracy")
        self.state = {"step": 0, "epoch": 0, "position": 0, "best": None, "best_step": None}
        self._prepared = False
        self._start_state = None

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        if self._prepared:
            return
        args = self.args
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if args.device:
            self.device = torch.device(args.device)
        else:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda" and self.device.index is None:  # one GPU per process under torchrun
            self.device = torch.device("cuda", local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        distributed.init_from_env(self.device)
        self.rank, self.world = distributed.rank(), distributed.world_size()
        if args.batch_size % self.world:
            raise InputError(f"--batch-size {args.batch_size} must be divisible by the {self.world} ranks")
        if self.loss_fn is None:
            self.loss_fn = functools.partial(fused_inbatch_nll(), backend=args.loss_backend)
        self.pool = None
        if args.freeze_passages:
            if self.world > 1:
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
        # BiEncoder.forward(q_tokens, p_tokens) -> (q, p) runs both towers in one call, so DDP (which hooks
        # forward) sees every encoder call
        self.pair = self.model
        # also in a single process, so that optimizer states (and checkpoints) do not depend on the world size
        self._freeze_unreached_parameters()
        if args.attention_dropout is not None:
            set_attention_dropout(self.model, args.attention_dropout)
        if args.precision != "fp32":
            from fastdpr.models.attention import use_fp32_cpu_attention

            # on CPUs the bf16 attention backward is 2-4x slower than fp32's at small head dimensions
            use_fp32_cpu_attention(self.model)
        if args.freeze_word_embeddings:
            for module in (self.model.question_encoder, self.model.passage_encoder):
                embeddings = getattr(getattr(module, "embeddings", None), "word_embeddings", None)
                if embeddings is not None:
                    embeddings.weight.requires_grad_(False)
        # the starting weights, kept (on the CPU) for interpolation
        self._start_state = ({k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
                             if args.interpolate < 1.0 else None)
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            # encoders have no running statistics: skip the per-forward buffer broadcast (the keyword was
            # renamed in recent torch)
            no_buffer_sync = ({"forward_sync_buffers": False}
                              if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                              else {"broadcast_buffers": False})
            self.encoder = DistributedDataParallel(
                self.pair, device_ids=[self.device.index] if self.device.type == "cuda" else None, **no_buffer_sync
            )
        else:
            self.encoder = self.pair
        self.optimizer = self._make_optimizer()
        self.total_steps = self._total_steps()
        warmup = args.warmup_steps
        warmup = int(round(warmup * self.total_steps)) if 0 < warmup < 1 else int(warmup)
        from transformers import get_linear_schedule_with_warmup

        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup, self.total_steps)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=args.precision == "fp16")
        cuda_devices = [self.device] if self.device.type == "cuda" else []
        self.grad_cache = GradCacheStep(self.encoder, autocast=self._autocast, cuda_devices=cuda_devices)
        self._prepared = True

    def _autocast(self):
        if self.args.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.args.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _total_steps(self) -> int:
        full = self.args.epochs * self.builder.batches_per_epoch
        return min(full, self.args.max_steps) if self.args.max_steps > 0 else full

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # no weight decay on biases and LayerNorm weights (BERT fine-tuning practice, as in DPR)
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
        groups = [{"params": decay, "weight_decay": self.args.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=self.args.lr, eps=self.args.adam_eps,
                                 betas=tuple(self.args.adam_betas))

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
            q, p = self.pair(probe_q, probe_p)
            (q.sum() + p.sum()).backward()
        for param in self.model.parameters():
            if param.requires_grad and param.grad is None:
                param.requires_grad_(False)
            param.grad = None
        self.model.train(was_training)

    def _to_device(self, tokens: dict) -> dict:
        return {k: v.to(self.device) for k, v in tokens.items()}

    # ------------------------------------------------------------------ one step
    def _tokens(self, local: Batch) -> tuple[dict, dict]:
        q = self.model.tokenize_questions(local.questions)
        p = self.model.tokenize_passages([(c["title"], c["text"]) for c in local.passages])
        return self._to_device(q), self._to_device(p)

    def training_step(self, batch: Batch) -> torch.Tensor:
        """Forward + backward of one global batch on this rank (no optimizer step); returns the global loss."""
        self._setup()
        local = batch.shard(self.rank, self.world) if self.world > 1 else batch
        scale = float(self.model.scale)
        world_scale = distributed.loss_scale()

        def loss_from_reps(q, p):
            loss = batch_loss(q, p, local, batch, scale=scale, loss_fn=self.loss_fn,
                              bidirectional=self.args.bidirectional, group_size=self.args.group_size or None)
            return loss * world_scale

        def backward(loss):
            self.scaler.scale(loss).backward()

        self.model.train()
        q_tokens, p_tokens = self._tokens(local)
        if self.args.freeze_passages:
            return self._question_side_step(local, batch, q_tokens, p_tokens, scale, backward)
        if self.args.grad_cache:
            c = self.args.chunk_size
            q_chunks = [trim_padding(t) for t in split_tokens(q_tokens, c)]
            p_chunks = [trim_padding(t) for t in split_tokens(p_tokens, c)]
            loss = self.grad_cache(q_chunks, p_chunks, loss_from_reps, backward)
        else:
            with self._autocast():
                q, p = self.encoder(q_tokens, p_tokens)
            loss = loss_from_reps(q, p)
            backward(loss)
            loss = loss.detach()
        return loss / world_scale

    def _question_side_step(self, local: Batch, batch: Batch, q_tokens: dict, p_tokens: dict, scale: float,
                            backward) -> torch.Tensor:
        """A step with the passage tower frozen: the batch's passages are encoded once without a graph (in eval
        mode, so exactly as the corpus was), the pool joins them as columns, and only questions get gradients."""
        self.model.passage_encoder.eval()
        chunk = self.args.chunk_size if self.args.grad_cache else max(1, p_tokens["input_ids"].shape[0])
        with torch.no_grad(), self._autocast():
            p_real = torch.cat([self.pair(None, trim_padding(t))[1] for t in split_tokens(p_tokens, chunk)])

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
            q_chunks = [trim_padding(t) for t in split_tokens(q_tokens, self.args.chunk_size)]
            return self.grad_cache(q_chunks, [], loss_from_reps, backward)
        with self._autocast():
            q = self.encoder(q_tokens, None)[0]
        loss = loss_from_reps(q)
        backward(loss)
        return loss.detach()

    def optimizer_step(self) -> float:
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ loop
    def train(self, resume: bool = False) -> dict:
        """Train to the end (``epochs`` or ``max_steps``); with ``resume`` continue from the latest checkpoint in
        ``output_dir`` exactly where it stopped. Returns the final state (step, last loss, best metric)."""
        self._setup()
        args = self.args
        is_main = self.rank == 0
        if resume:
            self._resume()
        else:
            self._seed_fresh()
        if is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            from fastdpr.atomic import write_json

            write_json(self.output_dir / "training_args.json", {**args.to_dict(), "world_size": self.world})
        metrics = self.output_dir / "metrics.jsonl"
        if is_main and resume:
            _truncate_metrics(metrics, self.state["step"])

        from fastdpr.progress import announce, progress

        # the progress every long stage shows: a bar on a terminal, a timed line in a log (a step of a large batch
        # on a CPU takes long enough that lines every `logging_steps` steps leave a log silent for minutes)
        bar = progress(total=self.total_steps, initial=self.state["step"], desc="train", unit="step",
                       enabled=is_main and args.show_progress)
        # the first progress line comes only after a step: say at once what is under way
        announce(f"train: {self.total_steps - self.state['step']:,} steps of {args.batch_size} questions to go",
                 enabled=is_main and args.show_progress)
        bpe = self.builder.batches_per_epoch
        # examples/s counts training steps only (not validation or checkpoint writing)
        window_loss, window_steps, window_time = 0.0, 0, 0.0
        last_loss = float("nan")
        last_saved = last_evaluated = self.state["step"]
        while self.state["step"] < self.total_steps:
            epoch, start = self.state["epoch"], self.state["position"]
            order = self.builder.order(epoch)
            for position in range(start, bpe):
                started = time.perf_counter()
                batch = self.builder.batch(epoch, position, order)
                loss = float(self.training_step(batch))
                grad_norm = self.optimizer_step()
                window_time += time.perf_counter() - started
                step = self.state["step"] + 1
                end_of_epoch = position + 1 == bpe
                self.state.update(step=step, epoch=epoch + end_of_epoch, position=0 if end_of_epoch else position + 1)
                last_loss = loss
                window_loss += loss
                window_steps += 1
                record = {"step": step, "epoch": epoch, "loss": loss, "lr": self.scheduler.get_last_lr()[0],
                          "grad_norm": grad_norm}
                bar.set_postfix(loss=f"{loss:.4f}")
                bar.update(1)
                done = step >= self.total_steps
                if step % args.logging_steps == 0 or done:
                    if is_main:
                        logged = {**record, "loss": window_loss / window_steps,
                                  "examples_per_s": window_steps * args.batch_size / max(window_time, 1e-9)}
                        _append_jsonl(metrics, logged)
                    window_loss, window_steps, window_time = 0.0, 0, 0.0
                if self.dev_examples and ((args.eval_steps and step % args.eval_steps == 0)
                                          or (not args.eval_steps and end_of_epoch) or done):
                    if step != last_evaluated:
                        self._validate_and_keep_best(metrics)
                        last_evaluated = step
                if (args.save_steps and step % args.save_steps == 0) or (not args.save_steps and end_of_epoch) or done:
                    self.save_checkpoint()
                    last_saved = step
                for callback in self.callbacks:
                    callback(self, record)
                if done:
                    break
        if self.state["step"] != last_saved:
            self.save_checkpoint()
        bar.close()
        if is_main:
            with self.interpolated():
                self.model.save_pretrained(str(self.final_model_dir))
        distributed.barrier()
        return {"step": self.state["step"], "loss": last_loss, "best": self.state["best"],
                "best_step": self.state["best_step"]}

    def _seed_fresh(self) -> None:
        seed = self.args.seed + self.rank  # different dropout draws per rank
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path | None:
        """Write ``<output_dir>/checkpoints/step-N`` (all ranks must call it; rank 0 writes)."""
        rng_states = [ckpt.rng_state()]
        if self.world > 1:
            gathered: list = [None] * self.world
            torch.distributed.all_gather_object(gathered, rng_states[0])
            rng_states = gathered
        path = None
        if self.rank == 0:
            step = self.state["step"]
            tmp = ckpt.begin(self.output_dir, step)
            trainer_state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "state": dict(self.state),
                "world_size": self.world,
            }
            readable = {**self.state, "total_steps": self.total_steps, "world_size": self.world}
            ckpt.write_state(tmp, self.model, trainer_state, readable, rng_states)
            best = self.output_dir / "checkpoints" / f"step-{self.state['best_step']:08d}" \
                if self.state["best_step"] is not None else None
            path = ckpt.commit(tmp, self.output_dir, step, self.args.save_total_limit, protect=best)
        distributed.barrier()
        return path

    def _resume(self) -> None:
        latest = ckpt.latest_checkpoint(self.output_dir)
        if latest is None:
            raise InputError("no checkpoint to resume from", path=str(ckpt.checkpoint_root(self.output_dir)))
        state, rng = ckpt.load_state(latest, self.rank, map_location=self.device)
        saved = type(self.model).from_pretrained(str(latest / "model"))
        self.model.load_state_dict(saved.state_dict())
        del saved
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.state = dict(state["state"])
        if rng is not None and state.get("world_size", 1) == self.world:
            ckpt.set_rng_state(rng)
        else:  # a different number of ranks cannot replay the same dropout draws; reseed from the step
            torch.manual_seed(self.args.seed + self.rank + 1_000_003 * self.state["step"])

    # ------------------------------------------------------------------ validation
    @contextlib.contextmanager
    def interpolated(self):
        """The model holds start + interpolate·(trained − start) inside the block, its trained weights after."""
        if self._start_state is None:
            yield self.model
            return
        trained = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        alpha = self.args.interpolate
        mixed = {k: (torch.lerp(self._start_state[k].to(v.device, v.dtype), v, alpha) if v.is_floating_point()
                     else v) for k, v in trained.items()}
        self.model.load_state_dict(mixed)
        try:
            yield self.model
        finally:
            self.model.load_state_dict(trained)

    def _validate_and_keep_best(self, metrics_path: Path) -> None:
        with self.interpolated():  # the model that will be saved is the one validated
            self._validate_and_keep_best_now(metrics_path)

    def _validate_and_keep_best_now(self, metrics_path: Path) -> None:
        result = self.validate() if self.rank == 0 else None
        if self.rank == 0:
            _append_jsonl(metrics_path, {"step": self.state["step"], **{f"dev_{k}": v for k, v in result.items()}})
            name = self.args.best_metric
            value = result[name]
            higher = bool(_topk_of(name))
            best = self.state["best"]
            if best is None or (value > best if higher else value < best):
                self.state.update(best=value, best_step=self.state["step"])
                self.model.save_pretrained(str(self.best_model_dir))
                from fastdpr.atomic import write_json

                write_json(self.best_model_dir / "validation.json",
                           {"step": self.state["step"], "metric": name, **result})
        if self.world > 1:  # every rank needs the same best/best_step for identical checkpoints
            shared = [self.state["best"], self.state["best_step"]]
            torch.distributed.broadcast_object_list(shared, src=0)
            self.state.update(best=shared[0], best_step=shared[1])

    @torch.no_grad()
    def validate(self) -> dict:
        """DPR's validation on the dev set: mean in-batch loss, and the average rank (0 = first) of each question's
        positive among all dev passages in the pool (positives + hard negatives of up to ``dev_max_questions``
        questions, each distinct passage once). With a corpus, also top-k accuracy of exact search over it."""
        self._setup()
        args = self.args
        dev = self.dev_examples
        was_training = self.model.training
        self.model.eval()
        try:
            size = min(args.dev_batch_size or args.batch_size, len(dev))
            builder = BatchBuilder(dev, size, n_hard=args.n_hard, n_random=0, seed=args.seed, shuffle=False,
                                   sample_hard=False)
            losses, q_pool, p_pool, key_pool, pos_cols = [], [], [], [], []
            offset, pool_questions = 0, 0
            for position in range(builder.batches_per_epoch):
                batch = builder.batch(0, position)
                q_tokens, p_tokens = self._tokens(batch)
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
        qs = [self.pair(trim_padding(t), None)[0].float() for t in split_tokens(q_tokens, c)]
        c = self.args.chunk_size if self.args.grad_cache else max(p_tokens["input_ids"].shape[0], 1)
        ps = [self.pair(None, trim_padding(t))[1].float() for t in split_tokens(p_tokens, c)]
        return torch.cat(qs), torch.cat(ps)

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


def _append_jsonl(path: Path, record: dict) -> None:
    # the metrics log grows line by line (flushed per record) so a crash keeps everything logged so far
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop records of steps the run will repeat (they were logged after the checkpoint)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    from fastdpr.atomic import write_text

    write_text(path, "".join(line + "\n" for line in kept))


def set_attention_dropout(model: torch.nn.Module, p: float) -> int:
    """Set the dropout applied to attention probabilities in every self-attention block of ``model`` (the
    ``dropout`` of ``transformers``' ``*SelfAttention`` modules, which their fused attention call reads); returns
    how many were set. The saved config keeps the encoder's own value."""
    count = 0
    for module in model.modules():
        dropout = getattr(module, "dropout", None)
        if "SelfAttention" in type(module).__name__ and isinstance(dropout, torch.nn.Dropout):
            dropout.p = p
            count += 1
    return count
