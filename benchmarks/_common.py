"""Shared plumbing for the benchmark scripts: the machine description, and writing results as JSON + markdown.

Every result file records the command that produced it, the machine, the thread count and the date, so a number
in the README can always be traced back and re-measured."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None


def git_revision() -> str | None:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_revision(),
    }


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name] + sys.argv)


def markdown_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str = ".4g") -> str:
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return format(v, floatfmt)
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(name: str, out_dir: str | os.PathLike | None, payload: dict, markdown_body: str) -> Path:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md`` atomically, stamped with command and machine."""
    from fastdpr.atomic import write_json, write_text

    out = Path(out_dir) if out_dir else DEFAULT_OUT
    stamped = {"benchmark": name, "command": command_line(), "machine": machine(), **payload}
    write_json(out / f"{name}.json", stamped)
    m = stamped["machine"]
    header = (f"## {name}\n\nCommand: `{stamped['command']}`  \n"
              f"Machine: {m['cpu']}, {m['cores']} cores{', GPU ' + m['gpu'] if m['gpu'] else ''}; "
              f"{m['date']}; git {m['git']}\n\n")
    write_text(out / f"{name}.md", header + markdown_body)
    return out / f"{name}.json"


def exit_if_data_unavailable(main):
    """Run ``main()``; when it cannot get the published QA files (``fastdpr.errors.DataUnavailable``), say why on
    stderr (the message says how to hand the files over) and exit with ``DATA_UNAVAILABLE`` instead of a
    traceback."""
    from fastdpr.commands.bench import DATA_UNAVAILABLE  # `fastdpr bench` reports it as skipped, not failed
    from fastdpr.errors import DataUnavailable

    try:
        return main()
    except DataUnavailable as err:
        print(f"skipped, the real data is not available here: {err}", file=sys.stderr)
        raise SystemExit(DATA_UNAVAILABLE) from None


def default_work(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Where a benchmark keeps its intermediate files unless told: ``<fastdpr cache>/<name>``."""
    from fastdpr.data import sources

    return (Path(cache) if cache else sources.default_cache()) / name


def quickstart_data(work: str | os.PathLike, fast: bool = False, log=None, **overrides):
    """The quickstart's ``data`` and ``corpus`` stages run into ``work`` (kept, and reused by a later call with the
    same settings): ``corpus.jsonl`` (every paragraph of the five sets), ``questions/<set>.jsonl`` for the test
    sets of ``experiment.EVAL_SETS`` and ``dev``, the training and validation pools. The sizes are the quickstart's
    (its ``fast`` preset with ``fast``) but for ``overrides``, where ``None`` means "all"; returns the quickstart's
    ``Workspace`` over ``work``."""
    import dataclasses

    from fastdpr.data import sources
    from fastdpr.quickstart import experiment as ex
    from fastdpr.quickstart.config import QuickstartConfig
    from fastdpr.quickstart.runner import StageRunner

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    config = dataclasses.replace(QuickstartConfig.preset(fast=fast), out=str(work), show_progress=False, **overrides)
    cache = Path(config.cache) if config.cache else sources.default_cache()
    ws = ex.Workspace(config, Path(work), cache, log)
    runner = StageRunner(work, config.settings(), log)
    runner.stage("data", lambda: ex.stage_data(ws))
    runner.stage("corpus", lambda: ex.stage_corpus(ws), after=("data",))
    return ws
