"""What one connection may cost the server, enforced under uvicorn's httptools protocol (the parser in use).

uvicorn closes a connection idle between requests (``timeout_keep_alive``), but nothing else: a connection that
never sends, or sends its request line, headers or body a byte at a time, stays open; headers have no size
bound; and an answer the client never reads stays in the send buffer. :class:`ConnectionLimits` bounds each:

- ``request_timeout_s``: from a connection's first byte wanted (or a request's first byte) to the request's last
  one, headers and body together; past it the connection gets 408 and is closed;
- ``max_header_bytes`` and ``max_headers``: the request line and headers together, and the number of header
  lines; past either the request gets 431 and the connection is closed, before the rest is read;
- ``write_timeout_s``: how long an answer may sit in a full send buffer without a byte of it being taken by the
  client; then the connection is dropped and the answer freed (a client that reads, however slowly, is not cut
  off; one that reads nothing holds its answer this long at most);
- ``max_connections``: open connections at most. One more evicts the oldest connection that has no request in
  progress (idle, or still sending its request), so that a flood of idle or slow connections can never keep
  ``/healthz`` out; when every connection has a request in progress, the new one gets 503 and is closed."""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ConnectionLimits:
    request_timeout_s: float = 30.0
    keep_alive_s: float = 5.0  # uvicorn's timeout_keep_alive: idle between two requests of one connection
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    write_timeout_s: float = 30.0
    max_connections: int = 1000

    def __post_init__(self):
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
            if name.startswith("max_") and not isinstance(value, int):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def protocol_class(limits: ConnectionLimits):
    """uvicorn's httptools protocol with ``limits`` enforced (pass as ``uvicorn.Config(http=...)``)."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            self._in_head = True  # between a request's first byte wanted and its last header
            self._in_request = True  # until the request's last byte (headers and body)
            self._head_bytes = 0
            self._header_count = 0
            self._request_timer = None
            self._write_timer = None
            self.opened = None
            if len(self.connections) >= limits.max_connections and not _evict_one(self.connections):
                transport.write(_refusal(STATUS_LINE[503], "too many connections: retry later"))
                transport.close()
                return
            super().connection_made(transport)
            self.opened = self.loop.time()
            self._arm_request_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_timers()
            if self.opened is not None:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.opened is None:  # refused in connection_made
                return
            super().data_received(data)
            if self._in_head and self.parser is not None and not self.transport.is_closing():
                self._head_bytes += len(data)  # a head that is still incomplete after this read
                if self._head_bytes > limits.max_header_bytes:
                    self._refuse(431, f"the request line and headers are over {limits.max_header_bytes} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = self._in_request = True
            self._head_bytes = self._header_count = 0
            if self._request_timer is None:
                self._arm_request_timer()

        def on_url(self, url: bytes) -> None:
            self._head_bytes += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_bytes += len(name) + len(value)
            self._header_count += 1
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._header_count > limits.max_headers:
                return self._refuse(431, f"the request has {self._header_count} headers; at most "
                                         f"{limits.max_headers}")
            if self._head_bytes > limits.max_header_bytes:
                return self._refuse(431, f"the request line and headers are over {limits.max_header_bytes} bytes")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_request = False
            self._cancel(self._request_timer)
            self._request_timer = None
            if self.cycle is not None:
                super().on_message_complete()

        def on_body(self, body: bytes) -> None:
            if self.cycle is not None:
                super().on_body(body)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._arm_write_timer()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel(self._write_timer)
            self._write_timer = None

        def _arm_request_timer(self) -> None:
            self._request_timer = self.loop.call_later(limits.request_timeout_s, self._request_timed_out)

        def _request_timed_out(self) -> None:
            self._request_timer = None
            if self._in_request and not self.transport.is_closing():
                self._refuse(408, f"the request was not complete within {limits.request_timeout_s:g} s")

        def _arm_write_timer(self) -> None:
            self._unsent = _unsent_bytes(self.transport)
            self._write_timer = self.loop.call_later(limits.write_timeout_s, self._check_progress)

        def _check_progress(self) -> None:
            if _unsent_bytes(self.transport) < self._unsent:  # the client took some: wait on
                self._arm_write_timer()
                return
            self._write_timer = None
            self.transport.abort()  # frees the unsent answer; the request's task sees a disconnect

        def _refuse(self, status: int, message: str) -> None:
            """Answer ``status`` and close, unless an answer of this request has begun (then only close)."""
            self._cancel_timers()
            answering = not self._in_head and self.cycle is not None and self.cycle.response_started
            if not answering:
                self.transport.write(_refusal(STATUS_LINE[status], message))
            self.transport.close()

        def _cancel_timers(self) -> None:
            self._cancel(self._request_timer)
            self._cancel(self._write_timer)
            self._request_timer = self._write_timer = None

        @staticmethod
        def _cancel(timer) -> None:
            if timer is not None:
                timer.cancel()

        def waiting_for_request(self) -> bool:
            """No request in progress: idle, or still receiving one (nothing of it computed or answered yet)."""
            return self.cycle is None or self.cycle.response_complete or self._in_head

    return LimitedHttpToolsProtocol


def _unsent_bytes(transport) -> int:
    """The answer bytes not yet taken by the client: the transport's buffer, and the kernel's send queue where the
    system tells it (Linux; megabytes that a reading client drains before the transport's buffer moves)."""
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    try:
        import fcntl
        import termios

        queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (ImportError, AttributeError, OSError):  # not on this system, or the socket is gone
        pass
    return queued


def _evict_one(connections) -> bool:
    """Close the oldest connection that is waiting for a request; False when every one has a request in
    progress."""
    waiting = [c for c in connections if getattr(c, "opened", None) is not None and c.waiting_for_request()
               and not c.transport.is_closing()]
    if not waiting:
        return False
    oldest = min(waiting, key=lambda c: c.opened)
    oldest._cancel_timers()
    oldest.transport.close()
    connections.discard(oldest)  # its slot is free now; connection_lost follows
    return True


def _refusal(status_line: bytes, message: str) -> bytes:
    body = f'{{"error": "{message}"}}'.encode()
    return b"".join([status_line, b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                     b"\r\nconnection: close\r\n\r\n", body])
