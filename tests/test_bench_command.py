"""`fastdpr bench`: a benchmark that cannot get its real data is reported skipped, one that fails fails the run."""
import textwrap
from pathlib import Path

from fastdpr.commands.bench import DATA_UNAVAILABLE


def _benchmarks(tmp_path, codes: dict) -> str:
    (tmp_path / "report.py").write_text("")
    for script, code in codes.items():
        (tmp_path / script).write_text(textwrap.dedent(f"""
            import sys
            print("why: qed-dev.jsonlines is not in the cache", file=sys.stderr)
            sys.exit({code})
        """))
    return str(tmp_path)


def test_a_benchmark_without_its_data_is_skipped_not_failed(tmp_path, capsys):
    from fastdpr.cli import main

    bdir = _benchmarks(tmp_path, {"loss_bench.py": DATA_UNAVAILABLE, "ann_bench.py": 0})
    assert main(["bench", "--benchmarks-dir", bdir, "--only", "loss,ann", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "skipped, their real data is not available here: loss" in err and "failed" not in err


def test_a_failing_benchmark_still_fails_the_run(tmp_path, capsys):
    from fastdpr.cli import main

    bdir = _benchmarks(tmp_path, {"loss_bench.py": DATA_UNAVAILABLE, "ann_bench.py": 1})
    code = main(["bench", "--benchmarks-dir", bdir, "--only", "loss,ann", "--keep-going", "--out", str(tmp_path / "o")])
    assert code == 1 and "failed: ann" in capsys.readouterr().err


def test_a_benchmark_script_turns_data_unavailable_into_its_exit_status(monkeypatch):
    import pytest

    from fastdpr.errors import DataUnavailable

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _common

    def needs_data():
        raise DataUnavailable("qed-dev.jsonlines is not in the cache")

    with pytest.raises(SystemExit) as stop:
        _common.exit_if_data_unavailable(needs_data)
    assert stop.value.code == DATA_UNAVAILABLE
    assert _common.exit_if_data_unavailable(lambda: 7) == 7


def test_the_quickstart_data_of_a_benchmark_without_the_files_exits_as_unavailable(tmp_path, monkeypatch):
    import pytest

    # an empty local folder stands in for the network: nothing is downloaded
    monkeypatch.setenv("FASTDPR_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("FASTDPR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _common

    with pytest.raises(SystemExit) as stop:
        _common.exit_if_data_unavailable(lambda: _common.quickstart_data(tmp_path / "work"))
    assert stop.value.code == DATA_UNAVAILABLE
