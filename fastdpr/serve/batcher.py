"""Micro-batching of concurrent requests: questions that arrive close together go through one encoder call and
one index call, and each request gets its own slice of the answers back.

Only the standard library: the event loop side (``submit``) never computes anything; ``run_batch`` runs in one
worker thread, so the model and the index are never entered by two batches at once and the loop stays free to
accept, parse and answer other requests while a batch runs."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence


class QueueFull(Exception):
    """The queue holds ``max_queue`` questions, or more than ``max_queue_ms`` of expected work; ``retry_after``
    is a hint in whole seconds."""

    def __init__(self, depth: int, retry_after: int):
        super().__init__(f"the queue is full ({depth} questions waiting); retry in {retry_after}s")
        self.retry_after = retry_after


class Expired(QueueFull):
    """The job waited ``max_queue_ms`` without its batch starting: the estimate that admitted it was wrong (its
    questions cost more than the recent ones), and the bound holds by refusing it rather than running it late."""

    def __init__(self, waited_s: float, bound_s: float):
        Exception.__init__(self, f"the request waited {waited_s * 1000:.0f} ms in the queue, over the bound of "
                                 f"{bound_s * 1000:.0f} ms; retry in 1s")
        self.retry_after = 1


class Closed(Exception):
    """The batcher is draining for shutdown and takes no new work."""


@dataclass
class _Job:
    key: Hashable
    questions: list[str]
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects jobs ``(key, questions)``; jobs of one key are answered together by one
    ``run_batch(key, questions) -> per-question results`` call.

    A batch leaves when the oldest waiting job has waited ``max_wait_ms``, or its key has ``max_batch`` questions
    waiting, or when the next arrival is not expected within what is left of the wait (by a running estimate of
    the gaps between arrivals), or at once when the worker was busy for longer than that (so under load a batch
    is whatever arrived during the previous one, and an idle server adds at most ``max_wait_ms``). An arrival
    that finds nothing else queued or running counts as a gap of at least ``max_wait_ms``: a client that waits
    for each answer before it asks again (one client, or a quiet server) would otherwise be kept waiting for an
    arrival its own answer holds back, every time. Jobs of other
    keys keep their place. A job larger than ``max_batch`` goes alone, whole. At most ``max_queue`` questions wait, and at most
    ``max_queue_ms`` of expected work (the questions waiting times a running estimate of the seconds per question
    of recent batches at least half full, the way a backlog is drained; none before the first such batch);
    beyond either ``submit`` raises :class:`QueueFull`. A count alone bounds memory but not
    time: on a slow machine a full queue holds more work than a client's timeout, so under overload requests
    would time out instead of being refused; bounding the expected wait turns that into a prompt 503. The estimate
    can be wrong (questions of a larger k, a slower mode), so the bound is also held where it is measured: a job
    that has waited ``max_queue_ms`` when its batch would start gets :class:`Expired` instead.

    A batch that fails with more than one job is run again one job at a time, so that a request that cannot be
    answered fails alone and never takes its batch-mates with it."""

    def __init__(self, run_batch: Callable[[Hashable, list[str]], Sequence[Any]], *, max_batch: int = 64,
                 max_wait_ms: float = 5.0, max_queue: int = 1024, max_queue_ms: float | None = 2000.0,
                 on_batch: Callable[[int, float], None] | None = None):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0 or (max_queue_ms is not None and max_queue_ms <= 0):
            raise ValueError("max_batch and max_queue must be >= 1, max_wait_ms >= 0 and max_queue_ms > 0")
        self.run_batch = run_batch
        self.max_batch = int(max_batch)
        self.max_wait = float(max_wait_ms) / 1000.0
        self.max_queue = int(max_queue)
        self.max_queue_s = None if max_queue_ms is None else float(max_queue_ms) / 1000.0
        self.on_batch = on_batch  # (questions, seconds) of every batch run, for the metrics
        self.depth = 0  # questions waiting
        self._running = 0  # jobs in the batch the worker is running
        self._jobs: list[_Job] = []
        self._counts: dict[Hashable, int] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False
        self._seconds_per_question: float | None = None  # running estimate from batches at least half full
        self._last_arrival: float | None = None
        self._gap: float | None = None  # running estimate of the seconds between arrivals

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdpr-batch")
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread, between batches (warm-up, anything that touches the model)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def submit(self, key: Hashable, questions: list[str]) -> list[Any]:
        """The results of ``questions`` (one per question, in order), once their batch has run."""
        future = self.enqueue(key, questions)
        try:
            return await future
        except asyncio.CancelledError:
            self.discard(future)  # the caller gave up (its client went away)
            raise

    def enqueue(self, key: Hashable, questions: list[str]) -> asyncio.Future:
        """Queue ``questions`` now (or raise :class:`QueueFull` / :class:`Closed`); the future gets their results.
        A future cancelled while queued (:meth:`discard`) leaves the queue uncomputed."""
        if self._closing or self._task is None:
            raise Closed("the server is shutting down")
        if self.depth > 0:  # an idle queue takes any request, so a single large one is never refused forever
            wait = (self.depth + len(questions)) * (self._seconds_per_question or 0.0)
            if self.depth + len(questions) > self.max_queue or (self.max_queue_s is not None
                                                                 and wait > self.max_queue_s):
                raise QueueFull(self.depth, max(1, int(wait + 0.999)))
        job = _Job(key, list(questions), asyncio.get_running_loop().create_future())
        gap = None if self._last_arrival is None else job.arrived - self._last_arrival
        if not self._jobs and not self._running:  # alone: no company is known to be on its way
            gap = max(gap or 0.0, self.max_wait)
        if gap is not None:
            self._gap = gap if self._gap is None else 0.8 * self._gap + 0.2 * gap
        self._last_arrival = job.arrived
        self._jobs.append(job)
        self._counts[key] = self._counts.get(key, 0) + len(job.questions)
        self.depth += len(job.questions)
        self._wake.set()
        return job.future

    def discard(self, future: asyncio.Future) -> None:
        """Cancel the job of ``future`` (from :meth:`enqueue`); still queued, it leaves the queue."""
        future.cancel()
        for job in self._jobs:
            if job.future is future:
                self._discard(job)
                return

    def _discard(self, job: _Job) -> None:
        try:
            self._jobs.remove(job)
        except ValueError:
            return  # already taken into a batch
        self._counts[job.key] -= len(job.questions)
        self.depth -= len(job.questions)

    async def close(self) -> None:
        """Stop taking jobs, answer every job already queued, then stop the worker."""
        self._closing = True
        if self._task is not None:
            self._wake.set()
            await self._task
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _wait(self, timeout: float | None) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _loop(self) -> None:
        while True:
            if not self._jobs:
                if self._closing:
                    return
                await self._wait(None)
                continue
            head = self._jobs[0]
            while not self._closing and self._counts[head.key] < self.max_batch:
                remaining = head.arrived + self.max_wait - time.monotonic()
                # no company expected within the wait (one client at a time, a quiet server): go now, the wait
                # would only add to the answer's latency
                if remaining <= 0 or (self._gap is not None and self._gap > remaining):
                    break
                await self._wait(remaining)
            batch = self._take(head.key)
            await self._run(head.key, batch)

    def _take(self, key: Hashable) -> list[_Job]:
        """The oldest jobs of ``key`` up to ``max_batch`` questions (the first whatever its size), in order."""
        batch, rest, n, full = [], [], 0, False
        for job in self._jobs:
            # first in, first out within a key: once a job does not fit, later ones of its key wait too
            if job.key == key and not full and (not batch or n + len(job.questions) <= self.max_batch):
                batch.append(job)
                n += len(job.questions)
            else:
                full = full or job.key == key
                rest.append(job)
        self._jobs = rest
        self._counts[key] -= n
        self.depth -= n
        return batch

    async def _run(self, key: Hashable, batch: list[_Job], expire: bool = True) -> None:
        if expire and self.max_queue_s is not None:
            now = time.monotonic()
            for job in batch:
                if not job.future.done() and now - job.arrived > self.max_queue_s:
                    job.future.set_exception(Expired(now - job.arrived, self.max_queue_s))
        live = [job for job in batch if not job.future.done()]  # a client that went away needs no answer
        if not live:
            return
        questions = [q for job in live for q in job.questions]
        start = time.perf_counter()
        self._running = len(live)
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.run_batch, key,
                                                                       questions)
            if len(results) != len(questions):
                raise RuntimeError(f"run_batch gave {len(results)} results for {len(questions)} questions")
        except Exception as err:  # the request that caused it learns of it; the loop goes on
            if len(live) == 1:
                if not live[0].future.done():
                    live[0].future.set_exception(err)
                return
            for job in live:  # which request caused it: each alone (none expires now: they were on time)
                await self._run(key, [job], expire=False)
            return
        finally:
            self._running = 0
        seconds = time.perf_counter() - start
        if 2 * len(questions) >= self.max_batch:
            # only batches at least half full: a backlog drains in full batches, and a question costs several
            # times less in one of those than alone, so light-load batches would make the estimate refuse work
            # the queue clears in time
            latest = seconds / len(questions)
            old = self._seconds_per_question
            self._seconds_per_question = latest if old is None else 0.8 * old + 0.2 * latest
        if self.on_batch is not None:
            self.on_batch(len(questions), seconds)
        at = 0
        for job in live:
            part = list(results[at:at + len(job.questions)])
            at += len(job.questions)
            if not job.future.done():
                job.future.set_result(part)
