"""The compiled extension for the tests that need it.

It is part of the normal install; in a checkout without a build those tests skip instead of failing at import.
"""
from __future__ import annotations


def extension(symbol: str):
    """``fastdpr._C`` when it is built and has ``symbol``, else None."""
    try:
        from fastdpr import _C
    except ImportError:  # pragma: no cover - the extension is part of the normal install
        return None
    return _C if hasattr(_C, symbol) else None


def simd_levels(ext) -> list[str]:
    """The SIMD levels of the extension's kernels this CPU runs, scalar first (none without the extension)."""
    return [lv for lv in ("scalar", "avx2", "avx512") if ext is not None and ext.simd_supported(lv)]
