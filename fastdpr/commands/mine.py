"""``fastdpr mine``: positives and answer-aware BM25 hard negatives for training.

    fastdpr mine nq-train.qa.csv --corpus psgs.tsv --bm25 bm25/ -o nq-train.dpr.json --n-hard 30
    fastdpr mine nq-train.json   --corpus psgs.tsv --bm25 bm25/ -o nq-train.tevatron.jsonl --format tevatron

A DPR biencoder JSON / Tevatron JSONL input keeps its positives (gold passages); a plain QA file gets the
highest-ranked BM25 passage containing an answer as its positive.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("qa", metavar="QA_FILE",
                        help="questions with answers (DPR CSV/TSV, JSONL) or training records with gold positives")
    parser.add_argument("--corpus", required=True, help="passage file the BM25 index was built from")
    parser.add_argument("--bm25", required=True, metavar="DIR", help="index from `fastdpr bm25 build`")
    parser.add_argument("-o", "--output", required=True, help="training file to write")
    parser.add_argument("--n-hard", type=int, default=30, help="hard negatives kept per question (default 30)")
    parser.add_argument("--n-random", type=int, default=0, help="random negatives per question (default 0)")
    parser.add_argument("--depth", type=int, default=100,
                        help="BM25 passages searched per question (default 100); no positive there = dropped")
    parser.add_argument("--format", choices=["dpr", "tevatron"], default="dpr",
                        help="output: DPR biencoder JSON (default) or Tevatron JSONL")
    parser.add_argument("--match", choices=["string", "regex"], default="string",
                        help="answer matching: DPR tokens (default) or regex answers (CuratedTREC)")
    parser.add_argument("--threads", type=int, default=0, help="BM25 search threads (default 0 = all cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random negatives")


def _is_training_file(path: str) -> bool:
    """DPR biencoder JSON arrays and JSONL lines with positives are training records, not bare questions."""
    import json

    from fastdpr.data._io import first_char, open_binary

    if first_char(path) == "[":
        return True
    with open_binary(path) as fh:
        line = fh.readline().decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and ("positive_ctxs" in obj or "positive_passages" in obj)


def run(args: argparse.Namespace) -> int:
    import time

    from fastdpr.data import Corpus, iter_qa, read_training, write_dpr_biencoder, write_tevatron
    from fastdpr.errors import InputError
    from fastdpr.sparse import BM25, mine_hard_negatives

    for name in ("n_hard", "n_random"):
        if getattr(args, name) < 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0")
    if args.depth < 1:
        raise InputError("--depth must be >= 1")
    bm25 = BM25.load(args.bm25)
    corpus = Corpus.open(args.corpus)
    if len(corpus) != len(bm25):
        raise InputError(f"the corpus has {len(corpus)} passages but the BM25 index {len(bm25)}: built from "
                         "another file?", path=args.bm25)
    records = read_training(args.qa) if _is_training_file(args.qa) else iter_qa(args.qa)
    start = time.perf_counter()
    mined = mine_hard_negatives(records, bm25, corpus, n_hard=args.n_hard, n_random=args.n_random,
                                depth=args.depth, match=args.match, n_threads=args.threads or None,
                                seed=args.seed, show_progress=True)
    write = write_tevatron if args.format == "tevatron" else write_dpr_biencoder
    write(args.output, mined)
    print(f"mined in {time.perf_counter() - start:.1f}s -> {args.output}")
    print(mined.stats)
    return 0
