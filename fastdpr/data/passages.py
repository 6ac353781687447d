"""Passage files: DPR TSV (``id \\t text \\t title``, with or without header), JSONL ``{"id","title","text"}`` and
BEIR ``corpus.jsonl`` (``_id``). Everything streams: a 21M-passage file is read one line at a time.

A passage is always the dict ``{"id": str, "title": str, "text": str}``.

Example::

    from fastdpr.data import iter_passages, write_passages
    write_passages("psgs.tsv", [{"id": "1", "title": "Aaron", "text": "Aaron is a prophet ..."}])
    for p in iter_passages("psgs.tsv"):
        print(p["id"], p["title"])
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from fastdpr.data._io import (
    BadRows,
    ReadStats,
    clean_id,
    open_binary,
    open_output,
    output_format,
    resolve_directory,
    sniff_format,
    split_delimited,
)
from fastdpr.data._jsonstream import parse_json_object
from fastdpr.errors import InputError

PASSAGE_FORMATS = ("tsv", "jsonl")
_ID_KEYS = ("id", "_id", "docid", "doc_id", "passage_id")
_TEXT_KEYS = ("text", "contents", "passage")


def detect_passage_format(path: str | os.PathLike) -> str:
    """``"tsv"`` or ``"jsonl"``: from the extension (``.tsv``/``.csv`` vs ``.jsonl``/``.json``), else from the first
    character (``{`` means JSONL)."""
    return sniff_format(path, "tsv")


def resolve_passage_path(path: str | os.PathLike) -> Path:
    """A BEIR dataset directory stands for its ``corpus.jsonl``."""
    return resolve_directory(path, ("corpus.jsonl", "corpus.jsonl.gz", "passages.tsv", "psgs_w100.tsv"))


class PassageParser:
    """Turns one line of a passage file into a passage dict, raising ``ValueError`` with the reason when the line is
    bad. TSV needs :meth:`set_header` called with the first line first (it decides whether that line is a header)."""

    def __init__(self, fmt: str):
        if fmt not in PASSAGE_FORMATS:
            raise ValueError(f"passage format must be one of {PASSAGE_FORMATS}, got {fmt!r}")
        self.fmt = fmt
        # DPR's psgs_w100.tsv column order, used when the file has no header
        self.columns = {"id": 0, "text": 1, "title": 2}
        self.ncols = 3

    def set_header(self, first_line: str) -> bool:
        """Read the TSV header if ``first_line`` is one; True when it was (and should not be parsed as a row).

        A first line that names columns but not usably -- no id or no text column, or one named twice -- is a
        ``ValueError``: read as a passage it would be silently wrong, and every row after it misread."""
        if self.fmt != "tsv":
            return False
        names = [f.strip().strip('"').lower() for f in first_line.split("\t")]
        ids = [i for i, n in enumerate(names) if n in _ID_KEYS]
        texts = [i for i, n in enumerate(names) if n in _TEXT_KEYS]
        titles = [i for i, n in enumerate(names) if n == "title"]
        named = len(ids) + len(texts) + len(titles)
        looks_like_header = named >= 2 and (bool(ids) or named == len(names))
        if looks_like_header and (not ids or not texts):
            raise ValueError(f"the header ({' | '.join(names)}) has no {'id' if not ids else 'text'} column; "
                             f"expected id ({'/'.join(_ID_KEYS)}), text ({'/'.join(_TEXT_KEYS)}) and optionally "
                             "title")
        if not ids or not texts:
            return False
        for what, cols in (("an id", ids), ("a text", texts), ("a title", titles)):
            if len(cols) > 1:
                raise ValueError(f"the header ({' | '.join(names)}) names {what} column twice")
        self.columns = {"id": ids[0], "text": texts[0]}
        if "title" in names:
            self.columns["title"] = names.index("title")
        self.ncols = len(names)
        return True

    def parse(self, line: str) -> dict:
        return self._parse_tsv(line) if self.fmt == "tsv" else self._parse_jsonl(line)

    def _parse_tsv(self, line: str) -> dict:
        try:
            fields = split_delimited(line, "\t")
        except (ValueError, csv.Error) as exc:
            raise ValueError(f"malformed quoting: {exc}") from None
        if len(fields) != self.ncols:
            cols = "\\t".join(sorted(self.columns, key=self.columns.get))
            raise ValueError(f"{len(fields)} column(s), expected {self.ncols} ({cols})")
        pid = clean_id(fields[self.columns["id"]])
        text = fields[self.columns["text"]].strip()
        title = fields[self.columns["title"]].strip() if "title" in self.columns else ""
        return _checked(pid, title, text)

    def _parse_jsonl(self, line: str) -> dict:
        obj = parse_json_object(line)
        pid = _first_key(obj, _ID_KEYS)
        text = _first_key(obj, _TEXT_KEYS)
        if pid is None:
            raise ValueError("missing field 'id' (or '_id')")
        if text is None:
            raise ValueError("missing field 'text'")
        title = obj.get("title") or ""
        if not isinstance(text, str) or not isinstance(title, str):
            raise ValueError("fields 'text' and 'title' must be strings")
        return _checked(clean_id(pid), title.strip(), text.strip())


def _first_key(obj: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in obj and obj[k] is not None:
            return obj[k]
    return None


def _checked(pid: str, title: str, text: str) -> dict:
    if not pid:
        raise ValueError("empty passage id")
    if not text:
        raise ValueError(f"empty text for passage {pid!r}")
    return {"id": pid, "title": title, "text": text}


def scan_passages(
    path: str | os.PathLike, fmt: str = "auto", skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[tuple[int, int, int, dict]]:
    """``(line number, byte start, byte end, passage)`` for each good row, in file order. Byte offsets are those of the
    (uncompressed) file, which is what :class:`~fastdpr.data.Corpus` indexes."""
    path = resolve_passage_path(path)
    fmt = detect_passage_format(path) if fmt == "auto" else fmt
    parser = PassageParser(fmt)
    bad = BadRows(path, skip_bad, stats)
    first = True
    offset = 0
    with open_binary(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                bad(f"not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})", lineno)
                continue
            if not line.strip():
                continue
            if first:
                first = False
                try:
                    if parser.set_header(line):
                        continue
                except ValueError as exc:  # a header that cannot be followed is never a skippable row
                    raise InputError(str(exc), str(path), lineno) from None
            try:
                passage = parser.parse(line)
            except ValueError as exc:
                bad(str(exc), lineno)
                continue
            bad.stats.rows += 1
            yield lineno, start, offset, passage
    bad.finish()


def iter_passages(
    path: str | os.PathLike, fmt: str = "auto", skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[dict]:
    """Stream the passages of a DPR TSV, JSONL or BEIR ``corpus.jsonl`` file (``.gz`` too) as
    ``{"id", "title", "text"}`` dicts.

    A bad row (bad UTF-8, malformed JSON or quoting, missing column, empty id or text) raises
    :class:`~fastdpr.errors.InputError` naming ``file:line``; with ``skip_bad=True`` it is skipped with a
    :class:`BadRowWarning` and counted in ``stats.bad``. Duplicate ids are caught by
    :class:`~fastdpr.data.Corpus`, which has the id table to see them.

    >>> for p in iter_passages("psgs_w100.tsv"):  # doctest: +SKIP
    ...     p["id"], p["title"], p["text"][:20]
    """
    for _, _, _, passage in scan_passages(path, fmt, skip_bad, stats):
        yield passage


def _one_line(s: str) -> str:
    # a TSV record is one line: tabs and line breaks inside a field become spaces
    return " ".join(s.split()) if any(c in s for c in "\t\r\n") else s


def write_passages(path: str | os.PathLike, passages: Iterable[dict], fmt: str = "auto") -> int:
    """Write passages atomically as DPR TSV with its ``id\\ttext\\ttitle`` header (fields with quotes are CSV-quoted,
    as in psgs_w100.tsv; tabs/newlines inside fields become spaces) or as JSONL. Returns the number written.

    >>> write_passages("out.jsonl", [{"id": "1", "title": "T", "text": "x"}])  # doctest: +SKIP
    1
    """
    fmt = output_format(path, fmt, PASSAGE_FORMATS, "passage")
    n = 0
    with open_output(path) as fh:
        if fmt == "tsv":
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
            writer.writerow(["id", "text", "title"])
            for p in passages:
                writer.writerow([_one_line(str(p["id"])), _one_line(p["text"]), _one_line(p.get("title") or "")])
                n += 1
        else:
            for p in passages:
                rec = {"id": str(p["id"]), "title": p.get("title") or "", "text": p["text"]}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
    return n
