"""The learning-rate schedule of every training run: linear warm-up, then linear decay to zero (DPR's, BERT's).

It is written over the *fraction of the run done* rather than over steps, so that a run bounded by time (the
reader's ``time_budget_s``) decays to zero when its time is up, whatever its speed, exactly as a run bounded by
steps does at its last step."""
from __future__ import annotations

from typing import Callable

import torch


def warmup_then_decay(done: float, warmup: float) -> float:
    """The rate's factor when ``done`` (0..1) of the run is behind it and the first ``warmup`` (0..1) warms up."""
    if done < warmup:
        return done / warmup
    return max(0.0, (1.0 - done) / max(1e-12, 1.0 - warmup))


def run_fraction(step: int, total_steps: int | None, elapsed_s: float = 0.0,
                 time_budget_s: float | None = None) -> float:
    """How far a run is, 0..1: by steps, by time, or by whichever is further along when both bound it."""
    parts = [0.0]
    if total_steps:
        parts.append(step / total_steps)
    if time_budget_s:
        parts.append(elapsed_s / time_budget_s)
    return max(parts)


def linear_schedule(optimizer: torch.optim.Optimizer, warmup: float,
                    fraction: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule as a ``LambdaLR``: ``fraction(step)`` says how far the run is after ``step`` optimizer steps
    (it may read the clock); ``warmup`` is a fraction of the run."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_then_decay(fraction(step), warmup))
