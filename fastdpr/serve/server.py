"""Running the application under uvicorn: in the foreground (``fastdpr serve``) or on a thread (tests, the
benchmark)."""
from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Iterator

from fastdpr.serve.protocol import ConnectionLimits, protocol_class


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a SIGTERM or SIGINT (Ctrl-C), once drained, ends the process with status
        0 (uvicorn raises the signal again after its own shutdown, which kills the process with it, or raises
        KeyboardInterrupt)."""

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if sig in (signal.SIGTERM, signal.SIGINT) and captured and captured[-1] == sig:
                captured.pop()

    return Server


def make_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                drain_timeout_s: float | None = 30.0, connections: ConnectionLimits | None = None):
    """uvicorn's server for ``app``, with the httptools parser and ``connections``' limits (defaults:
    :class:`ConnectionLimits`)."""
    import uvicorn

    connections = connections or ConnectionLimits()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=drain_timeout_s, http=protocol_class(connections),
                            timeout_keep_alive=connections.keep_alive_s)
    return _server_class()(config)


def run(app, sock: socket.socket, log_level: str = "warning", drain_timeout_s: float | None = 30.0,
        connections: ConnectionLimits | None = None) -> None:
    """Serve on ``sock`` (from :func:`bind`) until SIGTERM or SIGINT: then stop accepting, answer what is in
    flight and queued, return."""
    host, port = sock.getsockname()[:2]
    make_server(app, host, port, log_level, drain_timeout_s, connections).run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, so that a taken port or an unknown address is an error before the
    server starts (``OSError``, from the system)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse a port in TIME_WAIT
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def loopback_socket(port: int = 0) -> socket.socket:
    """A listening-ready socket on 127.0.0.1 (``port`` 0: a free one, with no window for another process to take
    it between choosing and binding)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


@contextlib.contextmanager
def serving(app, *, ready_timeout_s: float = 300.0, wait_ready: bool = True, log_level: str = "warning",
            connections: ConnectionLimits | None = None) -> Iterator["Running"]:
    """Run ``app`` on a free loopback port on a background thread; yields a :class:`Running` with its ``url``.
    Leaving the block shuts the server down gracefully (queued work is answered first)."""
    sock = loopback_socket()
    server = make_server(app, "127.0.0.1", sock.getsockname()[1], log_level, connections=connections)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fastdpr-serve", daemon=True)
    thread.start()
    running = Running(server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}")
    try:
        running.wait_started(ready_timeout_s)
        if wait_ready:
            running.wait_ready(ready_timeout_s)
        yield running
    finally:
        running.stop()
        sock.close()


class Running:
    def __init__(self, server, thread: threading.Thread, url: str):
        self.server = server
        self.thread = thread
        self.url = url

    def wait_started(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server stopped while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout_s}s")
            time.sleep(0.01)

    def wait_ready(self, timeout_s: float) -> None:
        from fastdpr.serve.client import Client

        Client(self.url).wait_ready(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"the server did not stop within {timeout_s}s")
