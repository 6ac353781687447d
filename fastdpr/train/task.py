"""What the :class:`~fastdpr.train.trainer.Trainer` needs from a model to train it.

The Trainer owns everything a training run shares whatever is trained: device and ranks, the optimizer and its
weight-decay rule, the learning-rate schedule, gradient clipping, mixed precision (autocast and the fp16 grad
scaler), the step and time budgets, checkpoints and exact resume, metrics, interpolation, when to validate and
keeping the best model. A task owns the rest: its model and its own settings, how one epoch is cut into batches, the
forward and backward pass of a batch, and what validating the model means. ``fastdpr.train.biencoder.BiEncoderTask``
trains the dual encoder, ``fastdpr.reader.training.ReaderTask`` the extractive reader; the Trainer imports
neither."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class Task:
    """A model to train and its data. Subclasses set ``model`` and ``batches_per_epoch`` (in :meth:`prepare` at the
    latest) and implement :meth:`batch` and :meth:`step`; the rest has defaults: no validation data, nothing saved
    of the task's settings. The ``trainer`` the methods receive is the :class:`~fastdpr.train.trainer.Trainer`
    training the task (not imported here: the trainer imports this module)."""

    model: torch.nn.Module
    batches_per_epoch: int
    #: extra numbers of the last step (e.g. the parts of a loss), added to the step's record for callbacks
    last_parts: dict
    #: the key of :meth:`validate`'s result that picks the best model, and whether a higher value of it is better
    best_metric: str = "loss"
    higher_is_better: bool = False

    @property
    def has_validation_data(self) -> bool:
        """Whether :meth:`validate` has data to score: the Trainer validates on its schedule only then."""
        return False

    def arguments(self) -> dict:
        """The task's own settings, saved with the loop's in ``training_args.json`` (JSON values)."""
        return {}

    def prepare(self, trainer) -> None:
        """Called once the model is on ``trainer.device``, before the optimizer is built: freeze what does not
        train, load what the steps need. ``trainer.args`` holds the loop's settings (batch size, seed)."""

    def batch(self, epoch: int, position: int, step: int) -> Any:
        """Batch ``position`` of ``epoch`` (the same for the same arguments, so that a resumed run repeats the
        run it continues); ``step`` is the number of optimizer steps taken before it."""
        raise NotImplementedError

    def examples_in(self, batch: Any) -> int:
        """How many training examples (questions) ``batch`` holds."""
        return len(batch)

    def step(self, trainer, batch: Any) -> torch.Tensor:
        """Forward and backward pass of one batch, under ``trainer.autocast()`` and through
        ``trainer.backward(loss)``; returns the (detached) loss. The optimizer step is the Trainer's."""
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(str(path))

    def load(self, path: str | Path) -> None:
        """Take the weights of a model :meth:`save` wrote (a checkpoint's) into ``model``."""
        saved = type(self.model).from_pretrained(str(path))
        self.model.load_state_dict(saved.state_dict())

    def validate(self, trainer) -> dict | None:
        """Scores of the model on held-out data, one of them under :attr:`best_metric`; None without any. The
        Trainer calls it (on rank 0, with the interpolated weights in place) when :attr:`has_validation_data`."""
        return None
