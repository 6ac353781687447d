"""Progress of long work, for a person at a terminal and for a log file alike.

On a terminal this is an ordinary tqdm bar. Anywhere else (stderr redirected to a file, CI, torchrun) a bar's ``\\r``
updates pile up into one unreadable line, so instead one plain line is written every ``log_every`` seconds (and one
at the end): ``encode passages: 1,024/5,000 (20%) 85.3/s, ETA 47 s``.

Usage::

    from fastdpr.progress import progress

    with progress(total=len(items), desc="encode passages", unit="psg") as bar:
        for batch in batches:
            ...
            bar.update(len(batch))

``enabled=None`` (the default everywhere in fastdpr) means "show it": a bar on a terminal, timed lines otherwise;
``False`` is silent. ``FASTDPR_PROGRESS=0`` silences every progress report of a process.
"""
from __future__ import annotations

import os
import sys
import time
from typing import IO, Iterable, Iterator, TypeVar

T = TypeVar("T")

ENV = "FASTDPR_PROGRESS"
LOG_EVERY_S = 10.0


def _wanted(enabled: bool | None) -> bool:
    if enabled is False:
        return False
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class _LogLines:
    """A tqdm-like counter that writes a line to ``stream`` at most every ``every`` seconds."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: IO[str], every: float, initial: int = 0):
        self.total, self.desc, self.unit, self.stream, self.every = total, desc, unit, stream, every
        self.n = initial
        self._initial = initial
        self._start = self._last = time.monotonic()
        self._written = initial  # the count the last line showed: close() repeats no line
        self._closed = False
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._write(now)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def _write(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = (self.n - self._initial) / elapsed
        if self.total:
            share = f"{self.n:,}/{self.total:,} ({100.0 * self.n / self.total:.0f}%)"
            left = (self.total - self.n) / rate if rate > 0 else float("inf")
            eta = f", ETA {left:.0f} s" if left != float("inf") else ""
        else:
            share, eta = f"{self.n:,}", ""
        extra = f" [{self.postfix}]" if self.postfix else ""
        self._written = self.n
        print(f"{self.desc}: {share} {rate:,.1f} {self.unit}/s{eta}, {elapsed:.0f} s{extra}", file=self.stream,
              flush=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.n > self._initial and self.n != self._written:
                self._write(time.monotonic())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Silent:
    n = 0
    postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress(total: int | None = None, desc: str = "", unit: str = "it", enabled: bool | None = None,
             initial: int = 0, stream: IO[str] | None = None, log_every: float | None = None):
    """A progress counter with tqdm's ``update``/``close``/``set_postfix`` and context-manager protocol."""
    stream = stream or sys.stderr
    if not _wanted(enabled):
        return _Silent()
    if hasattr(stream, "isatty") and stream.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream, mininterval=0.5, leave=False)
    return _LogLines(total, desc, unit, stream, LOG_EVERY_S if log_every is None else log_every, initial=initial)


def announce(text: str, enabled: bool | None = None, stream: IO[str] | None = None) -> None:
    """One line on stderr about work that starts now, under the same switches as the progress counters."""
    if _wanted(enabled):
        print(text, file=stream or sys.stderr, flush=True)


def track(items: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it",
          enabled: bool | None = None) -> Iterator[T]:
    """Iterate ``items`` with a progress counter (``total`` defaults to ``len(items)`` where it exists)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(total=total, desc=desc, unit=unit, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.update(1)


__all__ = ["announce", "progress", "track", "ENV", "LOG_EVERY_S"]
