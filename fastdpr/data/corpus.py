"""A passage collection with O(1) random access by row and by id, without holding the passages in memory.

Index ids are int64 corpus *rows* (0..n-1, in file order); everything that retrieves maps rows back to the string
passage ids through the :class:`Corpus`.

On-disk layout. ``Corpus.open("psgs.tsv")`` scans the file once and writes a sidecar ``psgs.tsv.fdpridx`` (or, when
that directory is read-only, a file in ``$XDG_CACHE_HOME/fastdpr/corpus-index/``), atomically. It holds plain
numpy arrays, memory-mapped on open:

- ``starts``/``ends`` (uint64): byte range of each row's line, so ``c[row]`` is one ``pread`` and a parse;
- ``id_blob`` (uint8) + ``id_offsets`` (uint64): every id's UTF-8 bytes, so ``id_at`` never touches the source;
- ``hash_sorted`` (uint64) + ``hash_rows`` (int64): a 64-bit BLAKE2 hash of each id, sorted, with its row, so
  ``row_of(pid)`` is a binary search plus a string comparison (which also settles hash collisions).

Why arrays rather than sqlite or a dict: for 21M passages the arrays take ~40 bytes/row on disk, load in
milliseconds by mmap (the OS pages in only what lookups touch), and are shared between processes for free; a
Python dict of 21M ids would cost ~2 GB of RAM and a rebuild on every start. The sidecar records the source's
size and mtime and is rebuilt when either changes, or when it is unreadable or of another version.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import sys
import warnings
from array import array
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from fastdpr.atomic import atomic_open
from fastdpr.data._io import BadRows, ReadStats, is_gzip
from fastdpr.data.passages import PassageParser, detect_passage_format, resolve_passage_path, scan_passages
from fastdpr.errors import InputError

INDEX_SUFFIX = ".fdpridx"
_MAGIC = b"FDPRCIX1"
_VERSION = 1
_ALIGN = 64
_MISSING = object()


def id_hash(pid: str) -> int:
    """Stable 64-bit hash of a passage id (Python's ``hash`` is salted per process, so it cannot be stored)."""
    return int.from_bytes(hashlib.blake2b(pid.encode("utf-8"), digest_size=8).digest(), "little")


class Corpus:
    """Passages addressed by row (``c[row]``) and by id (``c.get(pid)``).

    >>> c = Corpus.from_passages([{"id": "a", "title": "T", "text": "first"}, {"id": "b", "title": "", "text": "x"}])
    >>> len(c), c[1]["id"], c.row_of("a"), c.get("b")["text"]
    (2, 'b', 0, 'x')
    >>> c = Corpus.open("psgs_w100.tsv")  # doctest: +SKIP  (builds psgs_w100.tsv.fdpridx once)
    """

    # ---- construction ---------------------------------------------------------------------------------------
    def __init__(self):  # use Corpus.open or Corpus.from_passages
        self.path: Path | None = None
        self._mem: list[dict] | None = None
        self._mem_rows: dict[str, int] | None = None
        self._ids_cache: list[str] | None = None
        self._fd: int | None = None
        self._parser: PassageParser | None = None
        self.index_path: Path | None = None
        self.bad_rows = 0
        self._blob: bytes | mmap.mmap = b""
        self._blob_at = 0

    @classmethod
    def from_passages(cls, passages: Iterable[dict]) -> "Corpus":
        """An in-memory corpus (rows in the given order). Duplicate or empty ids raise :class:`InputError`."""
        self = cls()
        self._mem = []
        self._mem_rows = {}
        for i, p in enumerate(passages):
            pid = str(p["id"])
            if not pid:
                raise InputError(f"passage {i} has an empty id")
            if pid in self._mem_rows:
                raise InputError(f"duplicate passage id {pid!r} (rows {self._mem_rows[pid]} and {i})")
            self._mem_rows[pid] = i
            self._mem.append({"id": pid, "title": p.get("title") or "", "text": p["text"]})
        return self

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        fmt: str = "auto",
        skip_bad: bool = False,
        index_path: str | os.PathLike | None = None,
        rebuild: bool = False,
        show_progress: bool | None = None,
    ) -> "Corpus":
        """Open a passage file (DPR TSV, JSONL, BEIR ``corpus.jsonl`` or a BEIR directory) for random access,
        building or refreshing its sidecar offset index first when needed.

        The sidecar (row offsets and an id hash table, about 40 bytes a passage) is written once, atomically, as
        ``<file>.fdpridx`` beside the file, or under ``$XDG_CACHE_HOME/fastdpr/corpus-index/`` (default
        ``~/.cache``) when that folder is read-only; ``index_path`` puts it elsewhere. It is rebuilt when the file's
        size or modification time changes.

        Bad rows raise :class:`InputError` naming ``file:line`` (duplicate ids included); with ``skip_bad=True``
        they are left out of the rows, with a warning, and counted in ``corpus.bad_rows``.
        """
        source = resolve_passage_path(path)
        if not source.exists():
            raise InputError("no such file", str(source))
        if is_gzip(source):
            raise InputError("random access needs an uncompressed file: decompress it, or stream it with "
                             "iter_passages", str(source))
        fmt = detect_passage_format(source) if fmt == "auto" else fmt
        self = cls()
        self.path = source
        st = source.stat()
        want = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "fmt": fmt, "skip_bad": bool(skip_bad)}
        candidates = [Path(index_path)] if index_path else [source.with_name(source.name + INDEX_SUFFIX),
                                                          _cache_index_path(source)]
        loaded = None
        if not rebuild:
            for cand in candidates:
                loaded = _load_index(cand, want)
                if loaded is not None:
                    self.index_path = cand
                    break
        if loaded is None:
            meta, arrays = _build_index(source, fmt, skip_bad, show_progress)
            meta.update(want)
            self.index_path = _write_first_writable(candidates, meta, arrays)
            loaded = _load_index(self.index_path, want) if self.index_path else (meta, arrays)
        meta, arrays = loaded
        self._starts = arrays["starts"]
        self._ends = arrays["ends"]
        self._id_blob = arrays["id_blob"]
        self._blob_at = int(meta.get("_blob_file_offset", -1))
        self._attach_blob()
        self._id_offsets = arrays["id_offsets"]
        self._hash_sorted = arrays["hash_sorted"]
        self._hash_rows = arrays["hash_rows"]
        self.bad_rows = int(meta.get("bad", 0))
        self._parser = PassageParser(fmt)
        if fmt == "tsv":
            self._parser.columns = dict(meta["columns"])
            self._parser.ncols = int(meta["ncols"])
        self._fd = os.open(source, os.O_RDONLY)
        return self

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _attach_blob(self) -> None:
        """Id bytes are sliced from an ``mmap`` of the index file (a plain bytes slice, cheaper than slicing a
        numpy memmap, which builds an array object per slice), or from an in-memory copy when the index could not
        be written."""
        if self._blob_at >= 0 and self.index_path is not None:
            with open(self.index_path, "rb") as fh:
                self._blob = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            self._blob, self._blob_at = self._id_blob.tobytes(), 0

    def __getstate__(self):  # picklable (DataLoader workers): fd and mmap are reopened on the other side
        state = self.__dict__.copy()
        state["_fd"] = None
        state.pop("_blob", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.path is not None and self._mem is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            self._attach_blob()

    # ---- access ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._mem) if self._mem is not None else len(self._starts)

    def _check_row(self, row) -> int:
        n = len(self)
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"corpus rows are integers, got {type(row).__name__} (use .get(pid) for ids)")
        row = int(row)
        if row < 0:
            row += n
        if not 0 <= row < n:
            raise IndexError(f"corpus row {row} out of range (corpus has {n} passages)")
        return row

    def __getitem__(self, row: int) -> dict:
        row = self._check_row(row)
        if self._mem is not None:
            return dict(self._mem[row])
        start, end = int(self._starts[row]), int(self._ends[row])
        raw = os.pread(self._fd, end - start, start)
        return self._parse(raw, row)

    def _parse(self, raw: bytes, row: int) -> dict:
        if raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            return self._parser.parse(raw.decode("utf-8").rstrip("\r\n"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"row {row} changed since it was indexed ({exc}); reopen with rebuild=True",
                             str(self.path)) from None

    def __iter__(self) -> Iterator[dict]:
        if self._mem is not None:
            for p in self._mem:
                yield dict(p)
            return
        with open(self.path, "rb", buffering=1 << 20) as fh:
            for row in range(len(self)):
                start, end = int(self._starts[row]), int(self._ends[row])
                if fh.tell() != start:
                    fh.seek(start)
                yield self._parse(fh.read(end - start), row)

    def id_at(self, row: int) -> str:
        row = self._check_row(row)
        if self._mem is not None:
            return self._mem[row]["id"]
        a, b = int(self._id_offsets[row]), int(self._id_offsets[row + 1])
        return self._blob[self._blob_at + a:self._blob_at + b].decode("utf-8")

    def ids_at(self, rows) -> list[str | None]:
        """Ids of many rows (e.g. an index's result array); ``-1`` (no result) maps to None."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if self._mem is not None:
            return [None if r < 0 else self.id_at(r) for r in rows.tolist()]
        n = len(self)
        if rows.size and (rows.max() >= n or rows.min() < -1):
            raise IndexError(f"corpus rows must be -1 or in [0, {n}), got {rows.min()}..{rows.max()}")
        safe = np.where(rows < 0, 0, rows)
        starts = (self._id_offsets[safe].astype(np.int64) + self._blob_at).tolist()
        ends = (self._id_offsets[safe + 1].astype(np.int64) + self._blob_at).tolist()
        blob = self._blob
        return [None if r < 0 else blob[a:b].decode("utf-8") for r, a, b in zip(rows.tolist(), starts, ends)]

    @property
    def ids(self) -> list[str]:
        """All ids in row order (built once, then cached: ~60 bytes per passage of RAM)."""
        if self._ids_cache is None:
            if self._mem is not None:
                self._ids_cache = [p["id"] for p in self._mem]
            else:
                blob, at = self._blob, self._blob_at
                offs = (self._id_offsets.astype(np.int64) + at).tolist()
                self._ids_cache = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(len(self))]
        return self._ids_cache

    def _find(self, pid: str) -> int:
        pid = str(pid)
        if self._mem is not None:
            return self._mem_rows.get(pid, -1)
        h = id_hash(pid)
        hs = self._hash_sorted
        k = int(np.searchsorted(hs, np.uint64(h)))
        while k < len(hs) and int(hs[k]) == h:  # more than one step only on a 64-bit hash collision
            row = int(self._hash_rows[k])
            if self.id_at(row) == pid:
                return row
            k += 1
        return -1

    def row_of(self, pid: str) -> int:
        """The row of passage ``pid``; ``KeyError`` when absent."""
        row = self._find(pid)
        if row < 0:
            raise KeyError(f"passage id {pid!r} is not in the corpus")
        return row

    def __contains__(self, pid: str) -> bool:
        return self._find(pid) >= 0

    def get(self, pid: str, default=_MISSING) -> dict:
        """The passage with id ``pid``; ``KeyError`` when absent unless a ``default`` is given."""
        row = self._find(pid)
        if row < 0:
            if default is _MISSING:
                raise KeyError(f"passage id {pid!r} is not in the corpus")
            return default
        return self[row]

    def __repr__(self) -> str:
        where = "in memory" if self._mem is not None else str(self.path)
        return f"Corpus({len(self)} passages, {where})"


# ---- the sidecar index ------------------------------------------------------------------------------------------


def _cache_index_path(source: Path) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastdpr" / "corpus-index"
    key = hashlib.blake2b(str(source.resolve()).encode(), digest_size=10).hexdigest()
    return base / f"{source.name}.{key}{INDEX_SUFFIX}"


def _build_index(source: Path, fmt: str, skip_bad: bool, show_progress: bool | None):
    stats = ReadStats()
    starts, ends, lines, hashes, id_offsets = array("Q"), array("Q"), array("Q"), array("Q"), array("Q", [0])
    id_blob = bytearray()
    progress = _progress(source, show_progress)
    last = 0
    for lineno, start, end, p in scan_passages(source, fmt, skip_bad, stats):
        starts.append(start)
        ends.append(end)
        lines.append(lineno)
        b = p["id"].encode("utf-8")
        id_blob += b
        id_offsets.append(len(id_blob))
        hashes.append(id_hash(p["id"]))
        if progress is not None and end - last > (1 << 24):
            progress.update(end - last)
            last = end
    if progress is not None:
        progress.close()
    # the parser's TSV column layout must be known to parse rows later: read it again from the first line
    parser_state = _header_layout(source, fmt)

    arrays = {
        "starts": np.frombuffer(starts, dtype=np.uint64) if starts else np.zeros(0, np.uint64),
        "ends": np.frombuffer(ends, dtype=np.uint64) if ends else np.zeros(0, np.uint64),
        "id_blob": np.frombuffer(bytes(id_blob), dtype=np.uint8),
        "id_offsets": np.frombuffer(id_offsets, dtype=np.uint64),
    }
    h = np.frombuffer(hashes, dtype=np.uint64) if hashes else np.zeros(0, np.uint64)
    line_arr = np.frombuffer(lines, dtype=np.uint64) if lines else np.zeros(0, np.uint64)
    order = np.argsort(h, kind="stable")  # equal hashes keep file order: the first occurrence comes first
    h_sorted = h[order]
    if len(h) == 0:
        raise InputError("no passages in the file", str(source))
    dup_policy = BadRows(source, skip_bad, stats)
    drop = _duplicate_rows(arrays, h_sorted, order, line_arr, dup_policy)
    if drop:
        arrays, h, order, h_sorted = _drop_rows(arrays, h, sorted(drop))
        stats.rows -= len(drop)
        dup_policy.finish()
    arrays["hash_sorted"] = np.ascontiguousarray(h_sorted)
    arrays["hash_rows"] = order.astype(np.int64)
    meta = {"n": int(len(arrays["starts"])), "bad": stats.bad}
    meta.update(parser_state)
    return meta, arrays


def _header_layout(source: Path, fmt: str) -> dict:
    parser = PassageParser(fmt)
    if fmt == "tsv":
        with open(source, "rb") as fh:
            for raw in fh:
                try:
                    line = raw.decode("utf-8-sig").rstrip("\r\n")
                except UnicodeDecodeError:
                    break
                if line.strip():
                    parser.set_header(line)
                    break
    return {"columns": parser.columns, "ncols": parser.ncols}


def _duplicate_rows(arrays, h_sorted, order, lines, bad: BadRows) -> set[int]:
    """Rows whose id repeats an earlier row's. Raises (naming both lines) unless skipping bad rows."""
    if len(h_sorted) < 2:
        return set()
    same = np.nonzero(h_sorted[1:] == h_sorted[:-1])[0]
    if len(same) == 0:
        return set()
    blob = arrays["id_blob"]
    offs = arrays["id_offsets"]

    def id_of(row):
        return bytes(blob[int(offs[row]):int(offs[row + 1])]).decode("utf-8")

    drop: set[int] = set()
    groups: dict[int, dict[str, int]] = {}
    for k in same.tolist():
        for pos in (k, k + 1):
            row = int(order[pos])
            seen = groups.setdefault(int(h_sorted[pos]), {})
            pid = id_of(row)
            first = seen.setdefault(pid, row)
            if first != row and row not in drop:
                drop.add(row)
                bad(f"duplicate passage id {pid!r} (first at line {int(lines[first])})", int(lines[row]))
    return drop


def _drop_rows(arrays, h, drop_rows: list[int]):
    keep = np.ones(len(arrays["starts"]), dtype=bool)
    keep[drop_rows] = False
    offs = arrays["id_offsets"]
    blob = arrays["id_blob"]
    kept = np.nonzero(keep)[0]
    pieces = [blob[int(offs[r]):int(offs[r + 1])] for r in kept.tolist()]
    lengths = np.array([len(x) for x in pieces], dtype=np.uint64)
    new = {
        "starts": arrays["starts"][keep],
        "ends": arrays["ends"][keep],
        "id_blob": np.concatenate(pieces) if pieces else np.zeros(0, np.uint8),
        "id_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64),
    }
    h = h[keep]
    order = np.argsort(h, kind="stable")
    return new, h, order, h[order]


def _progress(source: Path, show_progress: bool | None):
    if show_progress is False:
        return None
    from fastdpr.progress import progress

    return progress(total=source.stat().st_size, unit="B", desc=f"indexing {source.name}", enabled=show_progress)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _write_index(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    layout, rel = {}, 0
    for name, arr in arrays.items():
        layout[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": rel}
        rel = _align(rel + arr.nbytes)
    header = json.dumps({**meta, "version": _VERSION, "arrays": layout}).encode()
    data_start = _align(len(_MAGIC) + 8 + len(header))
    with atomic_open(path, "wb") as fh:
        fh.write(_MAGIC + struct.pack("<Q", len(header)) + header)
        fh.write(b"\0" * (data_start - fh.tell()))
        for name, arr in arrays.items():
            fh.write(b"\0" * (data_start + layout[name]["offset"] - fh.tell()))
            fh.write(np.ascontiguousarray(arr).tobytes())


def _write_first_writable(candidates: list[Path], meta, arrays) -> Path | None:
    for cand in candidates:
        try:
            _write_index(cand, meta, arrays)
            return cand
        except OSError:
            continue
    warnings.warn("could not write a corpus index anywhere; it lives in memory only this time", stacklevel=3)
    return None


def _load_index(path: Path, want: dict):
    """(meta, memory-mapped arrays) when ``path`` is a readable index matching ``want``, else None."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_MAGIC)) != _MAGIC:
                return None
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > 1 << 24:
                return None
            meta = json.loads(fh.read(hlen))
        if meta.get("version") != _VERSION or any(meta.get(k) != v for k, v in want.items()):
            return None
        data_start = _align(len(_MAGIC) + 8 + hlen)
        size = path.stat().st_size
        arrays = {}
        for name, spec in meta["arrays"].items():
            dtype = np.dtype(spec["dtype"])
            shape = tuple(spec["shape"])
            offset = data_start + spec["offset"]
            nbytes = dtype.itemsize * int(np.prod(shape))
            if offset + nbytes > size:
                return None
            # a plain ndarray view of the memmap: same pages, without np.memmap's per-index subclass overhead
            arrays[name] = (np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)
                            if nbytes else np.zeros(shape, dtype))
            if name == "id_blob":
                meta["_blob_file_offset"] = offset
        needed = {"starts", "ends", "id_blob", "id_offsets", "hash_sorted", "hash_rows"}
        if not needed <= arrays.keys() or len(arrays["id_offsets"]) != meta["n"] + 1:
            return None
        return meta, arrays
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
