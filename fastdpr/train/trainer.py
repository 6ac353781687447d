"""The training loop of every model (the dual encoder, the reader): schedule, weight decay, mixed precision, DDP,
checkpoints and exact resume, around a :class:`~fastdpr.train.task.Task` that knows the model, its batches and its
validation. This module knows no task: the dual encoder's is ``fastdpr.train.biencoder``, the reader's
``fastdpr.reader.training``.

Usage::

    from fastdpr.train import BiEncoderArguments, BiEncoderTask, Trainer, TrainingArguments, load_examples

    task = BiEncoderTask("bert-base-uncased-dir", load_examples("train.dpr.json"),
                         BiEncoderArguments(n_hard=1, grad_cache=True, chunk_size=32),
                         dev_examples=load_examples("dev.dpr.json"))
    Trainer(task, TrainingArguments(output_dir="model/", batch_size=128, epochs=40, precision="bf16")).train()

Under ``torchrun --nproc-per-node K`` the same code trains data-parallel: ``batch_size`` is the *global* batch,
split evenly over the ranks.
"""
from __future__ import annotations

import contextlib
import dataclasses
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
from fastdpr.train.schedule import linear_schedule, run_fraction
from fastdpr.train.task import Task

PRECISIONS = ("fp32", "bf16", "fp16")
ARGUMENTS_FILE = "training_args.json"
# settings that decide which examples a step takes: a resumed run must keep them to continue the run it resumes
_SAME_ON_RESUME = ("batch_size", "seed")


@dataclass
class TrainingArguments:
    """Settings of the training loop, whatever is trained (a task's own settings are the task's: the dual
    encoder's are ``fastdpr.train.biencoder.BiEncoderArguments``). Defaults follow DPR (docs/architecture.md §4.9):
    batch 128, lr 2e-5 with linear warm-up then decay, gradient clipping at 2.0, Adam(W), 40 epochs.

    ``batch_size`` is the global number of training examples per optimizer step (across all ranks);
    ``warmup_steps`` below 1 is read as a fraction of the total steps."""

    output_dir: str | None  # None: nothing is written (no checkpoints, metrics or final model)
    batch_size: int = 128
    epochs: int = 40  # 0: no bound by epochs (then max_steps or time_budget_s bounds the run)
    max_steps: int = 0  # > 0 stops early (and sizes the schedule) at this many optimizer steps
    # > 0: training stops once this many seconds of training steps have passed, and the schedule follows the
    # larger of the step and time fractions, so a run of any speed ends with the rate decayed to zero
    time_budget_s: float | None = None
    lr: float = 2e-5
    warmup_steps: float = 0
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 2.0
    precision: str = "fp32"
    # < 1: every saved or validated model is start + interpolate·(trained − start), the trained weights averaged
    # with the starting ones (WiSE-FT, Wortsman et al., CVPR 2022): fine-tuning a pretrained model on a few
    # thousand examples keeps most of its gain on the new data and forgets much less of what it knew
    interpolate: float = 1.0
    # dropout on attention probabilities while training (None: the encoder's own). On a CPU torch's fused
    # attention has no dropout, so any value above 0 runs every attention unfused, which is slower
    attention_dropout: float | None = None
    seed: int = 12345
    logging_steps: int = 10
    eval_steps: int = 0  # 0: validate at the end of every epoch (when the task has validation data)
    save_steps: int = 0  # 0: checkpoint at the end of every epoch
    save_every_s: float | None = None  # set: checkpoint by the clock instead, when this many seconds have passed
    save_total_limit: int = 2  # periodic checkpoints kept (the best one is kept apart in <output_dir>/best)
    device: str | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for name in ("batch_size", "logging_steps"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise InputError(f"time_budget_s must be > 0, got {self.time_budget_s!r}")
        if int(self.epochs) < 0 or (int(self.epochs) == 0 and self.max_steps <= 0 and not self.time_budget_s):
            raise InputError(f"epochs must be >= 1 (0 only with max_steps or time_budget_s), got {self.epochs!r}")
        if not 0.0 <= self.interpolate <= 1.0:
            raise InputError(f"interpolate must be between 0 and 1, got {self.interpolate!r}")
        if self.attention_dropout is not None and not 0.0 <= self.attention_dropout < 1.0:
            raise InputError(f"attention_dropout must be in [0, 1), got {self.attention_dropout!r}")
        if self.lr <= 0:
            raise InputError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise InputError(f"warmup must be >= 0, got {self.warmup_steps}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def read_arguments(path: str | Path) -> dict:
    """``{"training": ..., "task": ...}`` of a ``training_args.json``. A file of the earlier layout holds one flat
    dict of the loop's and the dual encoder's settings together: it is split by the names of
    :class:`TrainingArguments`' fields (the rest are the task's)."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read the training arguments: {err}", path=str(path)) from err
    if not isinstance(saved, dict):
        raise InputError("training arguments must be a JSON object", path=str(path))
    if "training" in saved:
        return {"training": dict(saved["training"]), "task": dict(saved.get("task") or {})}
    loop = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"training": {k: v for k, v in saved.items() if k in loop},
            "task": {k: v for k, v in saved.items() if k not in loop and k != "world_size"}}


class Trainer:
    """Trains the model of a :class:`~fastdpr.train.task.Task`: the loop, optimizer, schedule, mixed precision,
    checkpoints, resume and validation are the same whatever is trained (docs/architecture.md §4.8b).

    Validation runs when the task has validation data (``task.has_validation_data``): every ``eval_steps`` steps
    (0: every epoch) and at the end, through ``task.validate``; the model best by ``task.best_metric`` is kept in
    ``<output_dir>/best``. ``callbacks`` are called as ``fn(trainer, record)`` after every optimizer step
    (``record`` holds step, epoch, loss, lr and the task's ``last_parts``); their time is not counted as training
    time."""

    def __init__(self, task: Task, args: TrainingArguments,
                 callbacks: Iterable[Callable[["Trainer", dict], None]] = ()):
        if not isinstance(task, Task):
            raise InputError(f"the Trainer trains a fastdpr.train.task.Task, got {type(task).__name__} (the dual "
                             "encoder's task is fastdpr.train.biencoder.BiEncoderTask)")
        if not isinstance(args, TrainingArguments):
            raise InputError(f"args must be TrainingArguments, got {type(args).__name__}")
        self.task = task
        self.model = task.model
        self.args = args
        self.callbacks = list(callbacks)
        # <output_dir>/model: the final model; /best: the best by validation; /checkpoints; metrics.jsonl.
        # Without an output directory nothing is written (no checkpoints, so no resume either)
        self.output_dir = Path(args.output_dir) if args.output_dir is not None else None
        self.final_model_dir = self.output_dir / "model" if self.output_dir is not None else None
        self.best_model_dir = self.output_dir / "best" if self.output_dir is not None else None
        # seen: training examples; elapsed / cpu: seconds of training steps, wall clock and this process's CPU
        self.state = {"step": 0, "epoch": 0, "position": 0, "best": None, "best_step": None, "seen": 0,
                      "elapsed": 0.0, "cpu": 0.0}
        self._prepared = False
        self._start_state = None
        self._step_began: float | None = None  # perf_counter() at the start of the step under way

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
        self.model.to(self.device)
        self.task.prepare(self)
        if args.attention_dropout is not None:
            set_attention_dropout(self.model, args.attention_dropout)
        if self.device.type == "cpu":
            from fastdpr.models.attention import use_cpu_training_attention, use_seeded_dropout

            # seeded dropout (no per-element draws; in the attention no L x L tensors kept for the backward) and,
            # under autocast, attention in fp32, where torch's CPU attention backward is faster at the head
            # dimensions of small encoders (models/attention.py)
            use_cpu_training_attention(self.model)
            use_seeded_dropout(self.model)
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
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None, **no_buffer_sync
            )
        else:
            self.encoder = self.model
        self.optimizer = self._make_optimizer()
        self.total_steps = self._total_steps()
        warmup = args.warmup_steps
        if self.total_steps is None:
            if warmup >= 1:
                raise InputError("a run bounded by time only takes its warm-up as a fraction below 1, got "
                                 f"{warmup}")
            warmup_fraction = warmup
        else:
            warmup = int(round(warmup * self.total_steps)) if 0 < warmup < 1 else int(warmup)
            warmup_fraction = min(1.0, warmup / self.total_steps)
        self.scheduler = linear_schedule(self.optimizer, warmup_fraction, self._fraction_at)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=args.precision == "fp16")
        self._prepared = True

    def autocast(self):
        """The mixed-precision context of forward passes (``precision``), a no-op in fp32."""
        if self.args.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.args.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the fp16 grad scaler (a no-op scaling in other precisions)."""
        self.scaler.scale(loss).backward()

    def _total_steps(self) -> int | None:
        """Optimizer steps the run takes: ``epochs`` (0: no bound by epochs), capped by ``max_steps``; None when
        only ``time_budget_s`` bounds it."""
        bounds = [self.args.epochs * self.task.batches_per_epoch] if self.args.epochs > 0 else []
        if self.args.max_steps > 0:
            bounds.append(self.args.max_steps)
        return min(bounds) if bounds else None

    def _elapsed(self) -> float:
        """Seconds of training so far, including the step under way."""
        now = time.perf_counter() - self._step_began if self._step_began is not None else 0.0
        return self.state["elapsed"] + now

    def _fraction_at(self, step: int) -> float:
        return run_fraction(step, self.total_steps, self._elapsed(), self.args.time_budget_s)

    def _finished(self) -> bool:
        if self.total_steps is not None and self.state["step"] >= self.total_steps:
            return True
        return bool(self.args.time_budget_s) and self.state["elapsed"] >= self.args.time_budget_s

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

    # ------------------------------------------------------------------ one step
    def training_step(self, batch) -> torch.Tensor:
        """Forward + backward of one global batch on this rank (no optimizer step); returns the global loss."""
        self._setup()
        self.model.train()
        return self.task.step(self, batch)

    def optimizer_step(self) -> float:
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.requires_grad]
        # max_grad_norm 0: no clipping (the norm is still measured, for the log)
        limit = self.args.max_grad_norm if self.args.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ loop
    def train(self, resume: bool = False) -> dict:
        """Train to the end (``epochs``, ``max_steps`` or ``time_budget_s``); with ``resume`` continue from the
        latest checkpoint in ``output_dir`` exactly where it stopped. Returns the final state: step, last loss,
        best metric, ``examples_seen``, ``seconds`` and ``cpu_seconds`` of training, ``stopped_by``
        (``steps`` or ``time``)."""
        self._setup()
        args = self.args
        is_main = self.rank == 0
        if resume:
            self._resume()
        else:
            self._seed_fresh()
        writes = is_main and self.output_dir is not None
        if writes:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            from fastdpr.atomic import write_json

            write_json(self.output_dir / ARGUMENTS_FILE,
                       {"training": args.to_dict(), "task": self.task.arguments(), "world_size": self.world})
        metrics = self.output_dir / "metrics.jsonl" if self.output_dir is not None else None
        if writes and resume:
            _truncate_metrics(metrics, self.state["step"])

        from fastdpr.progress import announce, progress

        # the progress every long stage shows: a bar on a terminal, a timed line in a log (a step of a large batch
        # on a CPU takes long enough that lines every `logging_steps` steps leave a log silent for minutes)
        bar = progress(total=self.total_steps, initial=self.state["step"], desc="train", unit="step",
                       enabled=is_main and args.show_progress)
        # the first progress line comes only after a step: say at once what is under way
        to_go = (f"{self.total_steps - self.state['step']:,} steps" if self.total_steps is not None
                 else f"{max(0.0, args.time_budget_s - self.state['elapsed']):,.0f} s")
        announce(f"train: {to_go} of {args.batch_size} questions to go", enabled=is_main and args.show_progress)
        bpe = self.task.batches_per_epoch
        # examples/s counts training steps only (not validation or checkpoint writing)
        window_loss, window_steps, window_time = 0.0, 0, 0.0
        last_loss = float("nan")
        last_saved = last_evaluated = self.state["step"]
        last_saved_at = time.perf_counter()
        done = self._finished()
        while not done:
            epoch, start = self.state["epoch"], self.state["position"]
            for position in range(start, bpe):
                self._step_began, began_cpu = time.perf_counter(), time.process_time()
                batch = self.task.batch(epoch, position, self.state["step"])
                loss = float(self.training_step(batch))
                grad_norm = self.optimizer_step()
                seconds = time.perf_counter() - self._step_began
                self._step_began = None
                window_time += seconds
                step = self.state["step"] + 1
                end_of_epoch = position + 1 == bpe
                self.state.update(step=step, epoch=epoch + end_of_epoch, position=0 if end_of_epoch else position + 1,
                                  seen=self.state["seen"] + self.task.examples_in(batch),
                                  elapsed=self.state["elapsed"] + seconds,
                                  cpu=self.state["cpu"] + time.process_time() - began_cpu)
                last_loss = loss
                window_loss += loss
                window_steps += 1
                record = {"step": step, "epoch": epoch, "loss": loss, "lr": self.scheduler.get_last_lr()[0],
                          "grad_norm": grad_norm, **getattr(self.task, "last_parts", {})}
                bar.set_postfix(loss=f"{loss:.4f}")
                bar.update(1)
                done = self._finished()
                if step % args.logging_steps == 0 or done:
                    if writes:
                        logged = {**record, "loss": window_loss / window_steps,
                                  "examples_per_s": window_steps * args.batch_size / max(window_time, 1e-9)}
                        _append_jsonl(metrics, logged)
                    window_loss, window_steps, window_time = 0.0, 0, 0.0
                if self.task.has_validation_data and ((args.eval_steps and step % args.eval_steps == 0)
                                                      or (not args.eval_steps and end_of_epoch) or done):
                    if step != last_evaluated:
                        self._validate_and_keep_best(metrics)
                        last_evaluated = step
                if self._checkpoint_due(step, end_of_epoch, done, last_saved_at):
                    self.save_checkpoint()
                    last_saved, last_saved_at = step, time.perf_counter()
                for callback in self.callbacks:
                    callback(self, record)
                if done:
                    break
        if self.state["step"] != last_saved and self.output_dir is not None:
            self.save_checkpoint()
        bar.close()
        if writes:
            with self.interpolated():
                self.task.save(self.final_model_dir)
        distributed.barrier()
        stopped_by = "time" if args.time_budget_s and self.state["elapsed"] >= args.time_budget_s else "steps"
        return {"step": self.state["step"], "loss": last_loss, "best": self.state["best"],
                "best_step": self.state["best_step"], "examples_seen": self.state["seen"],
                "seconds": self.state["elapsed"], "cpu_seconds": self.state["cpu"], "stopped_by": stopped_by}

    def _checkpoint_due(self, step: int, end_of_epoch: bool, done: bool, last_saved_at: float) -> bool:
        args = self.args
        if self.output_dir is None:
            return False
        if args.save_every_s is not None:  # by the clock only (and at the end)
            return done or time.perf_counter() - last_saved_at >= args.save_every_s
        return bool((args.save_steps and step % args.save_steps == 0) or (not args.save_steps and end_of_epoch)
                    or done)

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
            ckpt.write_state(tmp, self.task, trainer_state, readable, rng_states)
            best = self.output_dir / "checkpoints" / f"step-{self.state['best_step']:08d}" \
                if self.state["best_step"] is not None else None
            path = ckpt.commit(tmp, self.output_dir, step, self.args.save_total_limit, protect=best)
        distributed.barrier()
        return path

    def _resume(self) -> None:
        latest = ckpt.latest_checkpoint(self.output_dir) if self.output_dir is not None else None
        if latest is None:
            where = ckpt.checkpoint_root(self.output_dir) if self.output_dir is not None else None
            raise InputError("no checkpoint to resume from", path=str(where) if where else None)
        self._check_same_run()
        state, rng = ckpt.load_state(latest, self.rank, map_location=self.device)
        try:
            self.task.load(latest / "model")
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise InputError(f"this checkpoint is not a state of the training asked for (another model or other "
                             f"settings: {err}); remove it or choose another output directory",
                             path=str(latest)) from err
        self.state = {**self.state, **state["state"]}
        if rng is not None and state.get("world_size", 1) == self.world:
            ckpt.set_rng_state(rng)
        else:  # a different number of ranks cannot replay the same dropout draws; reseed from the step
            torch.manual_seed(self.args.seed + self.rank + 1_000_003 * self.state["step"])

    def _check_same_run(self) -> None:
        """Refuse to resume a run under settings that take other examples at each step (its continuation would be
        another run's)."""
        path = self.output_dir / ARGUMENTS_FILE
        if not path.is_file():
            return
        saved = read_arguments(path)["training"]
        for name in _SAME_ON_RESUME:
            if name in saved and saved[name] != getattr(self.args, name):
                raise InputError(f"{name} {getattr(self.args, name)!r} is not the {saved[name]!r} of the run being "
                                 "resumed; resume with the same value or choose another output directory",
                                 path=str(path))

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

    def _validate_and_keep_best(self, metrics_path: Path | None) -> None:
        with self.interpolated():  # the model that will be saved is the one validated
            self._validate_and_keep_best_now(metrics_path)

    def _validate_and_keep_best_now(self, metrics_path: Path | None) -> None:
        result = self.validate() if self.rank == 0 else None
        if self.rank == 0 and result is not None:
            if metrics_path is not None:
                _append_jsonl(metrics_path, {"step": self.state["step"], **{f"dev_{k}": v for k, v in result.items()}})
            name = self.task.best_metric
            if name not in result:
                raise InputError(f"the task's validation gave {', '.join(sorted(result))}, not its best_metric "
                                 f"{name!r}")
            value = result[name]
            best = self.state["best"]
            if best is None or (value > best if self.task.higher_is_better else value < best):
                self.state.update(best=value, best_step=self.state["step"])
                if self.best_model_dir is not None:
                    self.task.save(self.best_model_dir)
                    from fastdpr.atomic import write_json

                    write_json(self.best_model_dir / "validation.json",
                               {"step": self.state["step"], "metric": name, **result})
        if self.world > 1:  # every rank needs the same best/best_step for identical checkpoints
            shared = [self.state["best"], self.state["best_step"]]
            torch.distributed.broadcast_object_list(shared, src=0)
            self.state.update(best=shared[0], best_step=shared[1])

    def validate(self) -> dict | None:
        """The task's validation of the model as it is now (``task.validate``); None when it has none."""
        self._setup()
        return self.task.validate(self)


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
