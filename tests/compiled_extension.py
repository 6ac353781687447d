"""The compiled extensions for the tests that need them, and the CPU levels their kernels run at.

They are part of the normal install; in a checkout without a build those tests skip instead of failing at import.
A test that runs a kernel at each SIMD level or path reports the ones this CPU cannot run as a skip naming the
level (``level_params``, ``skip_unrun``), so a narrower machine never passes with less coverage unnoticed.
"""
from __future__ import annotations

import pytest

import fastdpr

# the index kernels' levels (csrc/simd.h), scalar first
SIMD_LEVELS = ("scalar", "avx2", "avx512")
# every kernel path or level name the extensions use -> the registry level it needs (csrc/cpu.h; None: any CPU)
NEEDS = {"scalar": None, "avx2": "avx2", "avx512": "avx512", "avx512bw": "avx512", "avx512bf16": "avx512_bf16",
         "amx": "amx"}


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
    """The SIMD levels of the extension's kernels this CPU runs, scalar first (none without the extension)."""
    return [lv for lv in SIMD_LEVELS if ext is not None and ext.simd_supported(lv)]


def unavailable(name: str) -> str | None:
    """Why the kernels of path or level ``name`` cannot run here (naming the registry level), or None."""
    level = NEEDS[name]
    if level is None or fastdpr.cpu_features()[level]:
        return None
    if fastdpr.cpu_features(detected=True)[level]:
        return f"{level}: capped by FASTDPR_SIMD={fastdpr.cpu_features()['cap']}"
    return f"{level}: this CPU lacks it"


def level_params(names) -> list:
    """One pytest param per path or level name, each skipped with its level's name where it cannot run."""
    return [pytest.param(name, id=name, marks=pytest.mark.skipif(unavailable(name) is not None,
                                                                 reason=str(unavailable(name))))
            for name in names]


def skip_unrun(names, ran) -> None:
    """After a test has compared the paths it could run (``ran``): a skip naming each of ``names`` it could not."""
    missing = [unavailable(name) or f"{name}: not run" for name in names if name not in ran]
    if missing:
        pytest.skip(f"ran {', '.join(ran)}; not {'; '.join(missing)}")
