"""``fastdpr bm25``: build a Java-free BM25 index over passages, or search one.

    fastdpr bm25 build passages.tsv -o bm25/
    fastdpr bm25 search bm25/ nq-test.qa.csv -o bm25.nq-test.json -k 100      # DPR results with has_answer
    fastdpr bm25 search bm25/ nq-test.qa.csv -o bm25.nq-test.trec -k 1000
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bm25_command", metavar="{build,search}", required=True)
    build = sub.add_parser("build", help="index a passage file (DPR TSV, JSONL, BEIR corpus.jsonl)")
    build.add_argument("corpus", help="passage file")
    build.add_argument("-o", "--output", required=True, metavar="DIR", help="index directory to write")
    build.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (default 0.9, as Lucene/Anserini DPR runs)")
    build.add_argument("--b", type=float, default=0.4, help="BM25 b (default 0.4)")
    build.add_argument("--stemmer", default="porter",
                       help="PyStemmer algorithm: porter (default, as Lucene), english (Snowball), none")
    build.add_argument("--no-stopwords", action="store_true", help="keep English stopwords")
    build.add_argument("--skip-bad", action="store_true", help="skip (and count) malformed passage rows")
    search = sub.add_parser("search", help="retrieve top-k passages for a QA file")
    search.add_argument("index", metavar="DIR", help="index directory from `fastdpr bm25 build`")
    search.add_argument("qa", metavar="QA_FILE", help="questions (DPR CSV/TSV, JSONL, BEIR queries)")
    search.add_argument("-o", "--output", required=True, help="run file: .json (DPR results) or .trec")
    search.add_argument("-k", type=int, default=100, help="passages per question (default 100)")
    search.add_argument("--corpus", help="passage file (default: the one the index was built from); needed for "
                        "DPR results JSON")
    search.add_argument("--format", choices=["auto", "dpr", "trec"], default="auto")
    search.add_argument("--match", choices=["string", "regex"], default="string",
                        help="has_answer rule: DPR tokens (default) or regex answers (CuratedTREC)")
    search.add_argument("--threads", type=int, default=0, help="search threads (default 0 = all cores)")


def run(args: argparse.Namespace) -> int:
    if args.bm25_command == "build":
        return _build(args)
    return _search(args)


def _build(args) -> int:
    import os
    import time

    from fastdpr.data import iter_passages
    from fastdpr.sparse import BM25

    start = time.perf_counter()
    bm25 = BM25.from_corpus(
        iter_passages(args.corpus, skip_bad=args.skip_bad), k1=args.k1, b=args.b,
        stemmer=None if args.stemmer == "none" else args.stemmer,
        stopwords=None if args.no_stopwords else "english",
    )
    bm25.corpus_path = os.path.abspath(args.corpus)
    bm25.save(args.output)
    print(f"indexed {len(bm25)} passages in {time.perf_counter() - start:.1f}s -> {args.output}")
    return 0


def _search(args) -> int:
    import time

    from fastdpr.data import Corpus, iter_qa
    from fastdpr.errors import InputError
    from fastdpr.retrieve import SparseRetriever, run_format, search_to_run
    from fastdpr.sparse import BM25

    if args.k < 1:
        raise InputError(f"-k must be >= 1, got {args.k}")
    fmt = run_format(args.output, args.format)
    bm25 = BM25.load(args.index)
    qa = list(iter_qa(args.qa))
    corpus_path = args.corpus or bm25.corpus_path
    if fmt == "dpr" and not corpus_path:
        raise InputError("DPR results need passage texts: pass --corpus", path=args.index)
    corpus = _ListedIds(bm25) if fmt == "trec" and not corpus_path else Corpus.open(corpus_path)
    retriever = SparseRetriever(bm25, corpus, n_threads=args.threads or None, show_progress=False)
    if qa:
        bm25.search_rows([qa[0]["question"]], 1, threads=1)  # loads the compiled search: not part of the rate
    start = time.perf_counter()
    n = search_to_run(retriever, qa, args.output, args.k, fmt=fmt, match=args.match, tag="fastdpr-bm25",
                      show_progress=True)
    elapsed = time.perf_counter() - start
    print(f"searched {n} questions in {elapsed:.2f} s ({n / max(elapsed, 1e-9):.1f} q/s) -> {args.output}")
    return 0


class _ListedIds:
    """Stands in for a corpus when a TREC run needs ids only."""

    def __init__(self, bm25):
        self._n = len(bm25)

    def __len__(self):
        return self._n
