"""The micro-batcher on its own: grouping, order, limits, errors and draining, with a recording stand-in for the
model (no HTTP, no torch)."""
import asyncio
import threading
import time

import pytest

from fastdpr.serve.batcher import Batcher, Closed, Expired, QueueFull


class Recorder:
    """run_batch that records each call and answers ``(key, question)`` per question."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.calls: list[tuple] = []
        self.delay = delay
        self.fail_on = fail_on
        self.threads: set[str] = set()

    def __call__(self, key, questions):
        self.threads.add(threading.current_thread().name)
        self.calls.append((key, list(questions)))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on in questions:
            raise ValueError(f"cannot answer {self.fail_on}")
        return [(key, q) for q in questions]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_jobs_share_one_call_and_get_their_own_answers():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=64, max_wait_ms=50)
        await b.start()
        jobs = [b.submit("a", [f"q{i}", f"r{i}"]) for i in range(5)]
        out = await asyncio.gather(*jobs)
        await b.close()
        return out

    out = run(main())
    assert out == [[("a", f"q{i}"), ("a", f"r{i}")] for i in range(5)]
    assert rec.calls == [("a", [q for i in range(5) for q in (f"q{i}", f"r{i}")])]
    assert all(name.startswith("fastdpr-batch") for name in rec.threads)


def test_keys_never_mix_and_max_batch_splits_in_arrival_order():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=3, max_wait_ms=30)
        await b.start()
        jobs = [b.submit("a", ["a1", "a2"]), b.submit("b", ["b1"]), b.submit("a", ["a3", "a4"]),
                b.submit("a", ["a5"]), b.submit("b", ["b2", "b3", "b4", "b5"])]
        out = await asyncio.gather(*jobs)
        await b.close()
        return out

    out = run(main())
    assert [[q for _, q in part] for part in out] == [["a1", "a2"], ["b1"], ["a3", "a4"], ["a5"],
                                                     ["b2", "b3", "b4", "b5"]]
    assert all(len({k for k, _ in part}) == 1 for part in out)
    # a: [a1 a2] then [a3 a4 a5] (a3 a4 do not fit beside a1 a2); b: [b1], then the 4-question job alone, whole
    assert rec.calls == [("a", ["a1", "a2"]), ("b", ["b1"]), ("a", ["a3", "a4", "a5"]),
                         ("b", ["b2", "b3", "b4", "b5"])]


def test_max_batch_one_runs_every_question_alone():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=1, max_wait_ms=0)
        await b.start()
        await asyncio.gather(*[b.submit("a", [f"q{i}"]) for i in range(6)])
        await b.close()

    run(main())
    assert [len(qs) for _, qs in rec.calls] == [1] * 6


def test_arrivals_together_wait_for_company_at_most_max_wait():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=64, max_wait_ms=150)
        await b.start()
        start = time.perf_counter()
        answers = await asyncio.gather(*(b.submit("a", [f"q{i}"]) for i in range(3)))
        took = time.perf_counter() - start
        await b.close()
        return took, answers

    took, answers = run(main())
    assert 0.1 <= took < 0.5  # they waited for a fourth, up to the limit
    assert answers == [[("a", f"q{i}")] for i in range(3)] and len(rec.calls) == 1


def test_a_client_waiting_for_each_answer_is_never_kept_waiting_for_itself():
    rec = Recorder(delay=0.01)

    async def main():
        b = Batcher(rec, max_batch=64, max_wait_ms=300)
        await b.start()
        took = []
        for i in range(4):  # each request finds nothing else queued or running
            start = time.perf_counter()
            await b.submit("a", [f"q{i}"])
            took.append(time.perf_counter() - start)
        await b.close()
        return took

    took = run(main())
    assert max(took) < 0.15  # not the 0.3 s wait, not even for the first request


def test_full_queue_refuses_with_a_retry_hint_and_recovers():
    rec = Recorder(delay=0.1)

    async def main():
        b = Batcher(rec, max_batch=1, max_wait_ms=0, max_queue=3)
        await b.start()
        first = asyncio.ensure_future(b.submit("a", ["busy"]))
        await asyncio.sleep(0.02)  # the worker is busy with it; the next ones queue
        queued = [asyncio.ensure_future(b.submit("a", [f"q{i}"])) for i in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as refused:
            await b.submit("a", ["one too many"])
        assert refused.value.retry_after >= 1
        await asyncio.gather(first, *queued)
        again = await b.submit("a", ["after"])
        await b.close()
        return again

    assert run(main()) == [("a", "after")]


def test_more_expected_work_than_max_queue_ms_is_refused_before_the_count_limit():
    rec = Recorder(delay=0.2)

    async def main():
        b = Batcher(rec, max_batch=1, max_wait_ms=0, max_queue=100, max_queue_ms=500)
        await b.start()
        await b.submit("a", ["warm"])  # one batch measured: 0.2 s a question
        first = asyncio.ensure_future(b.submit("a", ["busy"]))
        await asyncio.sleep(0.05)  # the worker is busy with it; the next ones queue
        queued = [asyncio.ensure_future(b.submit("a", [f"q{i}"])) for i in range(2)]
        await asyncio.sleep(0)
        assert b.depth == 2
        with pytest.raises(QueueFull) as refused:  # 3 questions x 0.2 s > 0.5 s, though 3 <= max_queue
            await b.submit("a", ["one too many"])
        assert refused.value.retry_after >= 1
        answered = await asyncio.gather(first, *queued)
        await b.close()
        return answered

    assert run(main()) == [[("a", "busy")], [("a", "q0")], [("a", "q1")]]


def test_without_a_measured_batch_only_the_count_limits_the_queue_and_the_bound_holds_at_the_start():
    """Before any batch is measured every job is admitted (8 x 0.1 s against a bound of 0.25 s); the bound then
    holds where it is measured: a job whose batch would start after 0.25 s of waiting is refused, not run late."""
    rec = Recorder(delay=0.1)

    async def main():
        b = Batcher(rec, max_batch=1, max_wait_ms=0, max_queue=8, max_queue_ms=250)
        await b.start()
        jobs = [asyncio.ensure_future(b.submit("a", [f"q{i}"])) for i in range(8)]
        await asyncio.sleep(0)
        answered = await asyncio.gather(*jobs, return_exceptions=True)
        await b.close()
        return answered

    answered = run(main())
    done = [a for a in answered if not isinstance(a, Exception)]
    assert done == [[("a", f"q{i}")] for i in range(len(done))] and done  # the first ones, in order
    late = answered[len(done):]
    assert late and all(isinstance(a, Expired) for a in late)
    assert [qs for _, qs in rec.calls] == [[f"q{i}"] for i in range(len(done))]  # the late ones never ran


class PerBatch(Recorder):
    """A model whose batch costs the same whatever its size, as a small batch nearly does."""

    def __call__(self, key, questions):
        time.sleep(self.delay)
        return [(key, q) for q in questions]


def test_expected_wait_is_judged_by_full_batches_not_by_light_load_ones():
    rec = PerBatch(delay=0.05)

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_ms=0, max_queue=100, max_queue_ms=500)
        await b.start()
        for i in range(3):  # light load: batches of one, 50 ms a question
            await b.submit("a", [f"alone{i}"])
        busy = asyncio.ensure_future(b.submit("a", ["busy"]))
        await asyncio.sleep(0.01)
        # 24 questions: 1.2 s at the light-load rate, but three full batches (150 ms): taken
        backlog = [asyncio.ensure_future(b.submit("a", [f"q{i}"])) for i in range(24)]
        await asyncio.sleep(0)
        refused = [j for j in backlog if j.done() and j.exception() is not None]
        await asyncio.gather(busy, *backlog)
        assert b._seconds_per_question == pytest.approx(0.05 / 8, rel=0.5)  # measured on full batches
        # a backlog that full batches cannot clear in time is still refused
        more = asyncio.ensure_future(b.submit("a", ["busy again"]))
        await asyncio.sleep(0.01)
        flood = [asyncio.ensure_future(b.submit("a", [f"f{i}"])) for i in range(99)]
        await asyncio.sleep(0)
        flood_refused = sum(1 for j in flood if j.done() and isinstance(j.exception(), QueueFull))
        await asyncio.gather(more, *flood, return_exceptions=True)
        await b.close()
        return refused, flood_refused

    refused, flood_refused = run(main())
    assert refused == []
    assert flood_refused > 0  # 99 questions x ~6 ms > 500 ms


def test_a_lone_request_does_not_wait_for_company_that_is_not_coming():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=64, max_wait_ms=400)
        await b.start()
        for i in range(3):  # arrivals 0.5 s apart, longer than the wait
            await b.submit("a", [f"q{i}"])
            await asyncio.sleep(0.5)
        start = time.perf_counter()
        await b.submit("a", ["lone"])
        took = time.perf_counter() - start
        # and when arrivals come close together again, they are batched
        together = await asyncio.gather(*(b.submit("a", [f"t{i}"]) for i in range(5)))
        await b.close()
        return took, together

    took, together = run(main())
    assert took < 0.2  # not the 0.4 s wait
    assert together == [[("a", f"t{i}")] for i in range(5)]
    assert [q for _, qs in rec.calls for q in qs if q.startswith("t")] == [f"t{i}" for i in range(5)]
    assert sum(1 for _, qs in rec.calls if any(q.startswith("t") for q in qs)) == 1  # one call for all five


def test_an_error_reaches_only_the_job_that_caused_it_and_the_loop_goes_on():
    rec = Recorder(fail_on="bad")

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_ms=20)
        await b.start()
        results = await asyncio.gather(b.submit("a", ["ok"]), b.submit("a", ["bad"]), b.submit("a", ["also"]),
                                       return_exceptions=True)
        later = await b.submit("a", ["fine"])
        await b.close()
        return results, later

    results, later = run(main())
    assert rec.calls[0] == ("a", ["ok", "bad", "also"])  # one batch, which failed; then each job alone
    assert results[0] == [("a", "ok")] and results[2] == [("a", "also")]
    assert isinstance(results[1], ValueError) and "cannot answer bad" in str(results[1])
    assert later == [("a", "fine")]


def test_close_answers_everything_queued_then_refuses():
    rec = Recorder(delay=0.02)

    async def main():
        b = Batcher(rec, max_batch=2, max_wait_ms=1000)
        await b.start()
        jobs = [asyncio.ensure_future(b.submit(k, [f"{k}{i}"])) for i in range(3) for k in "ab"]
        await asyncio.sleep(0.01)
        await b.close()  # does not wait out max_wait_ms: the queue is flushed at once
        with pytest.raises(Closed):
            await b.submit("a", ["late"])
        return [j.result() for j in jobs]

    start = time.perf_counter()
    out = run(main())
    assert time.perf_counter() - start < 0.9
    assert sorted(q for part in out for _, q in part) == sorted(f"{k}{i}" for i in range(3) for k in "ab")


def test_a_cancelled_job_leaves_the_queue_uncomputed():
    rec = Recorder(delay=0.1)

    async def main():
        b = Batcher(rec, max_batch=1, max_wait_ms=0)
        await b.start()
        busy = asyncio.ensure_future(b.submit("a", ["busy"]))
        await asyncio.sleep(0.02)
        abandoned = asyncio.ensure_future(b.submit("a", ["abandoned", "too"]))
        kept = asyncio.ensure_future(b.submit("a", ["kept"]))
        await asyncio.sleep(0)
        assert b.depth == 3
        abandoned.cancel()
        await asyncio.sleep(0)
        depth = b.depth
        await asyncio.gather(busy, kept)
        await b.close()
        return depth

    assert run(main()) == 1
    assert [qs for _, qs in rec.calls] == [["busy"], ["kept"]]
