"""Access to the compiled core, with a switch to force the pure-numpy fallbacks (tests, debugging).

``FASTDPR_NO_NATIVE=1`` in the environment, or ``force_fallback(True)``, makes new index objects use numpy."""
from __future__ import annotations

import os

_forced = os.environ.get("FASTDPR_NO_NATIVE", "") not in ("", "0")


def force_fallback(on: bool) -> None:
    """Make indexes created from now on use (or stop using) the numpy fallbacks."""
    global _forced
    _forced = bool(on)


def native():
    """The ``fastdpr._C`` module, or None when absent or disabled."""
    if _forced:
        return None
    try:
        from fastdpr import _C
    except ImportError:
        return None
    return _C


def native_available() -> bool:
    return native() is not None
