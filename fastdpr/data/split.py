"""Documents into passages, DPR's psgs_w100 way: each document's text is cut into consecutive blocks of N
whitespace-separated words (default 100; the last block may be shorter), the title carried apart in its own field.
``stride`` < N starts a block every ``stride`` words, so neighbours overlap by N - stride words.

Passage ids are stable: ``<document id>#<block number>`` (0-based), or sequential integers from 1 (as in
psgs_w100.tsv) with ``numeric_ids=True``.

Question files name the *documents* their questions were written about, not the passages: :func:`split_files`
therefore writes a document map beside the passages (``<passages>.docmap.tsv``: a header line, then one line per
document, ``doc_id<TAB>passage_id<TAB>passage_id...``), and :func:`gold_passages` turns a question's gold
document ids into that document's passages that contain an answer (DPR's rule for positives).

Example::

    >>> docs = [{"id": "d1", "title": "Aaron", "text": " ".join(f"w{i}" for i in range(250))}]
    >>> [(p["id"], len(p["text"].split())) for p in split_documents(docs, words=100)]
    [('d1#0', 100), ('d1#1', 100), ('d1#2', 50)]
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence

from fastdpr.data._io import (
    BadRows,
    ReadStats,
    detect_by_extension,
    first_char,
    numbered_lines,
    open_binary,
    open_output,
)
from fastdpr.data._jsonstream import parse_json_object
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
    doc_map: MutableMapping[str, list[str]] | None = None,
) -> Iterator[dict]:
    """Passages ``{"id", "title", "text"}`` of each document ``{"id", "title", "text"}``, in order.
    Two documents with the same id raise :class:`InputError` (their passage ids would collide) unless passages
    are numbered. ``doc_map``, when given, receives ``doc_map[doc id] = [passage ids]`` for each document once
    its passages have been yielded (a repeated id, with numbered passages, gets the passages of all its copies).

    >>> docs = [{"id": "d1", "title": "", "text": "a b c"}]
    >>> doc_map = {}
    >>> [p["id"] for p in split_documents(docs, words=2, doc_map=doc_map)], doc_map
    (['d1#0', 'd1#1'], {'d1': ['d1#0', 'd1#1']})
    """
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
        pids = []
        for k, block in enumerate(split_text(doc["text"], words, stride)):
            if numeric_ids:
                pid = str(next_id)
                next_id += 1
            else:
                pid = f"{doc_id}#{k}"
            pids.append(pid)
            yield {"id": pid, "title": title, "text": block}
        if doc_map is not None:
            doc_map[doc_id] = (list(doc_map[doc_id]) if doc_id in doc_map else []) + pids


DOCMAP_SUFFIX = ".docmap.tsv"
_DOCMAP_HEADER = "doc_id\tpassage_ids"


def docmap_path(passages_path: str | os.PathLike) -> Path:
    """Where :func:`split_files` puts the document map of a passage file: ``<passages>.docmap.tsv``."""
    return Path(str(passages_path) + DOCMAP_SUFFIX)


class _DocMapWriter:
    """``doc_map[doc_id] = pids`` written out as lines (the map of a large corpus is not held in memory). It
    remembers nothing, so a repeated document gets a second line; :func:`read_docmap` joins them."""

    def __init__(self, fh):
        self._fh = fh
        fh.write(_DOCMAP_HEADER + "\n")

    def __contains__(self, doc_id: str) -> bool:
        return False

    def __setitem__(self, doc_id: str, pids: list[str]) -> None:
        for x in (doc_id, *pids):
            if "\t" in x or "\n" in x:
                raise InputError(f"id {x!r} holds a tab or a line break: it cannot go into the document map")
        self._fh.write("\t".join((doc_id, *pids)) + "\n")


def read_docmap(path: str | os.PathLike, only: Collection[str] | None = None) -> dict[str, list[str]]:
    """A document map written by :func:`split_files`: ``{doc id: [passage ids]}``; with ``only``, just those
    documents (a corpus-sized map need not be held to look up a training set's gold documents)."""
    path = str(path)
    out: dict[str, list[str]] = {}
    with open_binary(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.decode("utf-8", errors="strict").rstrip("\r\n")
            if lineno == 1:
                if line != _DOCMAP_HEADER:
                    raise InputError(f"not a document map (expected the header {_DOCMAP_HEADER!r})", path, 1)
                continue
            if not line:
                continue
            doc_id, *pids = line.split("\t")
            if not pids:
                raise InputError(f"document {doc_id!r} has no passages", path, lineno)
            if only is None or doc_id in only:
                out.setdefault(doc_id, []).extend(pids)
    return out


def gold_passages(gold_ids: Iterable[str], answers: Sequence[str], doc_map: Mapping[str, Sequence[str]],
                  passages, *, mode: str = "string") -> list[str]:
    """A question's gold passage ids from its gold ids: a document id of ``doc_map`` becomes that document's
    passages whose text contains an answer (DPR's ``has_answer``; every passage of the document when there are
    no answers to check, none when no passage holds one, e.g. an answer cut by a block boundary); any other id
    is kept as it is (it may already name a passage). ``passages``: a :class:`~fastdpr.data.Corpus` or a dict
    ``{passage id: {"text", ...}}``. Order follows the gold ids, then the document; no id twice.

    >>> docs = {"d1": ["d1#0", "d1#1"]}
    >>> texts = {"d1#0": {"text": "Paris is big"}, "d1#1": {"text": "Lyon is old"}}
    >>> gold_passages(["d1", "p7"], ["Lyon"], docs, texts)
    ['d1#1', 'p7']
    """
    from fastdpr.eval.retrieval import ranking_hits

    answers = [answers] if isinstance(answers, str) else list(answers)
    out: list[str] = []
    for gid in gold_ids:
        gid = str(gid)
        if gid not in doc_map:
            out.append(gid)
            continue
        pids = [str(p) for p in doc_map[gid]]
        if answers:
            pids = [p for p, hit in zip(pids, ranking_hits([pids], [answers], passages, mode=mode)[0]) if hit]
        out.extend(pids)
    return list(dict.fromkeys(out))


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
            unnamed = []
            with open_binary(path) as fh:
                # the line number stands in for a missing document id, so the parser sees it too
                for doc in bad.parsed(((n, (n, line)) for n, line in numbered_lines(fh, bad)),
                                      lambda item: _parse_document(item[1], item[0], unnamed)):
                    yield doc
            if unnamed:
                # gold ids in QA files cannot name these documents: say so rather than let mining miss them
                warnings.warn(f"{path}: {len(unnamed)} documents have no id (\"id\", \"_id\" or \"docid\"); "
                              f"their line numbers stand in (the first at line {unnamed[0]})", stacklevel=2)
            continue  # parsed() has called finish()
        data = path.read_bytes()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            # the words of every other reader (numbered_lines): the byte's offset within its line
            line_start = data.rfind(b"\n", 0, exc.start) + 1
            bad(f"not valid UTF-8 (byte {exc.start - line_start}: {data[exc.start:exc.start + 1]!r})",
                data[: exc.start].count(b"\n") + 1)
            continue
        if not text.strip():
            bad("empty document", 1)
            continue
        bad.stats.rows += 1
        yield {"id": path.stem, "title": path.stem.replace("_", " "), "text": text}
        bad.finish()


def _parse_document(line: str, lineno: int, unnamed: list[int] | None = None) -> dict:
    obj = parse_json_object(line)
    text = obj.get("text", obj.get("contents"))
    if not isinstance(text, str):
        if "text" in obj or "contents" in obj:
            raise ValueError(f"field 'text' must be a string, got {type(text).__name__}")
        keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
        raise ValueError(f"missing field 'text' (a document is {{\"id\", \"title\", \"text\"}}; this one has "
                         f"{keys})")
    if not text.strip():
        raise ValueError("empty document text")
    title = obj.get("title") or ""
    if not isinstance(title, str):
        raise ValueError("'title' must be a string")
    doc_id = next((obj[k] for k in ("id", "_id", "docid") if obj.get(k) not in (None, "")), None)
    if doc_id is None and unnamed is not None:
        unnamed.append(lineno)
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
    """Split document files into a passage file (DPR TSV with header, or JSONL) and its document map
    (:func:`docmap_path`), each written atomically; the map is put in place after the passages. Returns the
    number of passages.

    >>> split_files("wiki.jsonl", "passages.tsv")  # doctest: +SKIP
    """
    docs = iter_documents(inputs, skip_bad=skip_bad, stats=stats)
    with open_output(docmap_path(output)) as fh:
        return write_passages(output, split_documents(docs, words, stride, numeric_ids,
                                                      doc_map=_DocMapWriter(fh)), fmt=fmt)
