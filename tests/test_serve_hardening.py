"""No request, connection or file change takes ``fastdpr serve`` down or makes it lie: deep nesting and bad text
are a 400 for that request alone; idle, slow and oversized requests and headers are cut off by the documented
limits; an answer a client does not read is bounded and then dropped; no redirect names the Host header; a file
changed under the server makes its mode answer 503. Every case through a real server on 127.0.0.1."""
import concurrent.futures as cf
import json
import logging
import select
import socket
import time

import pytest
from test_serve import Slow, _get, _request, world  # noqa: F401  (world: the module's fixture)

from fastdpr.serve import Backend, Client, Limits, ServerError, create_app, serving
from fastdpr.serve.protocol import ConnectionLimits


def _app(world, **kwargs):
    return create_app(Backend(hybrid=world["hybrid"]), **kwargs)


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float = 10.0) -> bytes:
    """All the server sends until it closes the connection (bounded by ``limit_s``)."""
    chunks, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_deep_nesting_is_a_400_before_parsing_and_logs_nothing(world, caplog):
    with caplog.at_level(logging.WARNING), serving(_app(world)) as server:
        deep = _request(server.url, "POST", "/search", b"[" * 2000 + b"]" * 2000)
        deep_in_field = _request(server.url, "POST", "/search",
                                 b'{"question": "q", "k": ' + b"[" * 100 + b"]" * 100 + b"}")
        brackets_in_text = _request(server.url, "POST", "/search",
                                    json.dumps({"question": "[" * 200 + ' \\" {' * 50, "k": 2}).encode())
    assert deep[0] == 400 and "nests arrays and objects 2000 deep; at most 32" in json.loads(deep[2])["error"]
    assert deep_in_field[0] == 400
    assert brackets_in_text[0] == 200 and len(json.loads(brackets_in_text[2])["results"][0]) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("path, mode", [("/search", "dense"), ("/search", "hybrid"), ("/encode", None)])
def test_a_lone_surrogate_is_a_400_for_that_request_alone(world, path, mode):
    """Sent together with eight good requests, so that they share its batch."""
    bad = b'{"question": "who \\ud800"' + (f', "mode": "{mode}"'.encode() if mode else b"") + b"}"
    good = [json.dumps({"question": q, **({"mode": mode} if mode else {})}).encode()
            for q in world["questions"][:8]]
    with serving(_app(world, max_wait_ms=300)) as server:
        with cf.ThreadPoolExecutor(9) as pool:
            answers = list(pool.map(lambda body: _request(server.url, "POST", path, body), [bad, *good]))
    (status, _, text), rest = answers[0], answers[1:]
    assert status == 400 and "questions" not in text and "question is not valid text" in json.loads(text)["error"]
    assert [a[0] for a in rest] == [200] * 8


def test_a_batch_that_fails_fails_only_the_request_that_broke_it(world):
    """Beyond what the request checks catch: a retriever that cannot answer one question."""

    class Picky(Slow):
        def retrieve(self, questions, k):
            if "poison" in questions:
                raise ValueError("cannot answer poison")
            return super().retrieve(questions, k)

    app = create_app(Backend(sparse=Picky(0.0)), max_wait_ms=300)
    bodies = [json.dumps({"question": q, "mode": "sparse"}).encode() for q in ["poison", *"abcdefg"]]
    with serving(app) as server:
        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda body: _request(server.url, "POST", "/search", body), bodies))
    assert answers[0][0] == 500 and [a[0] for a in answers[1:]] == [200] * 7


class CostsByK(Slow):
    """k=1 takes 5 ms a call, any larger k 300 ms: the queue's estimate, learnt on the cheap ones, is wrong."""

    def retrieve(self, questions, k):
        self.delay = 0.005 if k == 1 else 0.3
        return super().retrieve(questions, k)


def test_no_request_waits_past_the_queue_bound_when_the_estimate_is_wrong():
    app = create_app(Backend(sparse=CostsByK(0.0)), limits=Limits(max_questions=1), max_batch=1, max_wait_ms=0,
                     max_queue=64, max_queue_ms=400)
    cheap = json.dumps({"question": "q", "k": 1, "mode": "sparse"}).encode()
    costly = json.dumps({"question": "q", "k": 2, "mode": "sparse"}).encode()

    def timed(body):
        start = time.monotonic()
        status = _request(server.url, "POST", "/search", body)[0]
        return status, time.monotonic() - start

    with serving(app) as server:
        for _ in range(5):  # the estimate learns 5 ms a question
            _request(server.url, "POST", "/search", cheap)
        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(timed, [costly] * 8))  # 2.4 s of work, admitted by the estimate
    served = [seconds for status, seconds in answers if status == 200]
    assert {status for status, _ in answers} == {200, 503}
    # the queue bound (0.4 s) and the batch ahead plus its own (0.6 s), with room for a slow machine
    assert max(served) < 1.6, sorted(seconds for _, seconds in answers)


QUICK = ConnectionLimits(request_timeout_s=0.5, keep_alive_s=0.5, max_header_bytes=4096, max_headers=20,
                         write_timeout_s=0.5, max_connections=16)


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: a\r\n",
                                  b"POST /search HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n{\"qu"],
                         ids=["idle", "partial-headers", "partial-body"])
def test_an_incomplete_request_is_cut_off_at_the_request_timeout(sent):
    with serving(create_app(Backend(sparse=Slow(0.0))), connections=QUICK) as server:
        sock = _connect(server.url)
        start = time.monotonic()
        sock.sendall(sent)
        answer = _read_until_closed(sock)
        took = time.monotonic() - start
        sock.close()
    assert 0.4 < took < 5, took
    if sent.startswith(b"GET"):
        assert answer.startswith(b"HTTP/1.1 408") and b"not complete within 0.5 s" in answer


def test_a_slow_client_cannot_stretch_the_timeout_a_byte_at_a_time():
    request = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"x" * 40
    with serving(create_app(Backend(sparse=Slow(0.0))), connections=QUICK) as server:
        sock = _connect(server.url)
        start, sent = time.monotonic(), 0
        try:
            for byte in request:  # one byte every 50 ms: 3 s in all, six times the timeout
                sock.send(bytes([byte]))
                sent += 1
                time.sleep(0.05)
        except OSError:  # the server closed the connection
            pass
        took = time.monotonic() - start
        sock.close()
    assert sent < len(request) and took < 2.5, (sent, took)


def test_an_idle_keep_alive_connection_is_closed():
    with serving(create_app(Backend(sparse=Slow(0.0))), connections=QUICK) as server:
        sock = _connect(server.url)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        start = time.monotonic()
        answer = _read_until_closed(sock)
        took = time.monotonic() - start
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200") and 0.3 < took < 5


@pytest.mark.parametrize("head", [
    b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 10_000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(50)) + b"\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Unfinished: " + b"x" * (1 << 20),
], ids=["one-large-header", "many-headers", "unfinished-1MB-header"])
def test_oversized_headers_get_431_before_the_rest_is_read(head):
    with serving(create_app(Backend(sparse=Slow(0.0))), connections=QUICK) as server:
        sock = _connect(server.url)
        try:
            sock.sendall(head)
        except OSError:  # closed by the server before all of it was sent
            pass
        answer = _read_until_closed(sock)
        sock.close()
        still = _get(server.url, "/healthz")[0]
    assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
    assert still == 200


def test_a_flood_of_idle_connections_is_capped_and_never_keeps_healthz_out():
    """48 connections that send nothing (or half their headers) against a cap of 16, with a timeout too long to
    help: each one over the cap closes a waiting one (the oldest the server accepted), and /healthz still
    answers."""
    limits = ConnectionLimits(max_connections=16)
    with serving(create_app(Backend(sparse=Slow(0.0))), connections=limits) as server:
        flood = [_connect(server.url) for _ in range(3 * limits.max_connections)]
        for sock in flood[-5:]:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # some half-way through their headers
        statuses = [_get(server.url, "/healthz")[0] for _ in range(5)]
        over = len(flood) - limits.max_connections  # the connections the cap must have closed
        closed, deadline = set(), time.monotonic() + 10
        while len(closed) < over and time.monotonic() < deadline:
            readable, _, _ = select.select([s for s in flood if s not in closed], [], [], 0.2)
            for sock in readable:
                try:
                    data = sock.recv(1024)
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed.add(sock)
        for sock in flood:
            sock.close()
    assert statuses == [200] * 5
    assert len(closed) >= over


def test_questions_times_k_and_answer_bytes_are_bounded(world):
    with serving(_app(world, limits=Limits(max_answer_bytes=3000))) as server:
        many = _request(server.url, "POST", "/search", json.dumps({"questions": ["q"] * 256, "k": 1000}).encode())
        long = _request(server.url, "POST", "/search", json.dumps({"question": "who", "k": 30}).encode())
        fine = _request(server.url, "POST", "/search", json.dumps({"question": "who", "k": 2}).encode())
    assert many[0] == 413 and "asks for 256000 passages; at most 10000" in json.loads(many[2])["error"]
    assert long[0] == 413 and "at most 3000" in json.loads(long[2])["error"]
    assert fine[0] == 200


class Wordy(Slow):
    """Long passages: one answer of megabytes, larger than the sockets' buffers."""

    def retrieve(self, questions, k):
        return [[{"id": str(i), "title": "", "text": "x" * 100_000, "score": 1.0} for i in range(k)]
                for _ in questions]


def test_an_answer_the_client_does_not_read_is_dropped_after_the_write_timeout():
    app = create_app(Backend(sparse=Wordy(0.0)), limits=Limits(max_answer_bytes=64 << 20))
    body = json.dumps({"question": "q", "k": 100, "mode": "sparse"}).encode()  # a 10 MB answer
    with serving(app, connections=QUICK) as server:
        sock = _connect(server.url, rcvbuf=4096)
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(3)  # reads nothing for six times the write timeout
        got = _read_until_closed(sock)
        sock.close()
        after = Client(server.url).search(["c"], k=1, mode="sparse")
    head, _, answer = got.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 200") and length > 10_000_000
    assert len(answer) < length  # cut off: the rest was dropped, not kept for the client
    assert after[0][0]["id"] == "0"


def test_a_client_that_reads_slowly_gets_its_whole_answer_however_long_it_takes():
    app = create_app(Backend(sparse=Wordy(0.0)), limits=Limits(max_answer_bytes=64 << 20))
    body = json.dumps({"question": "q", "k": 100, "mode": "sparse"}).encode()  # a 10 MB answer
    with serving(app, connections=QUICK) as server:
        sock = _connect(server.url, rcvbuf=64 * 1024)
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        start, chunks, size, length = time.monotonic(), [], 0, None
        while time.monotonic() - start < 30 and (length is None or size < length):
            chunk = sock.recv(64 * 1024)  # 64 KB at most every 20 ms: seconds in all, the write timeout many times
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if length is None and b"\r\n\r\n" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                length, size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]), len(rest)
            time.sleep(0.02)
        took = time.monotonic() - start
        sock.close()
    assert length is not None and size == length and took > QUICK.write_timeout_s, (size, length, took)


def test_no_redirect_names_the_host_header(world):
    with serving(_app(world)) as server:
        status, headers, _ = _get(server.url, "/metrics/", {"Host": "evil.example"})
    assert status == 404 and "location" not in {k.lower() for k in headers}


def test_a_corpus_side_file_truncated_under_the_server_is_a_503_not_a_crash(world, tmp_path):
    from fastdpr.data import Corpus
    from fastdpr.index import build_index
    from fastdpr.retrieve import DenseRetriever

    (tmp_path / "passages.jsonl").write_bytes((world["tmp"] / "passages.jsonl").read_bytes())
    corpus = Corpus.open(tmp_path / "passages.jsonl")
    assert corpus.index_path is not None and corpus.index_path.exists()
    model = world["model"]
    dense = DenseRetriever(model, build_index(model.encode_passages([corpus[i] for i in range(len(corpus))],
                                                                    batch_size=16), "flat"), corpus)
    with serving(create_app(Backend(dense=dense))) as server:
        client = Client(server.url)
        before = client.search(["who"], k=2)
        with open(corpus.index_path, "r+b") as fh:
            fh.truncate(16)
        with pytest.raises(ServerError) as refused:
            client.search(["who"], k=2)
        ready = _get(server.url, "/readyz")
        alive = _get(server.url, "/healthz")[0]
    assert len(before[0]) == 2
    assert refused.value.status == 503 and "shrank since the server loaded it" in str(refused.value)
    assert ready[0] == 503 and json.loads(ready[2])["status"] == "files changed" and alive == 200


def test_an_index_rewritten_in_place_under_the_server_is_a_503_not_garbage(world, tmp_path):
    from fastdpr.index import load_index
    from fastdpr.retrieve import DenseRetriever

    path = world["index"].save(tmp_path / "index.fdpr")
    dense = DenseRetriever(world["model"], load_index(path, mmap=True), world["corpus"])
    with serving(create_app(Backend(dense=dense, files={"dense": [path]}))) as server:
        client = Client(server.url)
        client.search(["who"], k=2)
        data = bytearray(path.read_bytes())
        data[-4096:] = b"\x7f" * 4096  # the same size: only the contents change
        time.sleep(0.01)  # a later modification time, whatever the file system's resolution
        with open(path, "r+b") as fh:
            fh.write(bytes(data))
        with pytest.raises(ServerError) as refused:
            client.search(["who"], k=2, mode="dense")
    assert refused.value.status == 503 and "was replaced or rewritten" in str(refused.value)


def test_api_keys_any_text_and_a_wrong_one_is_told_so(world):
    key = "clé-東京"
    with serving(_app(world, api_key=key)) as server:
        hits = Client(server.url, api_key=key).search(["who"], k=1)
        missing = _request(server.url, "POST", "/search", b'{"question": "who"}')
        with pytest.raises(ServerError) as wrong:
            Client(server.url, api_key="clé-tokyo").search(["who"], k=1)
    assert len(hits[0]) == 1
    assert missing[0] == 401 and "a bearer token is required" in json.loads(missing[2])["error"]
    assert wrong.value.status == 401 and "not this server's key" in str(wrong.value)
    with pytest.raises(ValueError, match="empty"):
        _app(world, api_key="")
