"""A small client for ``fastdpr serve``, on the standard library only (no serve extra needed to call a server).

    from fastdpr.serve import Client

    client = Client("http://127.0.0.1:8000")           # api_key="..." when the server has one
    hits = client.search(["who wrote hamlet"], k=20)    # as Retriever.retrieve: [[{id, title, text, score}]]
    vectors = client.encode(["who wrote hamlet"])       # (n, d) float32
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from fastdpr.errors import FastDPRError


class ServerError(FastDPRError):
    """The server refused or failed a request: ``status`` (None when it could not be reached), its one-line
    message, and ``retry_after`` (seconds) on a 503."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.retry_after = retry_after


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, chunk_size: int = 256):
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("FASTDPR_API_KEY") or None
        self.timeout = timeout
        self.chunk_size = chunk_size  # questions per request: the server bounds a request's questions

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            # UTF-8 bytes, as the server compares them (a str header would go out as Latin-1, or fail)
            req.add_header("Authorization", f"Bearer {self.api_key}".encode("utf-8"))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                message = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode("utf-8", "replace").strip() or err.reason
            retry = err.headers.get("Retry-After")
            raise ServerError(message, err.code, float(retry) if retry else None) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServerError(f"{self.url} cannot be reached ({reason})") from None
        return json.loads(body)

    def _chunks(self, questions: Sequence[str]) -> list[list[str]]:
        if isinstance(questions, str):
            raise TypeError("search() takes a list of questions, not a single string")
        questions = list(questions)
        return [questions[i:i + self.chunk_size] for i in range(0, len(questions), self.chunk_size)]

    def search(self, questions: Sequence[str], k: int = 100, mode: str | None = None) -> list[list[dict]]:
        """Top-``k`` passages of each question, best first, as ``Retriever.retrieve`` gives them; ``mode``
        dense, sparse or hybrid (None: the server's default, hybrid when it has both sides)."""
        out: list[list[dict]] = []
        for chunk in self._chunks(questions):
            payload = {"questions": chunk, "k": int(k)}
            if mode is not None:
                payload["mode"] = mode
            out.extend(self._request("POST", "/search", payload)["results"])
        return out

    retrieve = search

    def encode(self, questions: Sequence[str]):
        """(n, d) float32 question vectors."""
        import numpy as np

        rows = [v for chunk in self._chunks(questions) for v in self._request("POST", "/encode",
                                                                            {"questions": chunk})["vectors"]]
        return np.asarray(rows, dtype=np.float32)

    def describe(self) -> dict:
        return self._request("GET", "/")

    def ready(self) -> bool:
        try:
            return self._request("GET", "/readyz").get("status") == "ready"
        except ServerError:
            return False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if time.monotonic() > deadline:
                raise ServerError(f"{self.url} was not ready within {timeout_s}s")
            time.sleep(0.05)
