"""``fastdpr serve``: dense, sparse and hybrid search over HTTP, concurrent requests batched together.

    fastdpr serve --model dpr/model --index index.fdpr --bm25 bm25/ --corpus passages.tsv --alpha-file alpha.json
    curl -s localhost:8000/search -H 'Content-Type: application/json' \\
        -d '{"questions": ["who won super bowl 50?"], "k": 5, "mode": "hybrid"}'
    fastdpr serve --bm25 bm25/ --corpus passages.tsv --port 9000          # BM25 only
    FASTDPR_API_KEY=secret fastdpr serve ...     # then: curl -H 'Authorization: Bearer secret' ...

Needs the serve extra: pip install 'fastdpr[serve]'. Binds to 127.0.0.1 unless --host says otherwise. Prints
"ready" once warm. SIGTERM (or Ctrl-C) stops accepting, answers what is queued, and exits 0.
"""
from __future__ import annotations

import argparse

API_KEY_ENV = "FASTDPR_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="bi-encoder directory (dense and hybrid modes, /encode)")
    parser.add_argument("--index", help="dense index file (.fdpr) from `fastdpr index`")
    parser.add_argument("--bm25", metavar="DIR", help="BM25 index from `fastdpr bm25 build` (sparse and hybrid modes)")
    parser.add_argument("--corpus", required=True, help="passage file the indexes were built from")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; anything but loopback exposes the server to the network")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (also read from ${API_KEY_ENV}; "
                                          "an empty key is refused); /healthz and /readyz stay open")
    g = parser.add_argument_group("batching")
    g.add_argument("--max-batch", type=int, default=64,
                   help="questions per encoder and index call at most (1: one request at a time)")
    g.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long the first waiting question may wait for others to join its batch (it goes at "
                        "once when, by the recent gaps between arrivals, none is expected in time)")
    g.add_argument("--max-queue", type=int, default=1024,
                   help="questions waiting at most; beyond, requests get 503 with Retry-After")
    g.add_argument("--max-queue-ms", type=float, default=2000.0,
                   help="expected wait at most (questions waiting x seconds per question in recent batches at "
                        "least half full); beyond, "
                        "requests get 503 with Retry-After (0: no bound but --max-queue)")
    g = parser.add_argument_group("limits")
    g.add_argument("--max-k", type=int, default=1000, help="largest k a request may ask for")
    g.add_argument("--max-questions", type=int, default=256, help="questions per request at most")
    g.add_argument("--max-question-chars", type=int, default=2000, help="characters per question at most")
    g.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body size at most")
    g.add_argument("--max-results", type=int, default=10_000,
                   help="questions x k of one request at most (413 beyond): bounds the answer the server holds "
                        "until the client reads it")
    g.add_argument("--max-answer-bytes", type=int, default=32 << 20,
                   help="answer size at most (413 beyond: long passages)")
    g = parser.add_argument_group("connections")
    g.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds from a connection's (or request's) first byte wanted to the request's last, headers "
                        "and body; then 408 and the connection is closed")
    g.add_argument("--keep-alive", type=float, default=5.0, help="seconds a connection may stay idle between requests")
    g.add_argument("--write-timeout", type=float, default=30.0,
                   help="seconds an answer may wait without the client taking a byte of it; then the connection is "
                        "dropped, so a client that reads nothing holds at most --max-answer-bytes for this long")
    g.add_argument("--max-header-bytes", type=int, default=64 * 1024,
                   help="request line and headers, in bytes, at most (431 beyond)")
    g.add_argument("--max-headers", type=int, default=100, help="header lines per request at most (431 beyond)")
    g.add_argument("--max-connections", type=int, default=1000,
                   help="open connections at most; one more closes the oldest connection without a request in "
                        "progress, or gets 503 when all have one")
    g = parser.add_argument_group("retrieval")
    g.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16", "int8"],
                   help="question encoder precision (bf16: faster on CPUs that compute it natively)")
    g.add_argument("--fusion", choices=["linear", "linear-raw", "rrf"], default=None,
                   help="hybrid fusion (default: linear, or the one --alpha-file was tuned for)")
    g.add_argument("--alpha", type=float, help="hybrid weight of BM25 (default 1, or the one in --alpha-file)")
    g.add_argument("--alpha-file", help="JSON from `fastdpr tune-hybrid` holding the tuned alpha")
    g.add_argument("--rrf-k", type=float, default=60.0, help="reciprocal-rank fusion constant")
    g.add_argument("--k-union", type=int, default=1000, help="hybrid: passages taken from each side before fusing")
    g.add_argument("--device", help="torch device for question encoding (default: cuda when available)")
    g.add_argument("--threads", type=int, default=None,
                   help="threads of the worker that runs each batch: question encoder, index search, BM25 "
                        "(default and 0: all cores)")
    g.add_argument("--search-param", action="append", default=[], metavar="KEY=VALUE",
                   help="dense index search parameter, e.g. ef=256 or nprobe=32 (repeatable)")
    g.add_argument("--no-mmap", dest="mmap", action="store_false",
                   help="read the index's vector rows into RAM instead of memory-mapping them (default: mapped)")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])


_AT_LEAST_ONE = ("max_batch", "max_queue", "max_k", "max_questions", "max_question_chars", "max_body_bytes",
                 "max_results", "max_answer_bytes", "max_header_bytes", "max_headers", "max_connections", "k_union")
_POSITIVE_SECONDS = ("request_timeout", "keep_alive", "write_timeout")
_FINITE = ("max_wait_ms", "max_queue_ms", "rrf_k")  # >= 0 and finite (--alpha: search._fusion)


def _check(args) -> None:
    import math

    from fastdpr.errors import InputError

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name in _AT_LEAST_ONE:
        if getattr(args, name) < 1:
            raise InputError(f"{flag(name)} must be >= 1, got {getattr(args, name)}")
    for name in _POSITIVE_SECONDS:
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{flag(name)} must be a positive number of seconds, got {value}")
    for name in _FINITE:
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{flag(name)} must be a finite number >= 0, got {value}")
    if args.max_questions > args.max_queue:
        raise InputError(f"--max-queue ({args.max_queue}) must hold one full request (--max-questions "
                         f"{args.max_questions})")
    if args.threads is not None and args.threads < 0:
        raise InputError(f"--threads must be >= 0 (0: all cores), got {args.threads}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be 0..65535, got {args.port}")
    if bool(args.model) != bool(args.index):
        raise InputError("--model and --index go together (the dense side needs both)")
    if not args.model and not args.bm25:
        raise InputError("nothing to serve: give --model and --index, --bm25, or all three")
    _check_file_limit(args.max_connections)


def _check_file_limit(max_connections: int) -> None:
    """Each connection is a file descriptor: raise the soft limit if --max-connections needs it, so that the
    server refuses connections by its own rule rather than failing to accept them."""
    try:
        import resource
    except ImportError:  # not on this system: nothing to check
        return
    from fastdpr.errors import InputError

    need = max_connections + 256  # the model's, index's, corpus's and the libraries' own files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise InputError(f"--max-connections {max_connections} needs {need} open files, and this process may "
                             f"open at most {hard} (ulimit -n): give a smaller --max-connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def api_key_of(args) -> str | None:
    """--api-key, else $FASTDPR_API_KEY, else None. An empty key is an error rather than no key: an unset
    variable in a deployment would otherwise turn authentication off without a word."""
    import os

    from fastdpr.errors import InputError

    if args.api_key is not None:
        if not args.api_key:
            raise InputError("--api-key is empty: give a key, or leave the option out to serve without one")
        return args.api_key
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key:
        raise InputError(f"${API_KEY_ENV} is set but empty: give it a key, or unset it to serve without one")
    return key


def build_backend(args):
    """The retrievers the arguments name, loaded once, as a :class:`fastdpr.serve.Backend`."""
    from fastdpr.commands.search import _fusion, build_retriever
    from fastdpr.index.factory import resolve_index_path
    from fastdpr.serve.backend import Backend

    mode = "hybrid" if args.model and args.bm25 else ("dense" if args.model else "bm25")
    args.mode = mode  # what _fusion reads
    alpha, fusion = _fusion(args)
    # one encoder call per batch: the encoder's batch is the server's batch
    args.batch_size = max(args.max_batch, 1)
    threads = worker_threads(args.threads)
    args.threads = threads  # BM25's
    retriever = build_retriever(args, mode, alpha=alpha, method=fusion, rrf_k=args.rrf_k)
    parts = {"hybrid": {"hybrid": retriever}, "dense": {"dense": retriever}, "bm25": {"sparse": retriever}}[mode]
    dense = retriever.dense if mode == "hybrid" else (retriever if mode == "dense" else None)
    description = {"corpus": args.corpus}
    if dense is not None:
        dense.precision = args.precision
        dense.search_params.setdefault("threads", threads)
        description.update(model=args.model, index=args.index, index_type=repr(dense.index),
                           precision=args.precision, search_params=dense.search_params)
    if args.bm25:
        description["bm25"] = args.bm25
    if mode == "hybrid":
        description.update(fusion=fusion, alpha=alpha, k_union=args.k_union)
    description["threads"] = threads
    files = {"dense": [resolve_index_path(args.index)]} if args.index else {}
    return Backend(**parts, description=description, threads=threads, files=files)


def worker_threads(requested: int | None) -> int:
    """The batch worker's thread count: ``requested``, else all cores. Leaving a core to the event loop cost more
    than it gave: on 2 cores, 32 clients got 0.52x the in-process batched throughput with one worker thread and
    0.78x with two (``benchmarks/results/serve.md`` as of commit 790367d): the loop needs a core only in short
    bursts, and torch's OpenMP threads, idle between parallel regions, spin only briefly, then sleep."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return requested or cores


def run(args: argparse.Namespace) -> int:
    import ipaddress
    import sys

    from fastdpr.errors import InputError
    from fastdpr.serve import require_extra

    require_extra()
    _check(args)
    api_key = api_key_of(args)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and api_key is None:
        print(f"warning: serving on {args.host} without --api-key: anyone who reaches this address can search",
              file=sys.stderr)
    from fastdpr.serve.app import create_app
    from fastdpr.serve.protocol import ConnectionLimits
    from fastdpr.serve.requests import Limits
    from fastdpr.serve.server import bind
    from fastdpr.serve.server import run as serve

    try:  # before loading anything: a taken port is known in a millisecond
        sock = bind(args.host, args.port)
    except OSError as err:
        raise InputError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    with sock:
        backend = build_backend(args)
        limits = Limits(max_k=args.max_k, max_questions=args.max_questions,
                        max_question_chars=args.max_question_chars, max_body_bytes=args.max_body_bytes,
                        max_results=args.max_results, max_answer_bytes=args.max_answer_bytes)
        connections = ConnectionLimits(request_timeout_s=args.request_timeout, keep_alive_s=args.keep_alive,
                                       max_header_bytes=args.max_header_bytes, max_headers=args.max_headers,
                                       write_timeout_s=args.write_timeout, max_connections=args.max_connections)
        port = sock.getsockname()[1]

        def ready() -> None:
            print(f"fastdpr serve: ready on http://{args.host}:{port}", file=sys.stderr, flush=True)

        app = create_app(backend, limits=limits, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                         max_queue=args.max_queue, max_queue_ms=args.max_queue_ms or None, api_key=api_key,
                         on_ready=ready)
        print(f"fastdpr serve: {', '.join(backend.modes)} over {backend.passages()} passages on "
              f"http://{args.host}:{port}, warming up", file=sys.stderr, flush=True)
        serve(app, sock, log_level=args.log_level, connections=connections)
    print("fastdpr serve: stopped", file=sys.stderr, flush=True)
    return 0
