"""Streaming reader of one large top-level JSON array (DPR biencoder files and retriever results run to GBs).

The standard library has no incremental JSON parser, and the files are arrays of moderately sized objects, so the
reader keeps a text buffer and lets :meth:`json.JSONDecoder.raw_decode` take one element at a time, reading more
when an element is cut off at the buffer's end. Memory is bounded by the largest single element plus one read
chunk (elements above ``max_element_bytes`` are refused), never by the file.

JSON-lines records go through :func:`parse_json_object` too, so every reader words a bad line the same way.
"""
from __future__ import annotations

import codecs
import json
from typing import IO, Iterator

from fastdpr.errors import InputError

_WS = " \t\r\n"


class _Buffer:
    def __init__(self, fh: IO[bytes], path: str, chunk: int):
        self.fh = fh
        self.path = path
        self.chunk = chunk
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0
        self.eof = False
        self.line_base = 1  # line number of text[0]
        self.first = True
        self._counted = (0, 1)  # (pos, line at pos): lines are counted incrementally as elements go by

    def line_at(self, pos: int) -> int:
        cpos, cline = self._counted
        if pos < cpos:
            cpos, cline = 0, self.line_base
        line = cline + self.text.count("\n", cpos, pos)
        self._counted = (pos, line)
        return line

    def more(self, at_least: int = 0) -> bool:
        """Append at least one chunk (or ``at_least`` bytes) of text; False at end of file."""
        if self.eof:
            return False
        if self.pos > self.chunk:  # drop what was consumed, keeping line numbers right
            self.line_base = self.line_at(self.pos)
            self.text = self.text[self.pos:]
            self.pos = 0
            self._counted = (0, self.line_base)
        raw = self.fh.read(max(self.chunk, at_least))
        try:
            if self.first:
                self.first = False
                if raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
            piece = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            line = self.line_at(len(self.text)) + raw[: exc.start].count(b"\n")
            raise InputError(f"not valid UTF-8 (byte {exc.start} of a read block)", self.path, line) from None
        if not raw:
            self.eof = True
        self.text += piece
        return bool(raw)

    def skip_ws(self) -> str:
        """The next non-blank character ('' at end of file), leaving ``pos`` on it."""
        while True:
            n = len(self.text)
            while self.pos < n and self.text[self.pos] in _WS:
                self.pos += 1
            if self.pos < n:
                return self.text[self.pos]
            if not self.more():
                return ""


def iter_json_array(
    fh: IO[bytes], path: str, chunk: int = 1 << 20, max_element_bytes: int = 1 << 30
) -> Iterator[tuple[int, object]]:
    """``(line number, element)`` for each element of the JSON array in ``fh``. Malformed JSON, and anything but
    blanks after the closing ``]``, raises :class:`InputError` naming the line."""
    buf = _Buffer(fh, path, chunk)
    decoder = json.JSONDecoder()
    c = buf.skip_ws()
    if c != "[":
        raise InputError("expected a JSON array ('[')" + (f", found {c!r}" if c else ", found an empty file"),
                         path, buf.line_at(buf.pos))
    buf.pos += 1
    expect_value = True
    first = True
    while True:
        c = buf.skip_ws()
        if c == "":
            raise InputError("the JSON array is not closed (file truncated?)", path, buf.line_at(buf.pos))
        if c == "]" and (first or not expect_value):
            buf.pos += 1
            # only blanks may follow the array: anything else is a damaged file or two files run together
            c = buf.skip_ws()
            if c:
                raise InputError(f"unexpected {c!r} after the end of the JSON array (trailing data)", path,
                                 buf.line_at(buf.pos))
            return
        if not expect_value:
            if c != ",":
                raise InputError(f"expected ',' or ']' between array elements, found {c!r}", path,
                                 buf.line_at(buf.pos))
            buf.pos += 1
            expect_value = True
            continue
        while True:
            try:
                value, end = decoder.raw_decode(buf.text, buf.pos)
                # a number cut at the buffer's end decodes "successfully" to a prefix; make sure it is complete
                if end == len(buf.text) and not buf.eof:
                    raise json.JSONDecodeError("cut", buf.text, end)
                break
            except json.JSONDecodeError as exc:
                if buf.eof:
                    if exc.pos >= len(buf.text.rstrip()):  # ran out of text: name where the element began
                        raise InputError("the JSON element starting here is cut off (file truncated?)", path,
                                         buf.line_at(buf.pos)) from None
                    raise InputError(f"malformed JSON: {exc.msg}", path, buf.line_at(exc.pos)) from None
                if len(buf.text) - buf.pos > max_element_bytes:
                    raise InputError(f"one JSON element is larger than {max_element_bytes} bytes", path,
                                     buf.line_at(buf.pos)) from None
                # grow geometrically so a huge element costs O(size) parses in total, not O(size^2 / chunk)
                buf.more(at_least=len(buf.text) - buf.pos)
        yield buf.line_at(buf.pos), value
        buf.pos = end
        first = False
        expect_value = False


def parse_json_object(line: str) -> dict:
    """The JSON object on one line of a JSON-lines file; ``ValueError`` saying what is wrong otherwise (the
    caller's bad-row policy adds the file and line)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        # some of json's messages end in "at" ("Unterminated string starting at"): one "at" is enough
        msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
        raise ValueError(f"not valid JSON ({msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj
