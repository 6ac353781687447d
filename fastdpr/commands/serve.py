"""``fastdpr serve``: dense, sparse and hybrid search over HTTP, concurrent requests batched together.

    fastdpr serve --model dpr/model --index index.fdpr --bm25 bm25/ --corpus passages.tsv --alpha-file alpha.json
    curl -s localhost:8000/search -H 'Content-Type: application/json' \\
        -d '{"questions": ["who won super bowl 50?"], "k": 5, "mode": "hybrid"}'
    fastdpr serve --bm25 bm25/ --corpus passages.tsv --port 9000          # BM25 only
    FASTDPR_API_KEY=secret fastdpr serve ...     # then: curl -H 'Authorization: Bearer secret' ...

Needs the serve extra: pip install 'fastdpr[serve]'. Binds to 127.0.0.1 unless --host says otherwise. SIGTERM (or
Ctrl-C) stops accepting, answers what is queued, and exits 0.
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
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (also read from ${API_KEY_ENV}); "
                                          "/healthz and /readyz stay open")
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
                   help="read the index's vector rows into RAM instead of memory-mapping them")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])


def _check(args) -> None:
    from fastdpr.errors import InputError

    for name in ("max_batch", "max_queue", "max_k", "max_questions", "max_question_chars", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_wait_ms < 0:
        raise InputError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    if not args.max_queue_ms >= 0:
        raise InputError(f"--max-queue-ms must be >= 0, got {args.max_queue_ms}")
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


def build_backend(args):
    """The retrievers the arguments name, loaded once, as a :class:`fastdpr.serve.Backend`."""
    from fastdpr.commands.search import _fusion, build_retriever
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
    return Backend(**parts, description=description, threads=threads)


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
    import os
    import sys

    from fastdpr.serve import require_extra

    require_extra()
    _check(args)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and api_key is None:
        print(f"warning: serving on {args.host} without --api-key: anyone who reaches this address can search",
              file=sys.stderr)
    from fastdpr.serve.app import create_app
    from fastdpr.serve.requests import Limits
    from fastdpr.serve.server import run as serve

    backend = build_backend(args)
    limits = Limits(max_k=args.max_k, max_questions=args.max_questions,
                    max_question_chars=args.max_question_chars, max_body_bytes=args.max_body_bytes)
    app = create_app(backend, limits=limits, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     max_queue=args.max_queue, max_queue_ms=args.max_queue_ms or None, api_key=api_key)
    print(f"fastdpr serve: {', '.join(backend.modes)} over {backend.passages()} passages on "
          f"http://{args.host}:{args.port} (ready once warm: GET /readyz)", file=sys.stderr, flush=True)
    serve(app, args.host, args.port, log_level=args.log_level)
    print("fastdpr serve: stopped", file=sys.stderr, flush=True)
    return 0
