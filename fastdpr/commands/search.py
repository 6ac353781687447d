"""``fastdpr search``: retrieve passages for a QA file with a dense model, BM25, or both fused.

    fastdpr search nq-test.qa.csv --mode dense  --model model/ --index index/ --corpus psgs.tsv -o dense.json
    fastdpr search nq-test.qa.csv --mode bm25   --bm25 bm25/ --corpus psgs.tsv -o bm25.trec -k 1000
    fastdpr search nq-test.qa.csv --mode hybrid --model model/ --index index/ --bm25 bm25/ --corpus psgs.tsv \\
        -o hybrid.json                        # normalised fusion, alpha 1: no tuning needed
    fastdpr search nq-test.qa.csv --mode hybrid ... --alpha-file alpha.json -o hybrid.json   # alpha tuned on dev

Questions without ids in their file are numbered from 0 in file order (header excluded), in every run format.
"""
from __future__ import annotations

import argparse

# fastdpr.data.runs.RUN_FORMATS, spelled out so that building the parser imports nothing heavy (a test keeps the
# two equal)
RUN_FORMATS = ("dpr", "pyserini", "trec", "beir", "compact")

DEFAULT_ALPHA = 1.0  # fastdpr.retrieve.hybrid.DEFAULT_ALPHA, kept here so that the CLI starts without numpy


def add_retriever_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared with ``fastdpr tune-hybrid``."""
    parser.add_argument("--model", help="bi-encoder directory (fastdpr, Hugging Face or sentence-transformers)")
    parser.add_argument("--index", help="dense index file (.fdpr) from `fastdpr index`")
    parser.add_argument("--bm25", metavar="DIR", help="BM25 index from `fastdpr bm25 build`")
    parser.add_argument("--corpus", required=True, help="passage file the indexes were built from")
    parser.add_argument("--k-union", type=int, default=1000,
                        help="hybrid: passages taken from each side before fusing (default 1000)")
    parser.add_argument("--batch-size", type=int, default=64, help="question encoding batch size (default 64)")
    parser.add_argument("--device", help="torch device for question encoding (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=0, help="BM25 search threads (default 0 = all cores)")
    parser.add_argument("--search-param", action="append", default=[], metavar="KEY=VALUE",
                        help="dense index search parameter, e.g. ef=256 or nprobe=32 (repeatable)")
    parser.add_argument("--mmap", action="store_true",
                        help="memory-map the index's vector rows instead of reading them into RAM (an IVF-PQ "
                             "index with store=fp16 then keeps only its codes in RAM; the rows come from the page "
                             "cache)")
    parser.add_argument("--allow-other-model", action="store_true",
                        help="search with a model other than the one that encoded the index (refused otherwise: "
                             "vectors of another model of the same size retrieve nonsense)")
    parser.add_argument("--match", choices=["string", "regex"], default="string",
                        help="has_answer rule: DPR tokens (default) or regex answers (CuratedTREC)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("qa", metavar="QA_FILE", help="questions (DPR CSV/TSV, JSONL, BEIR queries)")
    parser.add_argument("--mode", choices=["dense", "bm25", "hybrid"], default="dense")
    add_retriever_arguments(parser)
    parser.add_argument("-o", "--output", required=True,
                        help="run file: .json (DPR results) or .trec, or any --format")
    parser.add_argument("-k", type=int, default=100, help="passages per question (default 100)")
    parser.add_argument("--format", choices=["auto", *RUN_FORMATS], default="auto",
                        help="run format (default: from the extension, .json = dpr); pyserini = pyserini's DPR run "
                             "(what its evaluate_dpr_retrieval reads), beir = {qid: {docid: score}}, "
                             "compact = {qid: [[docid, score, has_answer]]}")
    parser.add_argument("--fusion", "--method", dest="fusion", choices=["linear", "linear-raw", "rrf"], default=None,
                        help="hybrid fusion: linear = per-question min-max normalised dense + alpha*bm25, needs no "
                             "tuning (default); linear-raw = raw scores, alpha must be tuned (tune-hybrid); rrf = "
                             "reciprocal-rank fusion")
    parser.add_argument("--alpha", type=float,
                        help=f"hybrid weight of BM25 (default {DEFAULT_ALPHA}, or the one in --alpha-file)")
    parser.add_argument("--alpha-file", help="JSON from `fastdpr tune-hybrid` holding the tuned alpha")
    parser.add_argument("--rrf-k", type=float, default=60.0, help="reciprocal-rank fusion constant (default 60)")


def _search_params(items: list[str]) -> dict:
    from fastdpr.errors import InputError
    from fastdpr.index.spec import parse_value

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--search-param wants KEY=VALUE, got {item!r}")
        params[key] = parse_value(value)
    return params


def build_retriever(args, mode: str, alpha: float = DEFAULT_ALPHA, method: str = "linear", rrf_k: float = 60.0):
    """The retriever ``mode`` names, from the command-line arguments (shared with tune-hybrid)."""
    from fastdpr.data import Corpus
    from fastdpr.errors import InputError
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever

    needs = {"dense": ("model", "index"), "bm25": ("bm25",), "hybrid": ("model", "index", "bm25")}[mode]
    missing = [f"--{name}" for name in needs if not getattr(args, name)]
    if missing:
        raise InputError(f"--mode {mode} needs {', '.join(missing)}")
    corpus = Corpus.open(args.corpus)
    dense = sparse = None
    if "bm25" in needs:
        from fastdpr.sparse import BM25

        bm25 = BM25.load(args.bm25)
        if len(bm25) != len(corpus):
            raise InputError(f"the BM25 index has {len(bm25)} passages but the corpus {len(corpus)}", path=args.bm25)
        sparse = SparseRetriever(bm25, corpus, threads=args.threads or None)
    if "model" in needs:
        from fastdpr.index import load_index
        from fastdpr.models import BiEncoder

        model = BiEncoder.from_pretrained(args.model)
        model.eval()
        index = load_index(args.index, mmap=getattr(args, "mmap", False))
        if len(index) != len(corpus):
            raise InputError(f"the index has {len(index)} vectors but the corpus {len(corpus)} passages",
                             path=args.index)
        dense = DenseRetriever(model, index, corpus, batch_size=args.batch_size, device=args.device,
                               search_params=_search_params(args.search_param),
                               allow_other_model=getattr(args, "allow_other_model", False))
    if mode == "dense":
        return dense
    if mode == "bm25":
        return sparse
    if args.k_union < 1:
        raise InputError("--k-union must be >= 1")
    return HybridRetriever(dense, sparse, alpha=alpha, k_union=args.k_union, method=method, rrf_k=rrf_k)


def _fusion(args) -> tuple[float, str]:
    """(alpha, fusion) from --alpha / --alpha-file / --fusion. A tuned alpha belongs to the fusion it was tuned
    for: files from before fusions were named say "method": "linear", which was raw linear fusion."""
    import json
    import math
    import sys

    from fastdpr.errors import InputError

    if args.alpha is not None and args.alpha_file:
        raise InputError("give --alpha or --alpha-file, not both")
    alpha, tuned_for = args.alpha, None
    if args.alpha_file:
        try:
            with open(args.alpha_file, encoding="utf-8") as fh:
                tuned = json.load(fh)
            alpha = float(tuned["alpha"])
            tuned_for = tuned.get("fusion") or {"linear": "linear-raw"}.get(tuned.get("method"), tuned.get("method"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise InputError(f"no tuned alpha readable here ({err})", path=args.alpha_file) from None
        if args.fusion and tuned_for and args.fusion != tuned_for:
            raise InputError(f"this alpha was tuned for --fusion {tuned_for}, not {args.fusion}", path=args.alpha_file)
    if alpha is not None and not math.isfinite(alpha):
        raise InputError(f"{'the tuned alpha' if args.alpha_file else '--alpha'} must be a finite number, got {alpha}",
                         path=args.alpha_file or None)
    fusion = args.fusion or tuned_for or "linear"
    if args.mode == "hybrid" and fusion == "linear-raw" and alpha is None:
        print(f"warning: raw linear fusion with the untuned alpha {DEFAULT_ALPHA}: dense and BM25 scores lie on "
              "different scales, so one side may swamp the other. Tune alpha on a dev set (fastdpr tune-hybrid) or "
              "use the default --fusion linear, which normalises both.", file=sys.stderr)
    if args.mode == "hybrid" and fusion == "rrf" and alpha is not None:
        print("warning: reciprocal-rank fusion has no weight: --alpha is ignored", file=sys.stderr)
    return (DEFAULT_ALPHA if alpha is None else alpha), fusion


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from fastdpr.data import iter_qa
    from fastdpr.errors import InputError
    from fastdpr.retrieve import run_format, search_to_run

    if args.k < 1:
        raise InputError(f"-k must be >= 1, got {args.k}")
    fmt = run_format(args.output, args.format)
    alpha, fusion = _fusion(args)
    opened = time.perf_counter()
    retriever = build_retriever(args, args.mode, alpha=alpha, method=fusion, rrf_k=args.rrf_k)
    qa = list(iter_qa(args.qa))
    if not qa:
        raise InputError("no questions in this file: nothing to search", path=args.qa)
    if not any(q.get("answers") for q in qa):
        print(f"warning: {args.qa}: no question has answers, so the run's has_answer is false everywhere and "
              "`fastdpr evaluate` needs --answers from another file, or --qrels", file=sys.stderr)
    corpus_size = len(retriever.corpus)
    if args.k > corpus_size:  # memory grows with k, not with the corpus: more than every passage is never found
        print(f"note: -k {args.k} is more than the corpus holds: {corpus_size} passages a question",
              file=sys.stderr)
    k = min(args.k, corpus_size)
    # one throw-away question loads what a first call loads (compiled kernels, caches), so that the rate below
    # is the rate of searching, not of starting up
    retriever.search([qa[0]["question"]], 1)
    start = time.perf_counter()
    n = search_to_run(retriever, qa, args.output, k, fmt=fmt, match=args.match, tag=f"fastdpr-{args.mode}",
                      show_progress=True)
    elapsed = time.perf_counter() - start
    print(f"searched {n} questions ({args.mode}) in {elapsed:.2f} s ({n / max(elapsed, 1e-9):.1f} q/s, answers "
          f"checked and the run written) -> {args.output}; opening the indexes took {start - opened:.1f} s")
    return 0
