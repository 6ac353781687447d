import sys

import pytest

from fastdpr.errors import FastDPRError, MissingDependency
from fastdpr.plotting import pyplot


def test_pyplot_draws_without_a_display(tmp_path):
    pytest.importorskip("matplotlib")
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(tmp_path / "x.png")
    plt.close(fig)
    assert (tmp_path / "x.png").stat().st_size > 0


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(MissingDependency, match=r"fastdpr\[plot\]") as err:
        pyplot()
    assert isinstance(err.value, FastDPRError)  # the CLI prints it as one line
