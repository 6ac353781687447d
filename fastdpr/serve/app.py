"""The HTTP application: routes, limits, errors, metrics. See ``fastdpr/serve/__init__.py`` for the API.

The batched endpoints (``POST /search``, ``POST /encode``) are plain ASGI handlers in front of FastAPI, which
answers the rest (``/``, ``/healthz``, ``/readyz``, ``/metrics``, unknown paths). Every request of the hot path
would otherwise cross FastAPI's and Starlette's middleware, routing, request and response objects, which under
load were a large share of the event loop's work for each search request, on cores the model's worker shares.
Bodies are read and checked by hand (``fastdpr.serve.requests``) rather than through pydantic
models, so that each refusal is one line naming the field and the configured limits apply.

With an API key, every path needs it but those in ``OPEN_ENDPOINTS`` (the probes). The check is made once, at the
entry (``_Front``), before any route runs, so a route added later is closed until it is listed there."""

import asyncio
import gc
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager

from fastdpr.serve.backend import Backend
from fastdpr.serve.batcher import Batcher, Closed, QueueFull
from fastdpr.serve.files import FileChanged
from fastdpr.serve.metrics import Metrics
from fastdpr.serve.requests import Limits, RequestError, parse_encode, parse_json, parse_search

log = logging.getLogger("fastdpr.serve")

ENDPOINTS = ("/", "/search", "/encode", "/healthz", "/readyz", "/metrics")
OPEN_ENDPOINTS = ("/healthz", "/readyz")  # the only paths answered without the API key: probes
# a declared body this much over the limit is refused without reading it (the connection is then closed); a
# smaller one is read and dropped first, so that the client, still sending, is not cut off before the answer
_DRAIN_FACTOR = 64


def create_app(backend: Backend, *, limits: Limits | None = None, max_batch: int = 64, max_wait_ms: float = 5.0,
               max_queue: int = 1024, max_queue_ms: float | None = 2000.0, api_key: str | None = None,
               warm_up: bool = True, on_ready=None):
    """An ASGI application answering from ``backend``; its lifespan starts the batcher (and the warm-up) and,
    at shutdown, answers what is queued before it returns. ``on_ready()`` is called once warm."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException

    limits = limits or Limits()
    if limits.max_questions > max_queue:
        raise ValueError(f"max_queue ({max_queue}) must hold at least one full request ({limits.max_questions})")
    state = {"ready": False, "draining": False, "warm_error": None}
    batcher: Batcher
    metrics: Metrics

    def _json(obj, status: int = 200, headers: dict | None = None) -> Response:
        return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        warm = asyncio.get_running_loop().create_task(_warm())
        try:
            yield
        finally:
            state["draining"] = True
            await warm
            await batcher.close()

    async def _warm():
        try:
            if warm_up:
                await batcher.call(backend.warm_up)
            # the model, index, corpus and caches live as long as the process: out of the collector's sight, a
            # full collection (which requests' short-lived objects trigger) no longer walks all of them
            gc.freeze()
            state["ready"] = True
            if on_ready is not None:
                on_ready()
        except Exception as err:  # the server stays up (healthz) but never reports ready
            state["warm_error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
            log.exception("warm-up failed")

    # no redirects for a trailing slash: Starlette's would point at whatever host the Host header names
    app = FastAPI(title="fastdpr", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    batcher = Batcher(backend.run, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                      max_queue_ms=max_queue_ms)
    metrics = Metrics(lambda: batcher.depth)
    batcher.on_batch = metrics.observe_batch
    app.state.batcher, app.state.metrics, app.state.backend = batcher, metrics, backend
    authorize = _Authorizer(api_key)  # checked by _Front for every path outside OPEN_ENDPOINTS

    def _fail(request: Request, err: RequestError) -> Response:
        request.state.error_reason = err.reason or _REASONS.get(err.status, str(err.status))
        return _json({"error": err.message}, err.status, err.headers)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, err: RequestError):
        return _fail(request, err)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, err: HTTPException):
        return _fail(request, RequestError(err.status_code, str(err.detail), dict(err.headers or {})))

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception):
        log.exception("internal error on %s", request.url.path)
        request.state.error_reason = "internal"
        return _json({"error": _internal_message(err)}, 500)

    @app.get("/healthz")
    async def healthz():
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz():
        if state["draining"]:
            return _json({"status": "draining"}, 503)
        if state["warm_error"]:
            return _json({"status": "failed", "error": state["warm_error"]}, 503)
        if not state["ready"]:
            return _json({"status": "warming up"}, 503)
        try:
            backend.check_files()
        except FileChanged as err:
            return _json({"status": "files changed", "error": str(err)}, 503)
        return _json({"status": "ready"})

    @app.get("/metrics")
    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/")
    async def describe():
        from fastdpr import __version__

        return _json({
            "service": "fastdpr", "version": __version__, **backend.description, "passages": backend.passages(),
            "modes": list(backend.modes), "default_mode": backend.default_mode,
            "endpoints": {"POST /search": '{"questions": [...] | "question": "...", "k": 10, "mode": "..."}',
                          "POST /encode": '{"questions": [...] | "question": "..."}',
                          "GET /healthz": "alive", "GET /readyz": "loaded and warm",
                          "GET /metrics": "Prometheus text format"},
            "limits": {"max_k": limits.max_k, "max_questions": limits.max_questions,
                       "max_question_chars": limits.max_question_chars, "max_body_bytes": limits.max_body_bytes,
                       "max_results": limits.max_results, "max_answer_bytes": limits.max_answer_bytes,
                       "max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue,
                       "max_queue_ms": max_queue_ms},
        })

    return _Front(app, metrics, _BatchedRoutes(backend, batcher, limits), authorize)


_REASONS = {400: "bad_json", 401: "unauthorized", 405: "method", 413: "too_large", 422: "invalid",
            499: "client_gone", 503: "overloaded"}
_UNAVAILABLE = "unavailable"  # the reason of a 503 for files changed under the server


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _internal_message(err: Exception) -> str:
    return f"internal error: {type(err).__name__}: {' '.join(str(err).split())}"


class _Authorizer:
    """Checks ``Authorization: Bearer <key>`` when the server has a key (compared in constant time, as UTF-8
    bytes: the header arrives decoded as Latin-1, the way HTTP servers pass its raw bytes on)."""

    def __init__(self, api_key: str | None):
        if api_key is not None and not api_key:
            raise ValueError("the API key is empty")
        self.key = None if api_key is None else api_key.encode("utf-8")

    def __call__(self, given: str) -> None:
        if self.key is None:
            return
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise RequestError(401, "a bearer token is required (Authorization: Bearer <key>)",
                               {"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(token.strip().encode("latin-1", "replace"), self.key):
            raise RequestError(401, "the bearer token is not this server's key",
                               {"WWW-Authenticate": 'Bearer error="invalid_token"'})


class _BatchedRoutes:
    """``POST /search`` and ``POST /encode`` as plain ASGI: read and check the body, queue the questions, answer
    with their batch's results (module docstring: why not through FastAPI)."""

    def __init__(self, backend: Backend, batcher: Batcher, limits: Limits):
        self.backend, self.batcher, self.limits = backend, batcher, limits
        self.paths = {"/search": self.search, "/encode": self.encode}

    async def __call__(self, scope, receive, send) -> None:
        try:
            if scope["method"] != "POST":
                raise RequestError(405, f"{scope['path']} takes POST", {"Allow": "POST"})
            body = await self.paths[scope["path"]](scope, await self._body(scope, receive), receive)
        except RequestError as err:
            return await _refuse(scope, send, err)
        except Exception as err:
            log.exception("internal error on %s", scope["path"])
            scope["state"]["error_reason"] = "internal"
            return await _send_json(send, 500, _dumps({"error": _internal_message(err)}))
        await _send_json(send, 200, body)

    async def search(self, scope, body: bytes, receive) -> bytes:
        s = parse_search(parse_json(body), self.limits, self.backend.modes, self.backend.default_mode)
        results = await self._submit(receive, ("search", s.mode, s.k), s.questions)  # each a passage list's JSON
        size = sum(len(r) for r in results)  # characters, a byte or more each: over the limit, it is not built
        if size > self.limits.max_answer_bytes:
            raise RequestError(413, f"the answer holds over {size} characters; at most {self.limits.max_answer_bytes} "
                                    "bytes (ask for fewer questions or a smaller k)")
        answer = f'{{"mode": "{s.mode}", "k": {s.k}, "results": [{", ".join(results)}]}}'.encode("utf-8")
        if len(answer) > self.limits.max_answer_bytes:
            raise RequestError(413, f"the answer is {len(answer)} bytes; at most {self.limits.max_answer_bytes} (ask "
                                    "for fewer questions or a smaller k)")
        return answer

    async def encode(self, scope, body: bytes, receive) -> bytes:
        if not self.backend.can_encode:
            raise RequestError(422, "this server has no dense model: nothing to encode with")
        questions = parse_encode(parse_json(body), self.limits)
        vectors = await self._submit(receive, ("encode",), questions)
        return _dumps({"dim": len(vectors[0]), "vectors": vectors})

    async def _body(self, scope, receive) -> bytes:
        limit = self.limits.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared:
            try:
                declared_n = int(declared)
            except ValueError:
                raise RequestError(400, f"Content-Length is not a number: {declared!r}") from None
            if declared_n > limit:
                if declared_n <= limit * _DRAIN_FACTOR:
                    await _drain(receive)
                raise RequestError(413, f"the body has {declared_n} bytes; at most {limit}")
        chunks, size = [], 0
        while True:  # no or a false Content-Length: counted as it arrives
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError(499, "the client closed the connection before the answer")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            if not message.get("more_body", False) or size > limit * _DRAIN_FACTOR:
                break
        if size > limit:
            raise RequestError(413, f"the body is over {limit} bytes")
        return b"".join(chunks)

    async def _submit(self, receive, key: tuple, questions: list[str]) -> list:
        """The batch's answers; a client that disconnects first (e.g. timed out) takes its questions out of
        the queue, so that abandoned requests are never computed ahead of live ones."""
        try:
            job = self.batcher.enqueue(key, questions)
        except QueueFull as err:
            raise RequestError(503, str(err), {"Retry-After": str(err.retry_after)}) from None
        except Closed as err:
            raise RequestError(503, str(err), {"Retry-After": "1"}) from None
        # the body has been read: the next message is the disconnect, whenever it comes
        gone = asyncio.ensure_future(receive())

        def left(_) -> None:
            if _disconnected(gone) and not job.done():
                self.batcher.discard(job)

        gone.add_done_callback(left)
        try:
            return await job
        except QueueFull as err:  # waited past the bound before its batch could start (batcher.Expired)
            raise RequestError(503, str(err), {"Retry-After": str(err.retry_after)}) from None
        except FileChanged as err:
            raise RequestError(503, str(err), {"Retry-After": "60"}, reason=_UNAVAILABLE) from None
        except asyncio.CancelledError:
            if _disconnected(gone):
                raise RequestError(499, "the client closed the connection before the answer") from None
            self.batcher.discard(job)  # this request's task was cancelled (shutdown)
            raise
        finally:
            gone.cancel()


async def _refuse(scope, send, err: RequestError) -> None:
    scope["state"]["error_reason"] = err.reason or _REASONS.get(err.status, str(err.status))
    await _send_json(send, err.status, _dumps({"error": err.message}), err.headers)


async def _send_json(send, status: int, body: bytes, headers: dict | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *((k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items())]})
    await send({"type": "http.response.body", "body": body})


def _disconnected(receiving: asyncio.Future) -> bool:
    return (receiving.done() and not receiving.cancelled() and receiving.exception() is None
            and receiving.result().get("type") == "http.disconnect")


def _header(scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return ""


async def _drain(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


class _Front:
    """The ASGI entry: the API key (for every path outside ``OPEN_ENDPOINTS``: routes need not, and do not, check
    it themselves), then the batched routes, else FastAPI; counts every response (status, latency, error reason)
    into the metrics. Plain ASGI rather than a Starlette middleware, which would cost a task per request."""

    def __init__(self, app, metrics: Metrics, batched: _BatchedRoutes, authorize: _Authorizer):
        self.app = app
        self.metrics = metrics
        self.batched = batched
        self.authorize = authorize
        self.state = app.state

    @property
    def paths(self) -> list[str]:
        """Every path a route answers: the batched ones and FastAPI's."""
        return sorted({*self.batched.paths, *(route.path for route in self.app.routes)})

    def _require_key(self, scope) -> None:
        """:class:`RequestError` 401 unless the path is open or the request carries the key."""
        if scope.get("path", "") not in OPEN_ENDPOINTS:
            self.authorize(_header(scope, b"authorization"))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":  # no route takes one now; one added later is closed like the rest
            try:
                self._require_key(scope)
            except RequestError:
                return await send({"type": "websocket.close", "code": 1008})  # policy violation: HTTP 403
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500
        scope.setdefault("state", {})

        async def watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope.get("path", "")
        try:
            try:
                self._require_key(scope)
            except RequestError as err:
                await _refuse(scope, watch, err)
            else:
                if path in self.batched.paths:
                    await self.batched(scope, receive, watch)
                else:
                    await self.app(scope, receive, watch)
        finally:
            endpoint = path if path in ENDPOINTS else "other"
            reason = scope["state"].get("error_reason")
            self.metrics.observe_request(endpoint, status, time.perf_counter() - start, reason)
