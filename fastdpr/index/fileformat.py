"""The index file format (see ``csrc/io.h`` for the layout): a pure-Python twin of the C++ reader and writer.

``open_writer``/``open_reader`` return the compiled implementation when the extension is present (and not
disabled by ``FASTDPR_NO_NATIVE``/``force_fallback``, see ``_native``) and this one otherwise; both expose the same
small API, so index types write sections the same way either way::

    w = open_writer("x.fdpr", "flat")
    w.meta("dim", 768)
    w.add("vectors", array)
    w.commit()
    r = open_reader("x.fdpr")
    r.type, r.meta_int("dim"), r.array("vectors", np.float32)
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fastdpr.atomic import atomic_open, remove_stale_temp_files
from fastdpr.errors import InputError
from fastdpr.index._native import native

MAGIC = b"FDPRIDX\0"
VERSION = 1
HEADER_SIZE = 64
ENTRY_SIZE = 48
ALIGN = 64
NAME_MAX = 15


def open_writer(path: str | os.PathLike, kind: str, compiled: bool | None = None):
    """A writer for ``path`` tagged ``kind``. ``compiled=None``: the C++ writer when the compiled core is in use;
    ``compiled=True`` (an index that runs on the compiled core writes through it): the C++ writer even when the
    fallbacks are forced for new objects."""
    C = native(ignore_forced=bool(compiled))
    if compiled is None:
        compiled = C is not None
    if compiled and C is None:
        raise RuntimeError("the compiled extension fastdpr._C is not available")
    # temporary files of writers that were killed before they committed (both writers' naming schemes)
    remove_stale_temp_files(path)
    if compiled:
        return CompiledWriter(C.FileWriter(str(path), kind))
    return PyWriter(path, kind)


def open_reader(path: str | os.PathLike, verify: bool = True):
    """Open and validate an index file (the C++ reader when the compiled core is in use). Bad files raise
    ``InputError``."""
    C = native()
    if C is not None:
        try:
            return CompiledReader(C.FileReader(str(path), verify))
        except ValueError as exc:
            raise InputError(str(exc)) from None
    return PyReader(path, verify=verify)


def peek_type(path: str | os.PathLike) -> str:
    if not os.path.isfile(path):  # a FIFO would block the open below until someone writes to it
        raise InputError("not a valid fastdpr index: not a regular file", path=str(path))
    with open(path, "rb") as fh:
        header = fh.read(HEADER_SIZE)
    if len(header) < HEADER_SIZE or header[:8] != MAGIC:
        raise InputError("not a valid fastdpr index: bad or truncated header", path=str(path))
    if struct.unpack_from("<I", header, 52)[0] != zlib.crc32(header[:52]):
        raise InputError("not a valid fastdpr index: header checksum mismatch", path=str(path))
    return header[16:32].split(b"\0", 1)[0].decode("ascii", "replace")


def _dirty_tail(field: bytes) -> bool:
    """A NUL-padded name field with anything but NULs after its first NUL."""
    nul = field.find(b"\0")
    return nul >= 0 and any(field[nul:])


def _check_name(name: str, what: str) -> bytes:
    raw = name.encode("ascii")
    if not raw or len(raw) > NAME_MAX or b"\0" in raw:
        raise ValueError(f"{what} name must be 1..{NAME_MAX} ASCII bytes: {name!r}")
    return raw


def _meta_text(items: list[tuple[str, str]]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in items).encode("utf-8")


class PyWriter:
    def __init__(self, path: str | os.PathLike, kind: str):
        self.path = Path(path)
        self.kind = _check_name(kind, "type")
        self._sections: list[tuple[bytes, Any]] = []
        self._meta: list[tuple[str, str]] = []

    def add(self, name: str, array: Any) -> None:
        raw = _check_name(name, "section")
        if any(raw == n for n, _ in self._sections):
            raise ValueError(f"duplicate section {name!r}")
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1) if isinstance(array, np.ndarray) \
            else np.frombuffer(bytes(array), dtype=np.uint8)
        self._sections.append((raw, data))

    def meta(self, key: str, value: Any) -> None:
        value = repr(float(value)) if isinstance(value, float) else str(value)
        if "=" in key or "\n" in key or "\n" in value:
            raise ValueError(f"bad metadata key or value: {key!r}")
        self._meta.append((key, value))

    def commit(self) -> None:
        sections = list(self._sections)
        if self._meta:
            sections.append((b"meta", np.frombuffer(_meta_text(self._meta), dtype=np.uint8)))
        with atomic_open(self.path, "wb") as fh:
            fh.write(b"\0" * HEADER_SIZE)
            pos = HEADER_SIZE
            entries = []
            for name, data in sections:
                pad = (-pos) % ALIGN
                fh.write(b"\0" * pad)
                pos += pad
                entries.append((name, pos, data.nbytes, zlib.crc32(data)))
                fh.write(memoryview(data))
                pos += data.nbytes
            write_table_and_header(fh, self.kind, entries, pos)


def write_table_and_header(fh: Any, kind: bytes, entries: list[tuple[bytes, int, int, int]], pos: int) -> int:
    """Finish a file whose sections are written: pad ``pos`` (the end of the last section) to the alignment, write
    the section table there and the header at offset 0 (the first ``HEADER_SIZE`` bytes, left zero until now).
    ``entries`` are ``(name, offset, length, crc32)``. Returns the file size. Writers that stream a section in
    pieces (``fastdpr.index.disk_build``) end their file here too."""
    table = b"".join(struct.pack("<16sQQII8x", name, off, length, crc, 0) for name, off, length, crc in entries)
    pad = (-pos) % ALIGN
    fh.seek(pos)
    fh.write(b"\0" * pad)
    table_offset = pos + pad
    fh.write(table)
    file_size = table_offset + len(table)
    header = bytearray(HEADER_SIZE)
    struct.pack_into("<8sII16sQQI", header, 0, MAGIC, VERSION, len(entries), kind, file_size, table_offset,
                     zlib.crc32(table))
    struct.pack_into("<I", header, 52, zlib.crc32(bytes(header[:52])))
    fh.seek(0)
    fh.write(header)
    return file_size


class _TypedReader:
    """Typed access shared by both readers, on top of their ``section``, ``meta`` and ``_fail``."""

    def array(self, name: str, dtype: Any, count: int | None = None) -> np.ndarray:
        """The section as a read-only array of ``dtype`` (a view into the file mapping); ``count`` checks its
        length."""
        raw = self.section(name)
        itemsize = np.dtype(dtype).itemsize
        if raw.shape[0] % itemsize or (count is not None and raw.shape[0] != count * itemsize):
            self._fail(f"section {name!r} has the wrong length")
        return np.asarray(raw).view(dtype)

    def meta_int(self, key: str, lo: int | None = None, hi: int | None = None) -> int:
        try:
            value = int(self.meta(key))
        except ValueError:
            self._fail(f"metadata {key!r} is not an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self._fail(f"metadata {key!r} = {value} is out of range")
        return value

    def meta_float(self, key: str) -> float:
        try:
            return float(self.meta(key))
        except ValueError:
            self._fail(f"metadata {key!r} is not a number")


class PyReader(_TypedReader):
    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = str(path)
        if not os.path.isfile(path):
            self._fail("not a regular file")
        size = os.path.getsize(path)
        if size < HEADER_SIZE:
            self._fail(f"file is truncated ({size} bytes)")
        self._buf = np.memmap(path, dtype=np.uint8, mode="r")
        header = bytes(self._buf[:HEADER_SIZE])
        if header[:8] != MAGIC:
            self._fail("bad magic number")
        if struct.unpack_from("<I", header, 52)[0] != zlib.crc32(header[:52]):
            self._fail("header checksum mismatch (corrupted header)")
        _, version, n_sections, kind, file_size, table_offset, table_crc = struct.unpack_from("<8sII16sQQI", header)
        if version != VERSION:
            self._fail(f"format version {version} (this build reads {VERSION})")
        self.type = kind.split(b"\0", 1)[0].decode("ascii", "replace")
        if file_size != size:
            self._fail(f"file is {size} bytes but its header says {file_size} (truncated or appended to)")
        if not (HEADER_SIZE <= table_offset <= size and table_offset + n_sections * ENTRY_SIZE == size):
            self._fail("section table out of bounds")
        table = bytes(self._buf[table_offset:size])
        if zlib.crc32(table) != table_crc:
            self._fail("section table checksum mismatch")
        self._sections: dict[str, tuple[int, int]] = {}
        self._crcs: dict[str, int] = {}
        for i in range(n_sections):
            raw, off, length, crc, _ = struct.unpack_from("<16sQQII8x", table, i * ENTRY_SIZE)
            name = raw.split(b"\0", 1)[0].decode("ascii", "replace")
            if not name or off < HEADER_SIZE or off > table_offset or length > table_offset - off:
                self._fail(f"section {name!r} out of bounds")
            if name in self._sections:
                self._fail(f"duplicate section {name!r}")
            if verify and zlib.crc32(self._buf[off:off + length]) != crc:
                self._fail(f"checksum mismatch in section {name!r}")
            self._sections[name] = (off, length)
            self._crcs[name] = crc
        # every byte outside the sections is zero padding, and sections do not overlap (see csrc/io.cpp)
        if any(header[56:64]) or _dirty_tail(kind):
            self._fail("reserved header bytes are not zero")
        pos = HEADER_SIZE
        for off, length in sorted(self._sections.values()):
            if off < pos:
                self._fail("sections overlap")
            if self._buf[pos:off].any():
                self._fail("padding bytes are not zero")
            pos = off + length
        if self._buf[pos:table_offset].any():
            self._fail("padding bytes are not zero")
        for i in range(n_sections):
            entry = table[i * ENTRY_SIZE:(i + 1) * ENTRY_SIZE]
            if any(entry[36:]) or _dirty_tail(entry[:16]):
                self._fail("reserved table bytes are not zero")
        self._meta: dict[str, str] = {}
        if "meta" in self._sections:
            text = bytes(self.section("meta")).decode("utf-8", "replace")
            for line in text.splitlines():
                if "=" not in line:
                    self._fail("bad metadata line")
                k, v = line.split("=", 1)
                self._meta[k] = v

    def _fail(self, what: str):
        raise InputError(f"not a valid fastdpr index: {what}", path=self.path)

    fail = _fail

    def has(self, name: str) -> bool:
        return name in self._sections

    def names(self) -> list[str]:
        return sorted(self._sections)

    def section(self, name: str) -> np.ndarray:
        if name not in self._sections:
            self._fail(f"missing section {name!r}")
        off, length = self._sections[name]
        return self._buf[off:off + length]

    def span(self, name: str) -> tuple[int, int]:
        """``(offset, length)`` of the section in the file, for copying it without mapping it."""
        if name not in self._sections:
            self._fail(f"missing section {name!r}")
        return self._sections[name]

    def meta_items(self) -> list[tuple[str, str]]:
        return list(self._meta.items())

    def crc(self, name: str) -> int:
        """The section's CRC-32 from the table (checked at open when ``verify``)."""
        if name not in self._sections:
            self._fail(f"missing section {name!r}")
        return self._crcs[name]

    def has_meta(self, key: str) -> bool:
        return key in self._meta

    def meta(self, key: str) -> str:
        if key not in self._meta:
            self._fail(f"missing metadata {key!r}")
        return self._meta[key]



class CompiledWriter:
    """The C++ writer behind the Python writer API (``raw`` goes to compiled index types' ``save``)."""

    def __init__(self, raw):
        self.raw = raw

    def add(self, name: str, array: Any) -> None:
        data = np.ascontiguousarray(array) if isinstance(array, np.ndarray) else np.frombuffer(bytes(array), np.uint8)
        self.raw.add(name, data.view(np.uint8).reshape(-1))

    def meta(self, key: str, value: Any) -> None:
        self.raw.meta(key, repr(float(value)) if isinstance(value, float) else str(value))

    def commit(self) -> None:
        self.raw.commit()


class CompiledReader(_TypedReader):
    """The C++ reader behind the Python reader API (``raw`` goes to compiled index types' ``load``)."""

    def __init__(self, raw):
        self.raw = raw
        self.path = raw.path
        self.type = raw.type

    def _fail(self, what: str):
        raise InputError(f"not a valid fastdpr index: {what}", path=self.path)

    fail = _fail

    def has(self, name: str) -> bool:
        return self.raw.has(name)

    def names(self) -> list[str]:
        return self.raw.names()

    def section(self, name: str) -> np.ndarray:
        if not self.raw.has(name):
            self._fail(f"missing section {name!r}")
        return self.raw.section(name)

    def has_meta(self, key: str) -> bool:
        return self.raw.has_meta(key)

    def meta(self, key: str) -> str:
        if not self.raw.has_meta(key):
            self._fail(f"missing metadata {key!r}")
        return self.raw.meta(key)

