"""The ``fastdpr serve`` command as a user runs it: a separate process on a free loopback port, answering as the
retrievers built from the same files do, and SIGTERM draining what is queued before exiting 0."""
import concurrent.futures as cf
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastdpr import cli
from fastdpr.serve import Client
from fastdpr.serve.server import loopback_socket

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tiny_models import tiny_biencoder

    from fastdpr.data import Corpus
    from fastdpr.index import build_index

    tmp = tmp_path_factory.mktemp("serve_cli")
    passages = [json.loads(line) for line in open(DATA / "sparse_squad_passages.jsonl", encoding="utf-8")][:40]
    with open(tmp / "passages.jsonl", "w", encoding="utf-8") as fh:
        for p in passages:
            fh.write(json.dumps(p) + "\n")
    model = tiny_biencoder(tmp / "towers")
    model.save_pretrained(tmp / "model")
    corpus = Corpus.open(tmp / "passages.jsonl")
    build_index(model.encode_passages([corpus[i] for i in range(len(corpus))], batch_size=16), "flat").save(
        tmp / "index")
    assert cli.main(["bm25", "build", str(tmp / "passages.jsonl"), "-o", str(tmp / "bm25")]) == 0
    (tmp / "alpha.json").write_text(json.dumps({"alpha": 0.5, "fusion": "linear"}))
    questions = [json.loads(line)["question"]
                 for line in open(DATA / "sparse_squad_questions.jsonl", encoding="utf-8")][:8]
    return tmp, questions


def _args(tmp):
    return ["--model", str(tmp / "model"), "--index", str(tmp / "index"), "--bm25", str(tmp / "bm25"),
            "--corpus", str(tmp / "passages.jsonl"), "--alpha-file", str(tmp / "alpha.json"), "--k-union", "20",
            "--threads", "1"]


def _parse(argv):
    import argparse

    from fastdpr.commands.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@contextlib.contextmanager
def _dense_server(tmp, *extra):
    """``fastdpr serve`` of the model, index and corpus (no BM25: its first search compiles) in a process of its
    own on a free port, ready; yields (process, client, port), and kills what is still running at the end."""
    dense_args = _args(tmp)[:4] + _args(tmp)[6:8]
    with loopback_socket() as sock:
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "FASTDPR_API_KEY"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    proc = subprocess.Popen([sys.executable, "-m", "fastdpr", "serve", *dense_args, "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        client, deadline = Client(f"http://127.0.0.1:{port}", timeout=30), time.monotonic() + 120
        while not client.ready():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.1)
        yield proc, client, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
def test_serve_answers_as_search_does_and_sigterm_drains_then_exits_zero(files):
    from fastdpr.commands.search import build_retriever

    tmp, questions = files
    with _dense_server(tmp, "--max-wait-ms", "800") as (proc, client, port):
        about = client.describe()
        with cf.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client.search, questions[i:i + 2], 5) for i in range(0, 8, 2)]
            time.sleep(0.3)  # the four wait in the queue (--max-wait-ms 800) when the signal comes
            proc.send_signal(signal.SIGTERM)
            answers = [f.result(timeout=60) for f in futures]
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped" in err and f"ready on http://127.0.0.1:{port}" in err  # said at the default log level
    assert about["modes"] == ["dense"] and about["default_mode"] == "dense" and about["passages"] == 40
    args = _parse(_args(tmp)[:4] + _args(tmp)[6:8])
    args.batch_size = 64
    want = build_retriever(args, "dense").retrieve(questions, 5)
    got = [hits for answer in answers for hits in answer]
    assert [[p["id"] for p in g] for g in got] == [[p["id"] for p in w] for w in want]


def test_the_backend_holds_what_the_arguments_name(files):
    from fastdpr.commands.serve import build_backend

    tmp, _ = files
    backend = build_backend(_parse([*_args(tmp), "--max-batch", "32", "--precision", "bf16"]))
    hybrid = backend.retrievers["hybrid"]
    assert backend.modes == ("dense", "sparse", "hybrid") and backend.default_mode == "hybrid"
    assert (hybrid.alpha, hybrid.method, hybrid.k_union) == (0.5, "linear", 20)
    assert backend.retrievers["dense"] is hybrid.dense and backend.retrievers["sparse"] is hybrid.sparse
    assert hybrid.dense.batch_size == 32 and hybrid.dense.precision == "bf16"
    assert backend.description["alpha"] == 0.5 and backend.passages() == 40
    sparse_only = build_backend(_parse(["--bm25", str(tmp / "bm25"), "--corpus", str(tmp / "passages.jsonl")]))
    assert sparse_only.modes == ("sparse",) and not sparse_only.can_encode


def test_the_worker_takes_every_core_unless_told(monkeypatch):
    from fastdpr.commands.serve import worker_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert worker_threads(None) == 3 and worker_threads(0) == 3 and worker_threads(1) == 1 and worker_threads(5) == 5


# (option, value, what the error says), each given to a BM25-only server
BAD_VALUES = [
    ("--max-batch", "0", "--max-batch must be >= 1"), ("--k-union", "0", "--k-union must be >= 1"),
    ("--max-results", "0", "--max-results must be >= 1"), ("--max-headers", "0", "--max-headers must be >= 1"),
    ("--max-wait-ms", "-1", "--max-wait-ms must be a finite number >= 0"),
    ("--max-wait-ms", "nan", "--max-wait-ms must be a finite number >= 0"),
    ("--max-queue-ms", "-5", "--max-queue-ms must be a finite number >= 0"),
    ("--max-queue-ms", "nan", "--max-queue-ms must be a finite number >= 0"),
    ("--rrf-k", "inf", "--rrf-k must be a finite number >= 0"),
    ("--request-timeout", "0", "--request-timeout must be a positive number"),
    ("--write-timeout", "nan", "--write-timeout must be a positive number"),
    ("--max-connections", "100000000", "give a smaller --max-connections"),
    ("--api-key", "", "--api-key is empty"),
    ("--alpha", "nan", "--alpha must be a finite number"), ("--alpha", "inf", "--alpha must be a finite number"),
]


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "x.tsv"], "nothing to serve"),
    (["--corpus", "x.tsv", "--model", "m"], "--model and --index go together"),
    (["--corpus", "x.tsv", "--bm25", "b", "--max-questions", "64", "--max-queue", "8"], "--max-queue (8)"),
    *((["--corpus", "x.tsv", "--bm25", "b", "--port", "0", option, value], message)
      for option, value, message in BAD_VALUES),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastdpr serve: error:") and message in err and "\n" not in err


def test_a_missing_index_file_is_a_one_line_error(files, capsys):
    tmp, _ = files
    assert cli.main(["serve", *_args(tmp)[:2], "--index", str(tmp / "missing.fdpr"), *_args(tmp)[4:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastdpr serve: error:") and "\n" not in err


def test_an_empty_key_in_the_environment_is_an_error_not_no_key(monkeypatch, capsys):
    monkeypatch.setenv("FASTDPR_API_KEY", "")
    assert cli.main(["serve", "--corpus", "x.tsv", "--bm25", "b", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastdpr serve: error:") and "$FASTDPR_API_KEY is set but empty" in err


def test_a_taken_port_is_a_one_line_error_before_anything_loads(capsys):
    with loopback_socket() as sock:
        sock.listen()
        port = sock.getsockname()[1]
        # --bm25 names nothing: the port is checked first, so that is never opened
        assert cli.main(["serve", "--corpus", "x.tsv", "--bm25", "missing", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fastdpr serve: error: cannot listen on 127.0.0.1:{port}:") and "\n" not in err
    assert "serving" not in err and "Errno" not in err


@pytest.mark.slow
def test_ctrl_c_drains_and_exits_zero_as_help_says(files):
    tmp, _ = files
    with _dense_server(tmp) as (proc, _, _):
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "ready on" in err and "stopped" in err and "Traceback" not in err
