"""Shared plumbing of the readers: opening plain or gzipped files, numbered lines, bad-row policy, id clean-up.

Every reader works on raw bytes line by line and decodes each line itself, so that a bad UTF-8 byte is reported
with its line number instead of surfacing as a ``UnicodeDecodeError`` from deep inside the ``io`` module.
"""
from __future__ import annotations

import contextlib
import csv
import gzip
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from fastdpr.atomic import atomic_open
from fastdpr.errors import InputError

#: warnings for each skipped row are capped; the summary warning gives the total
MAX_ROW_WARNINGS = 5


class BadRowWarning(UserWarning):
    """A bad input row was skipped because ``skip_bad=True``."""


@dataclass
class ReadStats:
    """Counts filled in by a reader as it goes; pass one in to learn how many rows were skipped.

    >>> stats = ReadStats()
    >>> # for p in iter_passages("psgs.tsv", skip_bad=True, stats=stats): ...
    >>> stats.bad
    0
    """

    rows: int = 0
    bad: int = 0
    first_errors: list[str] = field(default_factory=list)


class BadRows:
    """The bad-row policy of one read: raise :class:`InputError` naming ``file:line``, or (``skip_bad``) warn,
    count and go on. Call :meth:`finish` at the end for the summary warning."""

    def __init__(self, path: str | os.PathLike, skip_bad: bool, stats: ReadStats | None = None):
        self.path = str(path)
        self.skip_bad = skip_bad
        self.stats = stats if stats is not None else ReadStats()

    def __call__(self, message: str, line: int | None = None) -> None:
        err = InputError(message, self.path, line)
        if not self.skip_bad:
            raise err
        self.stats.bad += 1
        if len(self.stats.first_errors) < MAX_ROW_WARNINGS:
            self.stats.first_errors.append(str(err))
            warnings.warn(f"skipping bad row: {err}", BadRowWarning, stacklevel=3)

    def parsed(self, items: Iterable[tuple[int, Any]], parse: Callable[[Any], dict]) -> Iterator[dict]:
        """``parse(item)`` for each ``(line number, item)``, in order; a ``ValueError`` from ``parse`` is a bad row
        at that line. Calls :meth:`finish` at the end."""
        for lineno, item in items:
            try:
                record = parse(item)
            except ValueError as exc:
                self(str(exc), lineno)
                continue
            self.stats.rows += 1
            yield record
        self.finish()

    def finish(self) -> None:
        if self.stats.bad:
            warnings.warn(
                f"{self.path}: skipped {self.stats.bad} bad row(s) of {self.stats.bad + self.stats.rows}",
                BadRowWarning,
                stacklevel=3,
            )


def is_gzip(path: str | os.PathLike) -> bool:
    return str(path).endswith(".gz")


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open ``path`` for reading bytes, decompressing ``.gz``. A missing file is an :class:`InputError`."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such file", str(path))
    if path.is_dir():
        raise InputError("is a directory, expected a file", str(path))
    raw = open(path, "rb", buffering=1 << 20)
    return gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip(path) else raw


def numbered_lines(fh: IO[bytes], bad: BadRows) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its newline) for every non-blank line.

    A line that is not UTF-8 goes to ``bad``; a UTF-8 byte-order mark on the first line is dropped.
    """
    for lineno, raw in enumerate(fh, 1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad(f"not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", lineno)
            continue
        line = line.rstrip("\r\n")
        if line.strip():
            yield lineno, line


def split_delimited(line: str, delimiter: str = "\t") -> list[str]:
    """Fields of one delimited line. Quoted fields follow CSV rules (DPR's psgs_w100.tsv quotes texts that contain
    quotes, doubling the inner ones); a line without quotes takes the fast path. Raises ``ValueError`` on an
    unterminated quote: a record must fit on one line."""
    if '"' not in line:
        return line.split(delimiter)
    rows = list(csv.reader(io.StringIO(line), delimiter=delimiter, strict=True))
    if len(rows) != 1:
        raise ValueError("a quoted field runs past the end of the line")
    return rows[0]


def clean_id(value) -> str:
    """Passage ids are strings; DPR's ``wiki:`` source prefix is dropped so that ``wiki:17`` and ``17`` agree
    everywhere (passage files, training files, runs)."""
    s = str(value).strip()
    return s[5:] if s.startswith("wiki:") else s


def detect_by_extension(path: str | os.PathLike) -> str | None:
    """``"tsv"``, ``"csv"``, ``"jsonl"``, ``"json"`` or ``"trec"`` from the file name (ignoring ``.gz``), else None."""
    name = str(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for ext, fmt in (
        (".tsv", "tsv"),
        (".csv", "csv"),
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "json"),
        (".trec", "trec"),
        (".run", "trec"),
        (".txt", None),
    ):
        if name.endswith(ext):
            return fmt
    return None


def output_format(path: str | os.PathLike, fmt: str, formats: tuple[str, ...], what: str) -> str:
    """The format to write ``path`` in: ``fmt``, or for ``"auto"`` JSONL when the name ends in ``.jsonl``/``.json``
    and the delimited format ``formats[0]`` otherwise."""
    if fmt == "auto":
        fmt = "jsonl" if detect_by_extension(path) in ("jsonl", "json") else formats[0]
    if fmt not in formats:
        raise ValueError(f"{what} format must be one of {formats}, got {fmt!r}")
    return fmt


def sniff_format(path: str | os.PathLike, delimited: str) -> str:
    """``"jsonl"`` or ``delimited`` (the caller's name for its TSV/CSV format): from the extension (``.jsonl``/``.json``
    vs ``.tsv``/``.csv``), else from the first character (``{`` means JSONL)."""
    ext = detect_by_extension(path)
    if ext in ("jsonl", "json"):
        return "jsonl"
    if ext in ("tsv", "csv"):
        return delimited
    return "jsonl" if first_char(path) == "{" else delimited


def resolve_directory(path: str | os.PathLike, names: tuple[str, ...]) -> Path:
    """``path`` itself, or when it is a directory (a BEIR dataset) the first of ``names`` inside it."""
    path = Path(path)
    if not path.is_dir():
        return path
    for name in names:
        if (path / name).exists():
            return path / name
    raise InputError(f"directory holds none of {', '.join(names)}", str(path))


def peek(path: str | os.PathLike, nbytes: int = 4096) -> bytes:
    """The first bytes of a file (after a BOM), for content sniffing."""
    with open_binary(path) as fh:
        head = fh.read(nbytes)
    return head[3:] if head.startswith(b"\xef\xbb\xbf") else head


def first_char(path: str | os.PathLike) -> str:
    head = peek(path).lstrip()
    return chr(head[0]) if head else ""


@contextlib.contextmanager
def open_output(path: str | os.PathLike) -> Iterator[IO[str]]:
    """A text handle that atomically replaces ``path`` on clean exit; gzip-compressed when it ends in ``.gz``."""
    if is_gzip(path):
        with atomic_open(path, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                with io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as fh:
                    yield fh
    else:
        with atomic_open(path, "w") as fh:
            yield fh
