"""The one door to matplotlib, which is an optional extra (``fastdpr[plot]``): only the quickstart report and the
benchmarks draw, so a plain install does not pull it in.

    plt = pyplot()
    fig, ax = plt.subplots()
"""
from __future__ import annotations

from fastdpr.errors import MissingDependency

INSTALL_HINT = "pip install 'fastdpr[plot]'"


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed). Raises :class:`MissingDependency`
    naming the extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency(f"plotting needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
