"""Dense, sparse and hybrid search over HTTP, with concurrent requests batched together (``fastdpr serve``).

One process holds one copy of the model, index, BM25 and corpus. Requests that arrive within ``max_wait_ms`` of
each other (up to ``max_batch`` questions) go through one encoder call and one index call in a worker thread; the
event loop only parses, queues and answers.

Endpoints:

- ``POST /search`` ``{"questions": [...] | "question": "...", "k": 10, "mode": "dense|sparse|hybrid"}`` ->
  ``{"mode", "k", "results": [[{"id", "title", "text", "score"}, ...] per question]}``, best first;
- ``POST /encode`` ``{"questions": [...] | "question": "..."}`` -> ``{"dim", "vectors"}``;
- ``GET /healthz`` (alive), ``GET /readyz`` (loaded and warm; 503 before and while draining), ``GET /metrics``
  (Prometheus text), ``GET /`` (model, index, passages, modes, limits).

Refusals are one line, ``{"error": "..."}``: 400 not JSON, nested too deep or a question that is not text, 401 no or
wrong bearer token (with an API key, on every path but ``/healthz`` and ``/readyz``: ``app.OPEN_ENDPOINTS``), 408 request not complete in time, 413 body, questions x k or answer too large, 422 invalid
request, 431 headers too large, 503 queue full or waited too long (with ``Retry-After``), a file changed under the
server, or shutting down. The limits of connections are ``fastdpr.serve.protocol.ConnectionLimits``.

The server side needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client); :class:`Client` needs nothing
beyond the standard library. Names are imported lazily, so ``import fastdpr.serve`` imports neither.
"""
from __future__ import annotations

import importlib
import importlib.util

_LAZY = {
    "Client": "fastdpr.serve.client",
    "ServerError": "fastdpr.serve.client",
    "Backend": "fastdpr.serve.backend",
    "Batcher": "fastdpr.serve.batcher",
    "Limits": "fastdpr.serve.requests",
    "ConnectionLimits": "fastdpr.serve.protocol",
    "create_app": "fastdpr.serve.app",
    "serving": "fastdpr.serve.server",
    "run": "fastdpr.serve.server",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdpr.serve' has no attribute {name!r}")
    if module in ("fastdpr.serve.app", "fastdpr.serve.server"):
        require_extra()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def require_extra() -> None:
    """Raise ``MissingDependency`` naming the extra when FastAPI, uvicorn, httptools (the HTTP parser whose limits
    ``fastdpr.serve.protocol`` sets) or prometheus-client is missing."""
    from fastdpr.errors import MissingDependency

    missing = [m for m in ("fastapi", "uvicorn", "httptools", "prometheus_client")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(f"serving needs {', '.join(missing)}: pip install 'fastdpr[serve]'")
