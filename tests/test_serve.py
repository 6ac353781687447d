"""``fastdpr serve`` over real HTTP on a free loopback port, in-process: answers equal the retrievers', with
batching on and off; malformed requests get a one-line 4xx; a full queue gets 503; shutdown drains; /metrics is
Prometheus text; the README's curl example runs."""
import concurrent.futures as cf
import http.client
import json
import shlex
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastdpr.serve import Backend, Client, Limits, ServerError, create_app, serving

DATA = Path(__file__).parent / "data"
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tiny_models import tiny_biencoder

    from fastdpr.data import Corpus
    from fastdpr.index import build_index
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    tmp = tmp_path_factory.mktemp("serve")
    passages = [json.loads(line) for line in open(DATA / "sparse_squad_passages.jsonl", encoding="utf-8")][:40]
    with open(tmp / "passages.jsonl", "w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps(p) + "\n")
    questions = [json.loads(line)["question"]
                 for line in open(DATA / "sparse_squad_questions.jsonl", encoding="utf-8")][:24]
    model = tiny_biencoder(tmp / "towers")
    model.eval()
    corpus = Corpus.open(tmp / "passages.jsonl")
    index = build_index(model.encode_passages([corpus[i] for i in range(len(corpus))], batch_size=16), "flat")
    dense = DenseRetriever(model, index, corpus, batch_size=64)
    sparse = SparseRetriever(BM25.from_corpus(corpus, show_progress=False), corpus, threads=1)
    hybrid = HybridRetriever(dense, sparse, k_union=20)
    # the first BM25 search compiles (numba): paid here once, so that each server's own warm-up is short
    Backend(hybrid=hybrid).warm_up()
    return {"tmp": tmp, "questions": questions, "dense": dense, "sparse": sparse, "hybrid": hybrid,
            "model": model, "index": index, "corpus": corpus}


def _app(world, **kwargs):
    return create_app(Backend(hybrid=world["hybrid"]), **kwargs)


def assert_same_passages(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [p["id"] for p in g] == [p["id"] for p in w]
        assert [(p["title"], p["text"]) for p in g] == [(p["title"], p["text"]) for p in w]
        np.testing.assert_allclose([p["score"] for p in g], [p["score"] for p in w], rtol=1e-5, atol=1e-6)


def metric(text: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + sample.value
    assert total is not None, f"no sample {name} {labels}"
    return total


@pytest.mark.parametrize("max_batch", [64, 1], ids=["batched", "one-at-a-time"])
def test_search_equals_the_retrievers(world, max_batch):
    qs = world["questions"]
    requests = [(mode, qs[i:i + 3], k) for i, (mode, k) in
                enumerate([("dense", 5), ("sparse", 7), ("hybrid", 4), ("dense", 5), ("hybrid", 4), ("sparse", 3),
                           ("dense", 2), ("hybrid", 9)])]
    with serving(_app(world, max_batch=max_batch, max_wait_ms=30)) as server:
        client = Client(server.url)
        with cf.ThreadPoolExecutor(len(requests)) as pool:  # concurrent, so that a batch can form
            got = list(pool.map(lambda r: client.search(r[1], k=r[2], mode=r[0]), requests))
        text = _get(server.url, "/metrics")[2]
        single = client.search([qs[0]], k=5)  # the server's default mode: hybrid
    for (mode, questions, k), answer in zip(requests, got):
        assert_same_passages(answer, world[mode].retrieve(questions, k))
    assert_same_passages(single, world["hybrid"].retrieve([qs[0]], 5))
    calls = metric(text, "fastdpr_batch_questions_count")
    questions = metric(text, "fastdpr_batch_questions_sum")
    assert questions == sum(len(q) for _, q, _ in requests)  # the warm-up is not counted
    if max_batch == 1:
        assert calls == len(requests)  # a request is never split, and never joined by another
    else:
        assert calls < questions  # some requests shared an encoder and index call


def _get(url: str, path: str, headers: dict | None = None):
    return _request(url, "GET", path, None, headers)


def _request(url: str, method: str, path: str, body: bytes | None, headers: dict | None = None):
    host, port = url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {},
                     encode_chunked=(headers or {}).get("Transfer-Encoding") == "chunked")
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode("utf-8")
    finally:
        conn.close()


def test_cached_passage_texts_give_exactly_what_retrieve_gives(world, tmp_path):
    """The backend answers from cached JSON texts by row: quotes, backslashes, non-ASCII and control characters
    round-trip, scores are the same floats, rows asked again come from the cache, and a small cache evicts."""
    from fastdpr.data import Corpus
    from fastdpr.index import build_index
    from fastdpr.retrieve import DenseRetriever

    odd = ['He said "no" \\ then left', "Café – naïve 東京 😀", "tab\there\nnewline \u2028 \x01"]
    passages = [{"id": f"p\"{i}", "title": odd[i % 3], "text": odd[(i + 1) % 3] + f" {i}"} for i in range(30)]
    with open(tmp_path / "odd.jsonl", "w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps(p) + "\n")
    corpus = Corpus.open(tmp_path / "odd.jsonl")
    model = world["model"]
    dense = DenseRetriever(model, build_index(model.encode_passages(passages, batch_size=16), "flat"), corpus)
    backend = Backend(dense=dense, cached_passages=7)
    qs = world["questions"][:4]
    for _ in range(2):  # the second round is served from the cache where it holds the row
        got = [json.loads(text) for text in backend.run(("search", "dense", 12), qs)]
        assert got == dense.retrieve(qs, 12)  # scores equal as floats, not merely close
    assert backend._texts[id(corpus)].cache_info().currsize == 7

def test_encode_equals_the_model(world):
    qs = world["questions"][:5]
    with serving(_app(world)) as server:
        got = Client(server.url).encode(qs)
        status, _, body = _request(server.url, "POST", "/encode", json.dumps({"question": qs[0]}).encode())
    np.testing.assert_allclose(got, world["model"].encode_questions(qs), rtol=1e-5, atol=1e-6)
    assert status == 200 and json.loads(body)["dim"] == got.shape[1]


def test_encode_answers_the_vectors_dense_search_uses(world):
    """/encode is the dense retriever's ``encode``: its precision and batch size, exactly the vectors searched."""
    from fastdpr.retrieve import DenseRetriever

    dense = DenseRetriever(world["model"], world["index"], world["corpus"], batch_size=3, precision="bf16")
    backend = Backend(dense=dense)
    qs = world["questions"][:5]
    got = np.array(backend.run(("encode",), qs), dtype=np.float32)
    np.testing.assert_array_equal(got, dense.encode(qs))
    assert [json.loads(t) for t in backend.run(("search", "dense", 4), qs)] == dense.retrieve(got, 4)


MALFORMED = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2]", 422, "JSON object"),
    (b'{"questions": "who"}', 422, '"questions" must be an array'),
    (b'{"questions": [1]}', 422, "questions[0] must be a string"),
    (b'{"question": null}', 422, '"question" must be a string'),
    (b'{"questions": []}', 422, "empty"),
    (b'{"question": ""}', 422, "question is empty"),
    (b'{"questions": ["ok", "   "]}', 422, "questions[1] is empty"),
    (b'{"question": "a", "questions": ["b"]}', 422, "either"),
    (b'{}', 422, "either"),
    (b'{"question": "q", "k": 0}', 422, '"k" must be between 1 and 50'),
    (b'{"question": "q", "k": -3}', 422, '"k" must be between'),
    (b'{"question": "q", "k": 1000000000000}', 422, '"k" must be between'),
    (b'{"question": "q", "k": "5"}', 422, '"k" must be an integer'),
    (b'{"question": "q", "k": 2.5}', 422, '"k" must be an integer'),
    (b'{"question": "q", "k": true}', 422, '"k" must be an integer'),
    (b'{"question": "q", "mode": "fuzzy"}', 422, '"mode" must be one of'),
    (b'{"question": "q", "top_k": 3}', 422, "unknown field 'top_k'"),
    (json.dumps({"questions": ["q"] * 9}).encode(), 422, "at most 8"),
    (json.dumps({"question": "x" * 201}).encode(), 422, "at most 200"),
]


def test_malformed_requests_get_a_one_line_4xx(world):
    limits = Limits(max_k=50, max_questions=8, max_question_chars=200, max_body_bytes=64 * 1024)
    with serving(_app(world, limits=limits, max_queue=64)) as server:
        answers = [_request(server.url, "POST", "/search", body, {"Content-Type": "application/json"})
                   for body, _, _ in MALFORMED]
        big = _request(server.url, "POST", "/search", b'{"question": "' + b"x" * (10 << 20) + b'"}',
                       {"Content-Type": "application/json"})
        chunked = _request(server.url, "POST", "/search", iter([b'{"question": "', b"x" * (40 << 10),
                                                                   b"x" * (40 << 10), b'"}']),
                           {"Transfer-Encoding": "chunked"})  # no Content-Length: counted as it arrives
        not_found = _get(server.url, "/nowhere")
        wrong_method = _get(server.url, "/search")
        encode_bad = _request(server.url, "POST", "/encode", b'{"questions": [""]}')
        still_fine = Client(server.url).search(["who"], k=3)
    for (body, status, fragment), (got_status, _, text) in zip(MALFORMED, answers):
        error = json.loads(text)["error"]
        assert (got_status, body) == (status, body)
        assert fragment in error and "\n" not in error and "Traceback" not in error
    assert big[0] == 413 and "at most 65536" in json.loads(big[2])["error"]
    assert chunked[0] == 413 and "over 65536 bytes" in json.loads(chunked[2])["error"]
    assert not_found[0] == 404 and wrong_method[0] == 405 and encode_bad[0] == 422
    assert len(still_fine) == 1 and len(still_fine[0]) == 3


class Slow:
    """A retriever that takes ``delay`` seconds a call and records the sizes of its calls."""

    corpus = None

    def __init__(self, delay: float):
        self.delay = delay
        self.calls: list[int] = []
        self.seen: list[str] = []

    def retrieve(self, questions, k):
        self.calls.append(len(questions))
        self.seen.extend(questions)
        time.sleep(self.delay)
        return [[{"id": q, "title": "", "text": q, "score": 1.0}] for q in questions]


def test_a_full_queue_gets_503_with_retry_after_and_the_server_recovers():
    slow = Slow(0.15)
    app = create_app(Backend(sparse=slow), limits=Limits(max_questions=2), max_batch=2, max_wait_ms=0, max_queue=4)
    with serving(app) as server:
        body = json.dumps({"questions": ["a", "b"], "mode": "sparse"}).encode()
        with cf.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: _request(server.url, "POST", "/search", body), range(10)))
        statuses = sorted(status for status, _, _ in answers)
        refused = [(headers, text) for status, headers, text in answers if status == 503]
        after = Client(server.url).search(["c"], mode="sparse")
        metrics = _get(server.url, "/metrics")[2]
    assert set(statuses) == {200, 503} and statuses.count(200) >= 2, statuses
    for headers, text in refused:
        assert int(headers["retry-after"]) >= 1 and "queue is full" in json.loads(text)["error"]
    assert after == [[{"id": "c", "title": "", "text": "c", "score": 1.0}]]
    assert metric(metrics, "fastdpr_errors_total", endpoint="/search", reason="overloaded") == len(refused)
    assert metric(metrics, "fastdpr_queue_questions") == 0


def test_shutdown_answers_what_is_queued_and_then_refuses_connections():
    slow = Slow(0.1)
    app = create_app(Backend(sparse=slow), max_batch=2, max_wait_ms=0)
    with serving(app) as server:
        client = Client(server.url)
        with cf.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(client.search, [f"q{i}"], 1, "sparse") for i in range(8)]
            deadline = time.monotonic() + 10
            while app.state.batcher.depth < 4 and time.monotonic() < deadline:
                time.sleep(0.005)
            queued = app.state.batcher.depth
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            answers = [f.result(timeout=30) for f in futures]
            stopper.join(30)
        url = server.url
    assert queued >= 4  # work was waiting when shutdown began
    assert answers == [[[{"id": f"q{i}", "title": "", "text": f"q{i}", "score": 1.0}]] for i in range(8)]
    with pytest.raises(ServerError):
        Client(url, timeout=2).search(["late"], mode="sparse")


def test_a_client_that_gives_up_takes_its_question_out_of_the_queue():
    slow = Slow(0.3)
    app = create_app(Backend(sparse=slow), max_batch=1, max_wait_ms=0)
    with serving(app) as server:
        with cf.ThreadPoolExecutor(2) as pool:
            busy = pool.submit(Client(server.url).search, ["busy"], 1, "sparse")
            time.sleep(0.1)
            with pytest.raises(ServerError):  # times out while "busy" still runs
                Client(server.url, timeout=0.1).search(["abandoned"], 1, "sparse")
            busy.result(timeout=30)
        deadline = time.monotonic() + 10
        while app.state.batcher.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        Client(server.url).search(["after"], 1, "sparse")
    assert "busy" in slow.seen and "after" in slow.seen and "abandoned" not in slow.seen


def test_metrics_parse_as_prometheus_text(world):
    from prometheus_client.parser import text_string_to_metric_families

    with serving(_app(world)) as server:
        client = Client(server.url)
        client.search(world["questions"][:4], k=3, mode="dense")
        client.search(world["questions"][4:6], k=3, mode="sparse")
        _request(server.url, "POST", "/search", b"{bad")
        status, headers, text = _get(server.url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"fastdpr_requests", "fastdpr_errors", "fastdpr_request_seconds", "fastdpr_batch_questions",
            "fastdpr_batch_seconds", "fastdpr_queue_questions"} <= names
    assert metric(text, "fastdpr_requests_total", endpoint="/search", status="200") == 2
    assert metric(text, "fastdpr_errors_total", endpoint="/search", reason="bad_json") == 1
    assert metric(text, "fastdpr_request_seconds_count", endpoint="/search") == 3


def test_api_key(world):
    with serving(_app(world, api_key="s3cret")) as server:
        assert _get(server.url, "/healthz")[0] == 200 and _get(server.url, "/readyz")[0] == 200
        status, headers, text = _request(server.url, "POST", "/search", b'{"question": "who"}')
        assert status == 401 and headers["www-authenticate"] == "Bearer" and "bearer" in json.loads(text)["error"]
        assert _get(server.url, "/", {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(server.url, "/metrics")[0] == 401
        hits = Client(server.url, api_key="s3cret").search(["who"], k=2)
        about = Client(server.url, api_key="s3cret").describe()
    assert len(hits[0]) == 2
    assert about["passages"] == 40 and about["modes"] == ["dense", "sparse", "hybrid"]


def test_every_route_but_the_open_ones_needs_the_key_and_a_route_added_later_does_too(world):
    """The key is checked for every path outside OPEN_ENDPOINTS before any route runs: the routes there are now,
    one added to the application afterwards (which checks nothing itself) and paths no route answers."""
    from fastdpr.serve.app import ENDPOINTS, OPEN_ENDPOINTS

    app = _app(world, api_key="s3cret")
    assert app.paths == sorted(ENDPOINTS)  # the list the metrics label by names every route
    assert set(OPEN_ENDPOINTS) < set(ENDPOINTS)

    @app.app.get("/added")
    async def added():
        return {"added": True}

    assert "/added" in app.paths
    key = {"Authorization": "Bearer s3cret"}
    refused = 0
    with serving(app) as server:
        for path in [*app.paths, "/no-such-route"]:
            for method in ("GET", "POST"):
                body = b"{}" if method == "POST" else None
                status, headers, text = _request(server.url, method, path, body)
                keyed = _request(server.url, method, path, body, key)[0]
                if path in OPEN_ENDPOINTS:
                    assert status != 401 and status == keyed, (method, path)
                else:
                    refused += 1
                    assert status == 401 and headers["www-authenticate"] == "Bearer", (method, path, status)
                    assert "bearer token is required" in json.loads(text)["error"]
                    assert keyed != 401, (method, path)
        assert json.loads(_get(server.url, "/added", key)[2]) == {"added": True}
        text = _get(server.url, "/metrics", key)[2]
    assert refused == 2 * (len(app.paths) + 1 - len(OPEN_ENDPOINTS))
    assert metric(text, "fastdpr_errors_total", reason="unauthorized") == refused


def test_a_websocket_without_the_key_is_closed_before_any_route_sees_it(world):
    import asyncio

    from fastapi import WebSocket

    app = _app(world, api_key="s3cret")
    reached = []

    @app.app.websocket("/socket")
    async def socket(websocket: WebSocket):
        reached.append(True)
        await websocket.accept()
        await websocket.close()

    def connect(headers):
        scope = {"type": "websocket", "path": "/socket", "raw_path": b"/socket", "root_path": "", "query_string": b"",
                 "headers": headers, "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
                 "subprotocols": [], "asgi": {"version": "3.0"}}
        sent, incoming = [], iter([{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}])

        async def receive():
            return next(incoming)

        async def send(message):
            sent.append(message)

        asyncio.run(app(scope, receive, send))
        return sent

    assert connect([]) == [{"type": "websocket.close", "code": 1008}]
    assert connect([(b"authorization", b"Bearer wrong")]) == [{"type": "websocket.close", "code": 1008}]
    assert not reached
    got = connect([(b"authorization", b"Bearer s3cret")])
    assert got[0]["type"] == "websocket.accept" and reached, got


def test_what_is_loaded_leaves_the_collectors_sight_once_warm(world):
    import gc

    gc.unfreeze()
    with serving(_app(world)) as server:
        assert _get(server.url, "/readyz")[0] == 200
        frozen = gc.get_freeze_count()
    gc.unfreeze()
    assert frozen > 0


def test_readme_curl_example_runs(world):
    from test_readme import marked_blocks, shell_lines

    lang, code = marked_blocks(README.read_text(encoding="utf-8"))["readme-serve"]
    (command,) = shell_lines(code)
    argv = shlex.split(command, comments=True)
    assert lang == "bash"
    assert argv[0] == "curl" and "http://127.0.0.1:8000/search" in argv
    payload = json.loads(argv[argv.index("-d") + 1])
    with serving(_app(world)) as server:
        argv = [a.replace("http://127.0.0.1:8000", server.url) for a in argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert_same_passages(answer["results"], world[payload["mode"]].retrieve(payload["questions"], payload["k"]))


def test_the_library_and_the_cli_help_import_no_server_package():
    import sys

    code = ("import sys, fastdpr, fastdpr.serve\n"
            "from fastdpr.serve import Client\n"
            "from fastdpr import cli\n"
            "cli.build_parser().format_help()\n"
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'prometheus_client', 'starlette', 'torch') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
