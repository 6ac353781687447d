"""The one place that decides whether the compiled core is used, with a switch to force the pure-numpy fallbacks
(tests, debugging).

``FASTDPR_NO_NATIVE=1`` in the environment, or ``force_fallback(True)``, makes every index type (Flat, HNSW, IVF-PQ)
and the index file reader and writer created from then on use their pure-Python implementations."""
from __future__ import annotations

import os

_forced = os.environ.get("FASTDPR_NO_NATIVE", "") not in ("", "0")

# the largest thread count a ``threads=`` argument accepts: 64 per core, never above 4096 (csrc/parallel.h)
MAX_THREADS = min(4096, 64 * (os.cpu_count() or 1))


def force_fallback(on: bool) -> None:
    """Make indexes, file readers and writers created from now on use (or stop using) the numpy fallbacks."""
    global _forced
    _forced = bool(on)


def fallback_forced() -> bool:
    return _forced


def native(ignore_forced: bool = False):
    """The ``fastdpr._C`` module, or None when it is absent or disabled (``FASTDPR_NO_NATIVE``/``force_fallback``).

    ``ignore_forced``: the module whenever it is importable (an object that already runs on the compiled core
    keeps using it, e.g. to write its own file)."""
    if _forced and not ignore_forced:
        return None
    try:  # imported here: the compiled core is optional (a source checkout without it runs on numpy)
        from fastdpr import _C
    except ImportError:
        return None
    return _C


def native_available() -> bool:
    return native() is not None
