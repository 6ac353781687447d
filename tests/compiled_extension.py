"""The compiled extensions for the tests that need them, and the CPU levels their kernels run at.

They are part of the normal install; in a checkout without a build those tests skip instead of failing at import.
A test that runs a kernel at each CPU level reports the ones this CPU cannot run as a skip naming the
level (``level_params``, ``skip_unrun``), so a narrower machine never passes with less coverage unnoticed.
"""
from __future__ import annotations

import contextlib

import pytest

import fastdpr

# the index kernels' levels (the tables of csrc/simd.h, pq4.h, sq4.h), scalar first
SIMD_LEVELS = fastdpr.CPU_LEVELS[:3]


def extension(symbol: str):
    """``fastdpr._C`` when it is built and has ``symbol``, else None."""
    try:
        from fastdpr import _C
    except ImportError:  # pragma: no cover - the extension is part of the normal install
        return None
    return _C if hasattr(_C, symbol) else None


def kernels_extension():
    """``fastdpr.models._kernels_C`` (attention, few-rows linear, layer norm) when it is built, else None."""
    try:
        from fastdpr.models import _kernels_C
    except ImportError:  # pragma: no cover - the extension is part of the normal install
        return None
    return _kernels_C


def simd_levels(ext) -> list[str]:
    """The levels of the index kernels this CPU runs, scalar first (none without the extension)."""
    return [lv for lv in SIMD_LEVELS if ext is not None and ext.cpu_features()[lv]]


@contextlib.contextmanager
def capped(ext, level: str):
    """The index core's kernels capped at ``level`` inside the block (csrc/cpu.h's set_cap), the cap before put
    back after it."""
    before = ext.set_cpu_cap(level)
    try:
        yield
    finally:
        ext.set_cpu_cap(before)


def unavailable(level: str) -> str | None:
    """Why the kernels of CPU level ``level`` cannot run here (capped, or absent), or None."""
    if fastdpr.cpu_features()[level]:
        return None
    if fastdpr.cpu_features(detected=True)[level]:
        return f"{level}: capped by FASTDPR_SIMD={fastdpr.cpu_features()['cap']}"
    return f"{level}: this CPU lacks it"


def level_params(names) -> list:
    """One pytest param per level name, each skipped with its level's name where it cannot run."""
    return [pytest.param(name, id=name, marks=pytest.mark.skipif(unavailable(name) is not None,
                                                                 reason=str(unavailable(name))))
            for name in names]


def skip_unrun(names, ran) -> None:
    """After a test has compared the paths it could run (``ran``): a skip naming each of ``names`` it could not."""
    missing = [unavailable(name) or f"{name}: not run" for name in names if name not in ran]
    if missing:
        pytest.skip(f"ran {', '.join(ran)}; not {'; '.join(missing)}")
