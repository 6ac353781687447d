"""Resumable stages: each stage writes its outputs, then ``stages/<name>.json`` (its summary and a fingerprint of
the settings it ran with and of the code that ran it: :mod:`fastdpr.quickstart.provenance`). A later run skips a
stage whose summary exists with the same fingerprint, unless a stage it reads from was redone after it, so an
interrupted run resumes where it stopped and a changed recipe or library redoes its stages; ``force`` redoes
everything."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable

from fastdpr.atomic import write_json
from fastdpr.quickstart.provenance import provenance_key


class StageRunner:
    """Runs named stages once per fingerprint (settings, the stage function's source file, the package), and keeps
    their wall and CPU times."""

    def __init__(self, out: str | Path, settings: dict, log: Callable[[str], None], force: bool = False):
        self.out = Path(out)
        self.log = log
        self.force = force
        self.timings: dict[str, float] = {}
        self.cpu_times: dict[str, float] = {}
        self.settings = settings
        self._redone: set[str] = set()

    @property
    def redone(self) -> list[str]:
        """The stages this runner ran (rather than took from their summaries), in name order."""
        return sorted(self._redone)

    def _marker(self, name: str) -> Path:
        return self.out / "stages" / f"{name}.json"

    def fingerprint(self, fn: Callable) -> str:
        """The key of a stage run by ``fn``: the settings, the file defining ``fn`` and the whole package."""
        return provenance_key(self.settings, code=(fn,))

    def _fresh(self, name: str, after: tuple[str, ...], fingerprint: str) -> dict | None:
        marker = self._marker(name)
        if self.force or not marker.is_file() or set(after) & self._redone:
            return None
        # stale when a stage it reads from was rewritten after it (in this run or an interrupted one)
        if any(self._marker(dep).is_file() and self._marker(dep).stat().st_mtime_ns > marker.stat().st_mtime_ns
               for dep in after):
            return None
        saved = json.loads(marker.read_text())
        return saved if saved.get("fingerprint") == fingerprint else None

    def stage(self, name: str, fn: Callable[[], dict], after: tuple[str, ...] = ()) -> dict:
        """Run ``fn`` unless its summary exists with this fingerprint (and no stage it depends on was redone)."""
        fingerprint = self.fingerprint(fn)
        saved = self._fresh(name, after, fingerprint)
        if saved is not None:
            self.log(f"[{name}] done already, skipped")
            self.timings[name] = saved.get("seconds", 0.0)
            self.cpu_times[name] = saved.get("cpu_seconds", 0.0)
            return saved["summary"]
        self.log(f"[{name}] ...")
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = fn()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        self.timings[name] = seconds
        self.cpu_times[name] = cpu
        self._redone.add(name)
        write_json(self._marker(name), {"fingerprint": fingerprint, "seconds": seconds, "cpu_seconds": cpu,
                                        "summary": summary})
        self.log(f"[{name}] {seconds:.1f} s (CPU {cpu:.1f} s)")
        return summary


def hash_order(records: list[dict], key: str, salt: str) -> list[dict]:
    """A deterministic pseudo-random order (by hash), independent of input order."""
    return sorted(records, key=lambda r: hashlib.sha1(f"{salt}\n{r[key]}".encode()).hexdigest())


def take(records: list[dict], n: int | None, salt: str) -> list[dict]:
    """``n`` records in hash order (all of them for ``None``)."""
    ordered = hash_order(records, "qid", salt)
    return ordered if n is None else ordered[:n]
