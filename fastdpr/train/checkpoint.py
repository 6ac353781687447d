"""Training checkpoints: written atomically, rotated, and enough to continue a run exactly.

A checkpoint is a directory ``<out>/checkpoints/step-00000120/`` holding the model (``model/``, through
``save_pretrained``), ``trainer_state.pt`` (optimizer, scheduler, grad scaler, epoch, batch position, step, best
validation score), ``rng-rank<r>.pt`` per rank (CPU/CUDA/numpy/python generator states) and a readable
``trainer_state.json``. It is assembled in a hidden temporary sibling and renamed into place, so a directory named
``step-*`` is always complete; a crash mid-write leaves only a ``.tmp-*`` directory that is cleaned up later.
"""
from __future__ import annotations

import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from fastdpr.atomic import write_json

_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / "trainer_state.pt").is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def begin(output_dir: str | Path, step: int) -> Path:
    """Create the hidden temporary directory a checkpoint is written into (rank 0 only)."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:08d}-", dir=root))


def write_state(directory: Path, task, trainer_state: dict, readable: dict, rng_states: list[dict]) -> None:
    """Fill a temporary checkpoint; ``task`` (a :class:`~fastdpr.train.task.Task`) saves the model;
    ``rng_states[r]`` is rank r's generator state (gathered to rank 0)."""
    task.save(directory / "model")
    for rank, state in enumerate(rng_states):
        torch.save(state, directory / f"rng-rank{rank}.pt")
    torch.save(trainer_state, directory / "trainer_state.pt")
    write_json(directory / "trainer_state.json", readable)


def commit(tmp: Path, output_dir: str | Path, step: int, keep_last: int, protect: Path | None = None) -> Path:
    """Rename a finished temporary checkpoint into place, then delete the oldest beyond ``keep_last`` (never the
    ``protect``ed one, i.e. the best so far) and stale temporaries."""
    final = checkpoint_root(output_dir) / f"step-{step:08d}"
    if final.exists():  # the same step saved twice (e.g. end of training right after a periodic save)
        shutil.rmtree(final)
    tmp.rename(final)
    if keep_last > 0:
        existing = list_checkpoints(output_dir)
        removable = [p for p in existing if protect is None or p.resolve() != Path(protect).resolve()]
        for path in removable[: max(0, len(removable) - keep_last)]:
            shutil.rmtree(path, ignore_errors=True)
    for stale in checkpoint_root(output_dir).glob(".tmp-step-*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def load_state(directory: Path, rank: int, map_location="cpu") -> tuple[dict, dict | None]:
    """(trainer state, this rank's RNG state or None when the checkpoint came from a run with fewer ranks)."""
    state = torch.load(directory / "trainer_state.pt", map_location=map_location, weights_only=False)
    rng_path = directory / f"rng-rank{rank}.pt"
    rng = torch.load(rng_path, map_location="cpu", weights_only=False) if rng_path.is_file() else None
    return state, rng
