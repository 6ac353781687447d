"""``fastdpr serve`` under load, against the same retrievers called in-process.

A finished quickstart run provides the model (fine-tuned MiniLM), its flat index and BM25 over its corpus (every
paragraph of the published QA sets, 7,247 passages); the questions are a real query stream, NQ-open's dev
questions (``fastdpr data fetch`` puts them in the cache); each request asks one question, k=10:

    fastdpr quickstart --out RUN
    python benchmarks/serve_bench.py --run RUN                  # the full protocol (about 20 minutes)
    python benchmarks/serve_bench.py --run RUN --quick          # short phases and a 60 s soak, a smoke run

Without a quickstart run or the published files at hand, ``--standin DIR`` builds a pool of the same size and
shape from files in the repository: the packaged MiniLM as the quickstart loads it, the 120 SQuAD v1.1 dev
paragraphs of ``tests/data/sparse_squad_passages.jsonl`` repeated to 7,247 passages (copies keep their text, get
their own ids, and share their vector), a flat index and BM25 over them, and those paragraphs' 240 questions. What
a server spends per request (encoding one question, scanning 7,247 vectors, BM25 over 7,247 passages of similar
length, fusing, answering ten passages) is the same kind and amount of work as on the quickstart's corpus, though
not the same retrieval quality, which this benchmark does not measure:

    python benchmarks/serve_bench.py --standin /tmp/serve_pool

Measured, in this order:

1. in-process throughput: ``retrieve`` one question at a time and in batches of 64 (dense, questions in
   ``PRECISION``: bf16 where the CPU runs it natively, else fp32; and hybrid);
2. ``fastdpr serve`` (its own process, batching as shipped) under 1, 8, 32 and 128 closed-loop clients (each
   sends its next request when the last is answered), then the same server with ``--max-batch 1`` (one request
   at a time): throughput and p50/p95/p99 latency;
3. p99 latency at half the saturation rate (open loop: requests sent at a fixed rate, whatever the answers);
4. a soak at 70% of saturation, or lower where a short open-loop probe at that rate falls behind
   (``soak_rate``): failed requests and the server's resident memory, start and end;
5. overload at 3x saturation: every request must get an answer or a 503 within its timeout, and the server must
   answer normally afterwards.

The load generator (asyncio, a minimal keep-alive HTTP/1.1 client) runs in this process, on the same cores as the
server: loopback only, every phase bounded in requests and in time. On a shared machine absolute numbers move with the neighbours' load; the
ratios of phases measured minutes apart in one run are what to read.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import exit_if_data_unavailable, markdown_table, write_results  # noqa: E402

K = 10
LEVELS = (1, 8, 32, 128)


def _precision() -> str:
    """bf16 questions where this CPU multiplies bf16 natively (AVX512-BF16 / AMX), else fp32: emulated bf16 encodes
    questions several times slower than fp32 on an AVX2-only CPU (benchmarks/results/e2e.md: 35 against 207 q/s),
    which would measure the emulation, not the server."""
    from fastdpr.models.precision import bf16_supported

    return "bf16" if bf16_supported() else "fp32"


PRECISION = _precision()


# ------------------------------------------------------------------------------------------------ the files


def run_files(run: Path) -> dict:
    """The files a server needs from a quickstart run: its fine-tuned model and index when the run got that far,
    else the packaged starting model and the zero-shot index (same architecture and size, so the same speed)."""
    from fastdpr.data import sources
    from fastdpr.quickstart.config import QuickstartConfig
    from fastdpr.quickstart.experiment import Workspace, load_model, trained_model_path

    config = QuickstartConfig()
    if not ((run / "corpus.jsonl").is_file() and (run / "bm25").exists()):
        raise SystemExit(f"--run {run}: not a quickstart run (corpus.jsonl, bm25/)")
    model = trained_model_path(Workspace(config, run, run, print))
    if (model / "fastdpr.json").is_file() and (run / "index_dense").exists():
        model, index, which = str(model), str(run / "index_dense"), "fine-tuned"
    elif (run / "index_zero_shot").exists():
        # the starting model takes its GTR settings from code: saved once as a directory `fastdpr serve` loads
        saved = run / "serve_bench_zero_shot_model"
        if not (saved / "fastdpr.json").is_file():
            load_model(config).save_pretrained(saved)
        model, index, which = str(saved), str(run / "index_zero_shot"), "zero-shot (packaged, not fine-tuned)"
    else:
        raise SystemExit(f"--run {run}: no dense index yet (index_dense or index_zero_shot)")
    cache = sources.fetch(names=[sources.DATASETS["nq_open_dev"][0]], show_progress=False)
    questions = [q["question"] for q in sources.load(cache, "nq_open_dev")[1]]
    with open(run / "corpus.jsonl", encoding="utf-8") as fh:
        passages = sum(1 for line in fh if line.strip())
    return {"model": model, "index": index, "which_model": which, "bm25": str(run / "bm25"),
            "corpus": str(run / "corpus.jsonl"), "passages": passages, "questions": questions,
            "k_union": config.k_union}


# the quickstart's corpus: every paragraph of the published QA sets
STANDIN_PASSAGES = 7247
_SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data"


def standin_files(out: Path) -> dict:
    """The files of a quickstart-sized pool built from the repository's SQuAD sample (see the module docstring);
    built once into ``out`` and reused."""
    from fastdpr.index import build_index
    from fastdpr.quickstart.config import QuickstartConfig
    from fastdpr.quickstart.experiment import load_model
    from fastdpr.sparse import BM25
    from fastdpr.data import Corpus

    config = QuickstartConfig()
    unique = [json.loads(line) for line in open(_SAMPLES / "sparse_squad_passages.jsonl", encoding="utf-8")]
    questions = [json.loads(line)["question"]
                 for line in open(_SAMPLES / "sparse_squad_questions.jsonl", encoding="utf-8")]
    files = {"model": str(out / "model"), "index": str(out / "index_flat"), "bm25": str(out / "bm25"),
             "corpus": str(out / "corpus.jsonl"), "passages": STANDIN_PASSAGES, "questions": questions,
             "k_union": config.k_union,
             "which_model": f"packaged (not fine-tuned); stand-in pool: {len(unique)} SQuAD paragraphs repeated to "
                            f"{STANDIN_PASSAGES:,} passages"}
    if (out / "done").is_file():
        return files
    out.mkdir(parents=True, exist_ok=True)
    rows = [{**unique[i % len(unique)], "id": f"{unique[i % len(unique)]['id']}#{i // len(unique)}"}
            for i in range(STANDIN_PASSAGES)]
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    model = load_model(config)
    model.save_pretrained(out / "model")
    vectors = model.encode_passages(unique, batch_size=32, show_progress=False)
    build_index(vectors[[i % len(unique) for i in range(STANDIN_PASSAGES)]], "flat").save(out / "index_flat")
    BM25.from_corpus(Corpus.from_passages(rows), show_progress=False).save(out / "bm25")
    (out / "done").write_text("ok\n")
    return files


# ---------------------------------------------------------------------------------------------- in-process


def in_process(files: dict, seconds: float) -> dict:
    """Questions per second of ``retrieve`` one at a time and in batches of 64, per mode."""
    from fastdpr.data import Corpus
    from fastdpr.index import load_index
    from fastdpr.models import BiEncoder
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    corpus = Corpus.open(files["corpus"])
    model = BiEncoder.from_pretrained(files["model"])
    model.eval()
    dense = DenseRetriever(model, load_index(files["index"], mmap=True), corpus, precision=PRECISION)
    hybrid = HybridRetriever(dense, SparseRetriever(BM25.load(files["bm25"]), corpus), k_union=files["k_union"])
    qs = files["questions"]
    out = {}
    for mode, retriever in (("dense", dense), ("hybrid", hybrid)):
        retriever.retrieve(qs[:64], K)  # warm: first calls build caches and compile
        retriever.retrieve(qs[:1], K)
        for name, size in (("one_at_a_time", 1), ("batch_64", 64)):
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds and done < 20 * len(qs):
                at = done % len(qs)
                batch = (qs + qs)[at:at + size]
                retriever.retrieve(batch, K)
                done += len(batch)
            out[f"{mode}_{name}_qps"] = done / (time.perf_counter() - start)
            print(f"in-process {mode} {name}: {out[f'{mode}_{name}_qps']:.1f} q/s", flush=True)
    return out


# ------------------------------------------------------------------------------------------------- server


class Server:
    """``fastdpr serve`` in its own process on a free loopback port."""

    def __init__(self, files: dict, log: Path, *extra: str):
        from fastdpr.serve.server import loopback_socket

        with loopback_socket() as sock:
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "fastdpr", "serve", "--model", files["model"], "--index", files["index"],
                "--bm25", files["bm25"], "--corpus", files["corpus"], "--k-union", str(files["k_union"]),
                "--precision", PRECISION, "--port", str(self.port), *extra]
        self.log = open(log, "a", encoding="utf-8")
        self.log.write(f"$ {' '.join(argv)}\n")
        self.log.flush()
        # served without a key: the variable left out (the server refuses one that is set but empty)
        env = {k: v for k, v in os.environ.items() if k != "FASTDPR_API_KEY"}
        env["TOKENIZERS_PARALLELISM"] = "false"
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, env=env)
        from fastdpr.serve import Client

        deadline = time.monotonic() + 600
        while not Client(self.url, timeout=5).ready():
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server was not ready within 600 s; see {log}")
            time.sleep(0.2)

    def rss_mib(self) -> float:
        for line in open(f"/proc/{self.proc.pid}/status", encoding="utf-8"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


# ---------------------------------------------------------------------------------------------- load


def _summary(latencies: list[float], statuses: Counter, elapsed: float, **extra) -> dict:
    ok = statuses.get(200, 0)
    lat = sorted(latencies)

    def pct(p):
        return 1000 * lat[min(len(lat) - 1, int(p / 100 * len(lat)))] if lat else float("nan")

    return {**extra, "requests": sum(statuses.values()), "ok": ok, "qps": ok / elapsed if elapsed else 0.0,
            "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
            "statuses": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
            "seconds": elapsed}


class _StaleConnection(Exception):
    """A connection that answered before was closed before any byte of the next answer (keep-alive expiry, or
    eviction at the server's connection limit)."""


class _Connection:
    """One keep-alive HTTP/1.1 connection of the load generator.

    Written by hand rather than with aiohttp or httpx because the load generator shares the machine's two cores
    with the server, and the CPU a general client spends on each request (aiohttp's pool and response objects;
    httpx more as concurrency grows, httpx issue 3215) is taken from the server. This client sends prepared bytes
    and reads one response (status line, headers, a body of Content-Length bytes): all the benchmark needs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.answered = 0  # responses read on this connection
        self.idle_since = time.monotonic()

    @classmethod
    async def open(cls, host: str, port: int) -> "_Connection":
        return cls(*await asyncio.open_connection(host, port))

    async def post(self, request: bytes) -> tuple[int, bool]:
        """Send ``request`` and read the whole response: (status, whether the connection stays open)."""
        self.writer.write(request)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionResetError) as err:
            if self.answered and not getattr(err, "partial", b""):
                raise _StaleConnection from err
            raise
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            raise ConnectionError("a response without Content-Length")
        length = int(lower[at + 17:lower.index(b"\r\n", at + 2)])
        await self.reader.readexactly(length)
        self.answered += 1
        self.idle_since = time.monotonic()
        return status, b"\r\nconnection: close" not in lower

    def close(self) -> None:
        self.writer.close()


# The server closes a connection idle this long (uvicorn's keep-alive timeout; the benchmark's server keeps the
# default). A pooled connection idle for nearly as long may be closed by the server just as a request goes out on
# it, before this process has read the server's FIN: the request then fails though the server did nothing wrong.
SERVER_KEEP_ALIVE_S = 5.0
IDLE_MARGIN_S = 1.0


class _Load:
    """Prepared requests and a pool of connections (at most ``connections`` open; a request that finds none free
    waits for one, as an HTTP client's connection limit does).

    Stale keep-alive connections are handled as common HTTP clients handle them: a pooled connection idle for
    ``max_idle_s`` (the server's keep-alive less a margin) is closed rather than reused, and a request that finds
    its reused connection closed before any byte of the answer (keep-alive expiry, or the server evicting an idle
    connection at its ``max_connections``) is sent once more on a new connection (safe: a search changes
    nothing). Such retries are counted and reported, never folded into the statuses silently."""

    def __init__(self, url: str, mode: str, questions: list[str], connections: int, timeout: float,
                 max_idle_s: float = SERVER_KEEP_ALIVE_S - IDLE_MARGIN_S):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.requests = []
        for q in questions:
            body = json.dumps({"question": q, "k": K, "mode": mode}).encode()
            self.requests.append(b"POST /search HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(body), body))
        self.limit, self.timeout = connections, timeout
        self.free: list[_Connection] = []
        self.opened = 0
        self.peak = 0  # connections open at once, at most
        self.waited = 0  # requests that found none free and waited for one
        self.waiting: list[asyncio.Future] = []
        self.latencies: list[float] = []
        self.statuses: Counter = Counter()
        self.max_idle_s = max_idle_s
        self.retried = 0  # requests sent again because their reused connection was closed before any answer

    async def _acquire(self) -> _Connection | None:
        while self.free:
            conn = self.free.pop()
            if not conn.reader.at_eof() and time.monotonic() - conn.idle_since < self.max_idle_s:
                return conn
            conn.close()  # closed by the server while idle, or soon to be (keep-alive timeout)
            self.opened -= 1
        if self.opened >= self.limit:
            self.waited += 1
            wait = asyncio.get_running_loop().create_future()
            self.waiting.append(wait)
            conn = await wait
            if conn is not None:
                return conn
        self.opened += 1
        self.peak = max(self.peak, self.opened)
        return None  # the caller opens one (inside its timeout)

    def _release(self, conn: _Connection | None) -> None:
        while self.waiting and self.waiting[0].done():  # its request timed out while waiting
            self.waiting.pop(0)
        if conn is None:  # closed: its place may be taken by a new one
            self.opened -= 1
            if self.waiting:
                self.opened += 1
                self.waiting.pop(0).set_result(None)
        elif self.waiting:
            self.waiting.pop(0).set_result(conn)
        else:
            self.free.append(conn)

    async def one(self, i: int) -> None:
        """Request ``i`` (questions in turn): its status, and its latency when answered 200."""
        start = time.perf_counter()
        conn = None
        try:
            async with asyncio.timeout(self.timeout):
                conn = await self._acquire()
                if conn is None:
                    conn = await _Connection.open(self.host, self.port)
                request = self.requests[i % len(self.requests)]
                try:
                    status, keep = await conn.post(request)
                except _StaleConnection:
                    self.retried += 1
                    conn.close()  # its place in the pool passes to the new connection
                    conn = await _Connection.open(self.host, self.port)
                    status, keep = await conn.post(request)
        except TimeoutError:
            self.statuses["timeout"] += 1
            self._release(self._closed(conn))
            return
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            self.statuses[type(err).__name__] += 1
            self._release(self._closed(conn))
            return
        self.statuses[status] += 1
        if status == 200:
            self.latencies.append(time.perf_counter() - start)
        self._release(conn if keep else self._closed(conn))

    @staticmethod
    def _closed(conn: _Connection | None) -> None:
        if conn is not None:
            conn.close()
        return None

    def close(self) -> None:
        for conn in self.free:
            conn.close()


async def closed_loop(url: str, mode: str, clients: int, seconds: float, max_requests: int,
                      questions: list[str], timeout: float) -> dict:
    load = _Load(url, mode, questions, clients, timeout)
    sent = 0
    stop_at = time.perf_counter() + seconds

    async def client():
        nonlocal sent
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            await load.one(sent)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    load.close()
    return _summary(load.latencies, load.statuses, elapsed, mode=mode, clients=clients, retried=load.retried)


async def open_loop(url: str, mode: str, rate: float, seconds: float, questions: list[str], timeout: float,
                    connections: int, on_tick=None) -> dict:
    """``rate`` requests a second for ``seconds``, sent on schedule whatever the answers: each on a new connection
    when none is free, up to ``connections`` at once. The cap must not be what limits the load: a server answering
    in ``t`` seconds keeps ``rate * t`` connections busy (Little's law), and requests beyond the cap wait in this
    process, for a free connection, inside their timeout, so the load generator, not the server, would time them
    out (3x saturation with the server's queue bounded at 2 s needs thousands)."""
    load = _Load(url, mode, questions, connections, timeout)
    n = max(1, int(rate * seconds))
    tasks = []
    start = time.perf_counter()
    next_tick = start
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_tick is not None and time.perf_counter() >= next_tick:
            on_tick()
            next_tick += 10.0
        tasks.append(asyncio.ensure_future(load.one(i)))
    sent_in = time.perf_counter() - start
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    load.close()
    return {**_summary(load.latencies, load.statuses, elapsed, mode=mode), "rate": rate,
            "offered_rate": n / sent_in if sent_in else rate, "connections_peak": load.peak,
            "waited_for_connection": load.waited, "retried": load.retried}


SOAK_SHARE = 0.7  # the soak's rate: this share of the closed-loop saturation...
PROBE_STEP = 0.85  # ...lowered by this factor until an open-loop probe at it holds:
PROBE_P99_MS = 1000.0  # every request answered 200, p99 under this (the server sheds past 2 s of queue)
PROBE_PAUSE_S = 3.0


def soak_rate(url: str, saturation: float, questions: list[str], timeout: float, connections: int,
              seconds: float) -> tuple[float, list[dict]]:
    """The soak's rate and the probes that chose it. The closed loop measures the server on kept connections; an
    open loop at the same rate can fall behind on two shared cores (new connections, the load generator's own
    work), and once behind it does not recover: it sheds load for the whole soak, which then measures overload.
    So the soak runs at ``SOAK_SHARE`` of saturation only where a ``seconds`` open-loop probe at that rate holds,
    else at the first rate ``PROBE_STEP`` below it that does."""
    rate, probes = SOAK_SHARE * saturation, []
    for _ in range(8):
        probe = asyncio.run(open_loop(url, "dense", rate, seconds, questions, timeout, connections))
        probes.append({k: probe[k] for k in ("rate", "ok", "requests", "p99_ms", "statuses")})
        print(f"soak probe {rate:.0f}/s: {probe['ok']}/{probe['requests']} ok, p99 {probe['p99_ms']:.1f} ms",
              flush=True)
        if probe["ok"] == probe["requests"] and probe["p99_ms"] < PROBE_P99_MS:
            return rate, probes
        time.sleep(PROBE_PAUSE_S)  # the server's queue drains before the next probe
        rate *= PROBE_STEP
    return rate, probes


def _allow_connections(connections: int) -> None:
    """Raise this process's open-file limit (the server's, started from it, inherits it) to hold ``connections``
    sockets at each end, or stop with the reason."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connections + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SystemExit(f"--connections {connections}: the open-file limit is {hard}; lower --connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


# ----------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pool = ap.add_mutually_exclusive_group(required=True)
    pool.add_argument("--run", type=Path, help="output directory of a finished `fastdpr quickstart`")
    pool.add_argument("--standin", type=Path, help="directory for (or of) the stand-in pool built from the "
                      "repository's SQuAD sample, when no quickstart run is at hand")
    ap.add_argument("--level-seconds", type=float, default=20.0, help="length of each closed-loop level")
    ap.add_argument("--soak-seconds", type=float, default=600.0)
    ap.add_argument("--overload-seconds", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=10.0, help="client timeout of one request (s)")
    ap.add_argument("--connections", type=int, default=8192,
                    help="open-loop phases: connections open at once at most (open_loop: why so many)")
    ap.add_argument("--quick", action="store_true", help="5 s levels, a 60 s soak, 10 s overload: a smoke run")
    ap.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    ap.add_argument("--name", default="serve")
    args = ap.parse_args()
    # a benchmark stopped by SIGTERM (e.g. a timeout) still stops the servers it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _allow_connections(args.connections)
    if args.quick:
        args.level_seconds, args.soak_seconds, args.overload_seconds = 5.0, 60.0, 10.0
    files = run_files(args.run) if args.run is not None else standin_files(args.standin)
    qs = files["questions"]
    log = Path(tempfile.gettempdir()) / f"{args.name}.server.log"  # the servers' own output, not a result
    max_requests = 200_000

    baseline = in_process(files, seconds=args.level_seconds)
    levels, one_at_a_time = [], []

    def sweep(target: Server, label: str, rows: list) -> None:
        """Every mode at every client count against one server, a row each."""
        for mode in ("dense", "hybrid"):
            for clients in LEVELS:
                row = asyncio.run(closed_loop(target.url, mode, clients, args.level_seconds, max_requests, qs,
                                              args.timeout))
                rows.append({"server": label, **row})
                print(f"{label} {mode} {clients:>3} clients: {row['qps']:.1f} q/s p99 {row['p99_ms']:.1f} ms "
                      f"{row['statuses']}", flush=True)

    server = Server(files, log)
    try:
        sweep(server, "batched", levels)
        saturation = max(r["qps"] for r in levels if r["mode"] == "dense")
        half = asyncio.run(open_loop(server.url, "dense", saturation / 2, 2 * args.level_seconds, qs, args.timeout,
                                     args.connections))
        print(f"half saturation ({saturation / 2:.0f}/s): p99 {half['p99_ms']:.1f} ms {half['statuses']}", flush=True)
        rate, probes = soak_rate(server.url, saturation, qs, args.timeout, args.connections, args.level_seconds)
        rss = [(0.0, server.rss_mib())]
        soak_start = time.perf_counter()
        soak = asyncio.run(open_loop(server.url, "dense", rate, args.soak_seconds, qs, args.timeout,
                                     args.connections, on_tick=lambda: rss.append((time.perf_counter() - soak_start,
                                                                 server.rss_mib()))))
        rss.append((time.perf_counter() - soak_start, server.rss_mib()))
        print(f"soak: {soak['ok']}/{soak['requests']} ok, RSS {rss[0][1]:.0f} -> {rss[-1][1]:.0f} MiB", flush=True)
        overload = asyncio.run(open_loop(server.url, "dense", 3 * saturation, args.overload_seconds, qs,
                                         args.timeout, args.connections))
        print(f"overload: {overload['statuses']}", flush=True)
        after = asyncio.run(closed_loop(server.url, "dense", 8, min(5.0, args.level_seconds), 10_000, qs,
                                        args.timeout))
        print(f"after overload: {after['statuses']}", flush=True)
    finally:
        batched_rc = server.stop()
    single = Server(files, log, "--max-batch", "1")
    try:
        sweep(single, "max-batch 1", one_at_a_time)
    finally:
        single_rc = single.stop()

    def at(rows, mode, clients):
        return next(r for r in rows if r["mode"] == mode and r["clients"] == clients)

    checks = {}
    for mode in ("dense", "hybrid"):
        b32 = at(levels, mode, 32)["qps"]
        checks[f"{mode}_32_clients_vs_in_process_batched"] = b32 / baseline[f"{mode}_batch_64_qps"]
        checks[f"{mode}_32_clients_vs_max_batch_1"] = b32 / at(one_at_a_time, mode, 32)["qps"]
    checks["dense_p99_ms_at_half_saturation"] = half["p99_ms"]
    checks["soak_rate_share_of_saturation"] = soak["rate"] / saturation
    checks["soak_failed"] = soak["requests"] - soak["ok"]
    checks["soak_retried_stale_connection"] = soak["retried"]
    checks["soak_rss_mib_start_end"] = [rss[0][1], rss[-1][1]]
    answered = sum(v for k, v in overload["statuses"].items() if k in ("200", "503"))
    checks["overload_answered_200_or_503"] = f"{answered}/{overload['requests']}"
    checks["after_overload_ok"] = f"{after['ok']}/{after['requests']}"
    checks["sigterm_exit_codes"] = [batched_rc, single_rc]
    payload = {"settings": {k: v for k, v in vars(args).items() if k not in ("run", "standin", "out")} | {"k": K,
               "k_union": files["k_union"], "model": files["which_model"], "passages": files["passages"],
               "pool": "quickstart run" if args.run else "stand-in", "questions": len(qs), "precision": PRECISION},
               "in_process": baseline, "levels": levels + one_at_a_time, "half_saturation": half,
               "saturation_qps": saturation, "soak_probes": probes, "soak": soak, "soak_rss_mib": rss,
               "overload": overload, "after_overload": after, "checks": checks}
    cols = ["server", "mode", "clients", "qps", "p50_ms", "p95_ms", "p99_ms", "ok", "requests"]
    asked = "one NQ-open dev question" if args.run else "one of the sample's SQuAD questions"
    md = (f"`fastdpr serve` with MiniLM ({files['which_model']}; {PRECISION} questions), a flat index and BM25 over "
          f"{files['passages']:,} passages (hybrid: k_union {files['k_union']}); {asked} per request, k={K}; "
          "server and load generator (asyncio, a minimal HTTP/1.1 client) share the machine's cores over loopback. "
          "The machine is shared: "
          "read the ratios of rows measured in this one run rather than absolute numbers.\n\n"
          "In-process `retrieve` (questions/s):\n\n" + markdown_table([baseline], floatfmt=".1f") +
          "\nClosed loop (each client sends its next request when the last is answered):\n\n" +
          markdown_table(levels + one_at_a_time, cols, floatfmt=".1f") +
          f"\nSaturation (dense, batched): {saturation:.1f} q/s.\n\n" +
          f"Open loop at half saturation ({half['rate']:.0f}/s offered, {half['offered_rate']:.0f}/s sent): "
          f"p50 {half['p50_ms']:.1f} ms, p95 {half['p95_ms']:.1f} ms, p99 {half['p99_ms']:.1f} ms; "
          f"statuses {half['statuses']}.\n\n"
          f"Soak, {args.soak_seconds:.0f} s at {soak['rate'] / saturation:.0%} of saturation (the first rate from "
          f"{SOAK_SHARE:.0%} down in steps of x{PROBE_STEP} that a {args.level_seconds:.0f} s open-loop probe held: "
          + ", ".join(f"{pr['rate']:.0f}/s {pr['ok']}/{pr['requests']} ok p99 {pr['p99_ms']:.0f} ms" for pr in probes)
          + f"; {soak['rate']:.0f}/s offered, "
          f"{soak['offered_rate']:.0f}/s sent): {soak['ok']}/{soak['requests']} answered 200, statuses "
          f"{soak['statuses']}, {soak['retried']} sent again on a new connection (their pooled connection "
          f"closed by the server while idle, by its keep-alive timeout or its connection limit, before any "
          f"answer byte: see `_Load`); "
          f"p99 {soak['p99_ms']:.1f} ms; server RSS {rss[0][1]:.0f} MiB at the start, "
          f"{rss[-1][1]:.0f} MiB at the end (max {max(r for _, r in rss):.0f}, {len(rss)} samples).\n\n"
          f"Overload, {args.overload_seconds:.0f} s at 3x saturation ({overload['rate']:.0f}/s offered, "
          f"{overload['offered_rate']:.0f}/s sent, timeout {args.timeout:.0f} s, {overload['connections_peak']} "
          f"connections open at most, {overload['waited_for_connection']} requests waited for one): statuses "
          f"{overload['statuses']}; "
          f"then 8 clients for {after['seconds']:.0f} s: statuses {after['statuses']}.\n\n"
          "Checks:\n\n" + "\n".join(f"- {k}: {json.dumps(v) if not isinstance(v, float) else f'{v:.2f}'}"
                                     for k, v in checks.items()) + "\n")
    write_results(args.name, args.out, payload, md)
    print(md)


if __name__ == "__main__":
    exit_if_data_unavailable(main)
