"""Documents into passages, DPR's psgs_w100 way: each document's text is cut into consecutive blocks of N
whitespace-separated words (default 100; the last block may be shorter), the title carried apart in its own field.
``stride`` < N starts a block every ``stride`` words, so neighbours overlap by N - stride words.

Passage ids are stable: ``<document id>#<block number>`` (0-based), or sequential integers from 1 (as in
psgs_w100.tsv) with ``numeric_ids=True``.

Example::

    >>> docs = [{"id": "d1", "title": "Aaron", "text": " ".join(f"w{i}" for i in range(250))}]
    >>> [(p["id"], len(p["text"].split())) for p in split_documents(docs, words=100)]
    [('d1#0', 100), ('d1#1', 100), ('d1#2', 50)]
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from fastdpr.data._io import BadRows, ReadStats, detect_by_extension, first_char, numbered_lines, open_binary
from fastdpr.data.passages import write_passages
from fastdpr.errors import InputError

TEXT_SUFFIXES = (".txt", ".text", ".md")


def split_text(text: str, words: int = 100, stride: int | None = None) -> list[str]:
    """``text`` as blocks of ``words`` words joined by single spaces; a block starts every ``stride`` words
    (default: ``words``, disjoint). A tail that an overlapping window already covered makes no extra block.

    >>> split_text("a b c d e", words=2)
    ['a b', 'c d', 'e']
    >>> split_text("a b c d e", words=3, stride=2)
    ['a b c', 'c d e']
    """
    if words < 1:
        raise ValueError(f"words per passage must be >= 1, got {words}")
    stride = words if stride is None else stride
    if not 1 <= stride <= words:
        raise ValueError(f"stride must be between 1 and words ({words}), got {stride}")
    tokens = text.split()
    blocks = []
    for start in range(0, len(tokens), stride):
        blocks.append(" ".join(tokens[start:start + words]))
        if start + words >= len(tokens):
            break
    return blocks


def split_documents(
    documents: Iterable[dict],
    words: int = 100,
    stride: int | None = None,
    numeric_ids: bool = False,
    first_id: int = 1,
) -> Iterator[dict]:
    """Passages ``{"id", "title", "text"}`` of each document ``{"id", "title", "text"}``, in order.
    Two documents with the same id raise :class:`InputError` (their passage ids would collide)."""
    seen: set[str] = set()
    next_id = first_id
    for doc in documents:
        doc_id = str(doc["id"])
        if not numeric_ids:
            if doc_id in seen:
                raise InputError(f"duplicate document id {doc_id!r}: passage ids would collide "
                                 "(use numeric ids to number passages instead)")
            seen.add(doc_id)
        title = " ".join((doc.get("title") or "").split())
        for k, block in enumerate(split_text(doc["text"], words, stride)):
            if numeric_ids:
                pid = str(next_id)
                next_id += 1
            else:
                pid = f"{doc_id}#{k}"
            yield {"id": pid, "title": title, "text": block}


def _document_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES)
            if not found:
                raise InputError(f"no {'/'.join(TEXT_SUFFIXES)} files in the directory", str(p))
            files.extend(found)
        elif not p.exists():
            raise InputError("no such file", str(p))
        else:
            files.append(p)
    return files


def _is_jsonl(path: Path) -> bool:
    ext = detect_by_extension(path)
    if ext in ("jsonl", "json"):
        return True
    if path.suffix.lower() in TEXT_SUFFIXES:
        return False
    return first_char(path) == "{"


def iter_documents(
    paths: str | os.PathLike | Sequence[str | os.PathLike], skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[dict]:
    """Documents ``{"id", "title", "text"}`` from JSONL files (``id``/``_id`` optional: the line number stands in;
    ``title`` optional) and plain text files (one document each: id and title are the file's stem), or
    directories of text files. An empty document is a bad row (:class:`InputError`, or skipped with
    ``skip_bad``)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in _document_files(paths):
        bad = BadRows(path, skip_bad, stats)
        if _is_jsonl(path):
            with open_binary(path) as fh:
                for lineno, line in numbered_lines(fh, bad):
                    try:
                        doc = _parse_document(line, lineno)
                    except ValueError as exc:
                        bad(str(exc), lineno)
                        continue
                    bad.stats.rows += 1
                    yield doc
        else:
            try:
                text = path.read_bytes().decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                bad(f"not valid UTF-8 at byte {exc.start}", path.read_bytes()[: exc.start].count(b"\n") + 1)
                continue
            if not text.strip():
                bad("empty document", 1)
                continue
            bad.stats.rows += 1
            yield {"id": path.stem, "title": path.stem.replace("_", " "), "text": text}
        bad.finish()


def _parse_document(line: str, lineno: int) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    text = obj.get("text", obj.get("contents"))
    if not isinstance(text, str):
        raise ValueError("missing field 'text'")
    if not text.strip():
        raise ValueError("empty document text")
    title = obj.get("title") or ""
    if not isinstance(title, str):
        raise ValueError("'title' must be a string")
    doc_id = next((obj[k] for k in ("id", "_id", "docid") if obj.get(k) not in (None, "")), None)
    doc_id = str(lineno) if doc_id is None else str(doc_id).strip()
    if any(c.isspace() for c in doc_id):
        raise ValueError(f"document id {doc_id!r} contains whitespace")
    return {"id": doc_id, "title": title, "text": text}


def split_files(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    words: int = 100,
    stride: int | None = None,
    numeric_ids: bool = False,
    fmt: str = "auto",
    skip_bad: bool = False,
    stats: ReadStats | None = None,
) -> int:
    """Split document files into a passage file (DPR TSV with header, or JSONL), written atomically.
    Returns the number of passages.

    >>> split_files("wiki.jsonl", "passages.tsv")  # doctest: +SKIP
    """
    docs = iter_documents(inputs, skip_bad=skip_bad, stats=stats)
    return write_passages(output, split_documents(docs, words, stride, numeric_ids), fmt=fmt)
