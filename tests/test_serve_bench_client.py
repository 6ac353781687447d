"""benchmarks/serve_bench.py's load generator: stale keep-alive connections are neither reused nor counted as
the server's failures, and every retry is counted.

The server here is a few lines of asyncio that answer a fixed body, so that the client's handling of a closed
connection is tested without timing luck: it answers the first request of each connection and closes the
connection when a second one arrives, without a byte of answer, as a server whose keep-alive timeout fires just
as the request is sent does."""
import asyncio
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
serve_bench = pytest.importorskip("serve_bench")

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _server(answers_per_connection: int, sink: dict):
    """A server that answers ``answers_per_connection`` requests on a connection, then closes it on the next one
    unanswered; ``sink`` counts connections and answers."""

    async def handle(reader, writer):
        sink["connections"] += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if answered == answers_per_connection:
                    break  # closed with the request unanswered
                writer.write(ANSWER)
                await writer.drain()
                answered += 1
                sink["answers"] += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _run(answers_per_connection: int, requests: int, pause_s: float = 0.0, **load_kwargs):
    sink = {"connections": 0, "answers": 0}

    async def go():
        server, port = await _server(answers_per_connection, sink)
        async with server:
            load = serve_bench._Load(f"http://127.0.0.1:{port}", "dense", ["q one", "q two"], connections=1,
                                     timeout=10.0, **load_kwargs)
            for i in range(requests):
                await load.one(i)
                await asyncio.sleep(pause_s)
            load.close()
            return load

    return asyncio.run(go()), sink


def test_a_reused_connection_closed_before_any_answer_is_retried_once_and_counted():
    load, sink = _run(answers_per_connection=1, requests=5)
    assert load.statuses == {200: 5}
    assert len(load.latencies) == 5
    # the first request opens a connection; each later one finds it closed, retries on a new one
    assert load.retried == 4
    assert sink["connections"] == 5 and sink["answers"] == 5


def test_a_new_connection_that_fails_is_a_failure_not_a_retry():
    """Only a connection that answered before is presumed stale: a fresh one closed without an answer is the
    server's failure and must show in the statuses."""
    load, sink = _run(answers_per_connection=0, requests=3)
    assert load.retried == 0
    assert load.statuses == {"IncompleteReadError": 3}
    assert load.latencies == []


def test_a_connection_idle_past_the_limit_is_not_reused():
    """A pooled connection idle for max_idle_s is closed and a new one opened, so no request goes out on a
    connection the server may be closing."""
    load, sink = _run(answers_per_connection=10, requests=3, pause_s=0.05, max_idle_s=0.01)
    assert load.statuses == {200: 3} and load.retried == 0
    assert sink["connections"] == 3

    load, sink = _run(answers_per_connection=10, requests=3, pause_s=0.0, max_idle_s=60.0)
    assert load.statuses == {200: 3} and load.retried == 0
    assert sink["connections"] == 1


def test_the_idle_limit_stays_below_the_servers_keep_alive():
    from fastdpr.serve.protocol import ConnectionLimits

    assert serve_bench.SERVER_KEEP_ALIVE_S == ConnectionLimits().keep_alive_s
    assert 0 < serve_bench.SERVER_KEEP_ALIVE_S - serve_bench.IDLE_MARGIN_S < serve_bench.SERVER_KEEP_ALIVE_S


def test_the_soak_rate_steps_down_until_an_open_loop_probe_holds(monkeypatch):
    """A server that sheds its first requests (503) makes the first probe fail: the soak runs one step lower,
    where the probe gets every request answered 200."""
    import threading

    monkeypatch.setattr(serve_bench, "PROBE_PAUSE_S", 0.0)
    shed = {"left": 10}
    ready, stop = threading.Event(), threading.Event()
    where = {}

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if shed["left"] > 0:
                    shed["left"] -= 1
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}")
                else:
                    writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def serve():  # its own thread and loop: soak_rate runs its probes with asyncio.run
        async def main():
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            where["port"] = server.sockets[0].getsockname()[1]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            server.close()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        rate, probes = serve_bench.soak_rate(f"http://127.0.0.1:{where['port']}", saturation=200.0,
                                             questions=["q"], timeout=10.0, connections=64, seconds=0.2)
    finally:
        stop.set()
        thread.join(10)
    assert len(probes) == 2
    assert probes[0]["statuses"].get("503") == 10
    assert probes[1]["ok"] == probes[1]["requests"] > 0
    assert rate == pytest.approx(200.0 * serve_bench.SOAK_SHARE * serve_bench.PROBE_STEP)
