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
    """A pinned data archive cannot be had from here: the package index does not list it (a release removed or
    hidden) or cannot be reached. Benchmarks and tests that need the real data report themselves skipped on it."""
