"""Errors a user can act on. The CLI prints these as one line, without a traceback."""
from __future__ import annotations


class FastDPRError(Exception):
    """Base class for errors caused by input, configuration or environment rather than a bug."""


class InputError(FastDPRError, ValueError):
    """Bad input data. ``str()`` names the file and line when known: ``path:line: message``."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        self.reason = message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class MissingDependency(FastDPRError, ImportError):
    """An optional dependency is needed for this feature; the message says which extra installs it."""


class DataUnavailable(FastDPRError):
    """A pinned data file cannot be had from here: it is not in the cache, the folder named as its local copy lacks
    it, or its repository cannot be reached. The message names where it comes from and how to hand it over;
    benchmarks that need the real data exit with their own status on it."""
