"""The server's Prometheus metrics, in a registry of its own (two servers in one process, as in tests, do not
share counters)."""
from __future__ import annotations

from typing import Callable


class Metrics:
    def __init__(self, queue_depth: Callable[[], float]):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("fastdpr_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.errors = Counter("fastdpr_errors", "requests answered with an error, by endpoint and reason",
                              ["endpoint", "reason"], registry=self.registry)
        self.latency = Histogram("fastdpr_request_seconds", "time from request to response, by endpoint",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.batch_questions = Histogram("fastdpr_batch_questions", "questions per encoder and index call",
                                         registry=self.registry,
                                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_seconds = Histogram("fastdpr_batch_seconds", "time of one batch in the worker thread",
                                       registry=self.registry,
                                       buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.queue = Gauge("fastdpr_queue_questions", "questions waiting for a batch", registry=self.registry)
        self.queue.set_function(queue_depth)

    def observe_batch(self, questions: int, seconds: float) -> None:
        self.batch_questions.observe(questions)
        self.batch_seconds.observe(seconds)

    def observe_request(self, endpoint: str, status: int, seconds: float, reason: str | None) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if status >= 400:
            self.errors.labels(endpoint, reason or str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
