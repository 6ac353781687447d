"""The HTTP application (FastAPI): routes, limits, errors, metrics. See ``fastdpr/serve/__init__.py`` for the API.

Bodies are read and checked here by hand (``fastdpr.serve.requests``) rather than through pydantic models, so
that each refusal is one line naming the field and the configured limits apply."""

import asyncio
import gc
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager

from fastdpr.serve.backend import Backend
from fastdpr.serve.batcher import Batcher, Closed, QueueFull
from fastdpr.serve.metrics import Metrics
from fastdpr.serve.requests import Limits, RequestError, parse_encode, parse_json, parse_search

log = logging.getLogger("fastdpr.serve")

ENDPOINTS = ("/", "/search", "/encode", "/healthz", "/readyz", "/metrics")
OPEN_ENDPOINTS = ("/healthz", "/readyz")  # probes answer without the API key
# a declared body this much over the limit is refused without reading it (the connection is then closed); a
# smaller one is read and dropped first, so that the client, still sending, is not cut off before the answer
_DRAIN_FACTOR = 64


def create_app(backend: Backend, *, limits: Limits | None = None, max_batch: int = 64, max_wait_ms: float = 5.0,
               max_queue: int = 1024, max_queue_ms: float | None = 2000.0, api_key: str | None = None,
               warm_up: bool = True):
    """A FastAPI application answering from ``backend``; its lifespan starts the batcher (and the warm-up) and,
    at shutdown, answers what is queued before it returns."""
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
        return Response(json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8"), status_code=status,
                        media_type="application/json", headers=headers)

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
        except Exception as err:  # the server stays up (healthz) but never reports ready
            state["warm_error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
            log.exception("warm-up failed")

    app = FastAPI(title="fastdpr", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    batcher = Batcher(backend.run, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                      max_queue_ms=max_queue_ms)
    metrics = Metrics(lambda: batcher.depth)
    batcher.on_batch = metrics.observe_batch
    app.state.batcher, app.state.metrics, app.state.backend = batcher, metrics, backend

    def _fail(request: Request, err: RequestError) -> Response:
        request.state.error_reason = {400: "bad_json", 401: "unauthorized", 413: "too_large", 422: "invalid",
                                      499: "client_gone", 503: "overloaded"}.get(err.status, str(err.status))
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
        return _json({"error": f"internal error: {type(err).__name__}: {' '.join(str(err).split())}"}, 500)

    def _authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise RequestError(401, "a bearer token is required (Authorization: Bearer <key>)",
                               {"WWW-Authenticate": "Bearer"})

    async def _body(request: Request) -> bytes:
        limit = limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                declared_n = int(declared)
            except ValueError:
                raise RequestError(400, f"Content-Length is not a number: {declared!r}") from None
            if declared_n > limit:
                if declared_n <= limit * _DRAIN_FACTOR:
                    async for _ in request.stream():
                        pass
                raise RequestError(413, f"the body has {declared_n} bytes; at most {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():  # no or a false Content-Length: counted as it arrives
            size += len(chunk)
            if size > limit * _DRAIN_FACTOR:
                break
            if size <= limit:
                chunks.append(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over {limit} bytes")
        return b"".join(chunks)

    async def _submit(request: Request, key: tuple, questions: list[str]) -> list:
        """The batch's answers; a client that disconnects first (e.g. timed out) takes its questions out of
        the queue, so that abandoned requests are never computed ahead of live ones."""
        job = asyncio.ensure_future(batcher.submit(key, questions))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not job.done():
                job.cancel()
            gone.cancel()
        if not job.done() or job.cancelled():
            raise RequestError(499, "the client closed the connection before the answer")
        try:
            return job.result()
        except QueueFull as err:
            raise RequestError(503, str(err), {"Retry-After": str(err.retry_after)}) from None
        except Closed as err:
            raise RequestError(503, str(err), {"Retry-After": "1"}) from None

    async def _disconnected(request: Request) -> None:
        # the body has been read: the next message on the channel is the disconnect, whenever it comes
        while (await request.receive())["type"] != "http.disconnect":
            pass

    @app.post("/search")
    async def search(request: Request):
        _authorize(request)
        s = parse_search(parse_json(await _body(request)), limits, backend.modes, backend.default_mode)
        results = await _submit(request, ("search", s.mode, s.k), s.questions)
        return _json({"mode": s.mode, "k": s.k, "results": results})

    @app.post("/encode")
    async def encode(request: Request):
        _authorize(request)
        if not backend.can_encode:
            raise RequestError(422, "this server has no dense model: nothing to encode with")
        questions = parse_encode(parse_json(await _body(request)), limits)
        vectors = await _submit(request, ("encode",), questions)
        return _json({"dim": len(vectors[0]), "vectors": vectors})

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
        return _json({"status": "ready"})

    @app.get("/metrics")
    async def prometheus(request: Request):
        _authorize(request)
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/")
    async def describe(request: Request):
        _authorize(request)
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
                       "max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue,
                       "max_queue_ms": max_queue_ms},
        })

    return _Observed(app, metrics)


class _Observed:
    """ASGI wrapper that counts every response (status, latency, error reason) into the metrics; plain ASGI
    rather than a Starlette middleware, which would cost a task per request."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics
        self.state = app.state

    async def __call__(self, scope, receive, send):
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

        try:
            await self.app(scope, receive, watch)
        finally:
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "other"
            reason = scope["state"].get("error_reason")
            self.metrics.observe_request(endpoint, status, time.perf_counter() - start, reason)
