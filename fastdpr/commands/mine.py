"""``fastdpr mine``: positives and answer-aware BM25 hard negatives for training.

    fastdpr mine nq-train.qa.csv --corpus psgs.tsv --bm25 bm25/ -o nq-train.dpr.json --n-hard 30
    fastdpr mine nq-train.json   --corpus psgs.tsv --bm25 bm25/ -o nq-train.tevatron.jsonl --format tevatron

A DPR biencoder JSON / Tevatron JSONL input keeps its positives (gold passages); a plain QA file gets the
highest-ranked BM25 passage containing an answer as its positive. Gold ids in a QA file (``gold_ids``,
``gold_passage_ids``) may name documents: when the corpus was made by ``fastdpr split``, its document map
(``<corpus>.docmap.tsv``, found by itself, or ``--docmap``) turns each into the document's passages that contain
an answer. Gold ids that match nothing are counted and warned about.
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
    parser.add_argument("--docmap", help="document map of the corpus from `fastdpr split` (default: "
                                         "<corpus>.docmap.tsv when it exists), to map gold document ids to passages")


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
    import sys
    import time
    import warnings

    from fastdpr.data import Corpus, iter_qa, read_training, write_dpr_biencoder, write_tevatron
    from fastdpr.errors import InputError
    from fastdpr.sparse import BM25, mine_hard_negatives
    from fastdpr.sparse.mining import GoldIdsNotFound

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
    training = _is_training_file(args.qa)

    def records():
        return read_training(args.qa) if training else iter_qa(args.qa)

    if next(iter(records()), None) is None:
        raise InputError("no questions in this file: nothing to mine", path=args.qa)

    doc_map, docmap_file = _doc_map(args, records)
    start = time.perf_counter()
    mined = mine_hard_negatives(records(), bm25, corpus, n_hard=args.n_hard, n_random=args.n_random,
                                depth=args.depth, match=args.match, threads=args.threads or None,
                                seed=args.seed, show_progress=True, doc_map=doc_map)
    write = write_tevatron if args.format == "tevatron" else write_dpr_biencoder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GoldIdsNotFound)  # said below, louder, with what to do about it
        write(args.output, mined)
    print(f"mined in {time.perf_counter() - start:.1f}s -> {args.output}")
    print(mined.stats)
    stats = mined.stats
    if stats.gold_not_in_corpus:
        hint = (f"the document map {docmap_file} names none of them either" if docmap_file else
                "no document map was found: if the corpus was made by `fastdpr split`, pass --docmap "
                f"{args.corpus}.docmap.tsv")
        print(f"WARNING: {stats.gold_not_in_corpus} gold ids are not passages of {args.corpus} ({hint}); those "
              "questions got BM25 positives instead of their gold passages", file=sys.stderr)
    return 0


def _doc_map(args, records) -> tuple[dict | None, str | None]:
    """The document map restricted to the documents the QA file names (a corpus-sized map is not loaded)."""
    import os

    from fastdpr.data.split import docmap_path, read_docmap
    from fastdpr.errors import InputError
    from fastdpr.sparse.mining import gold_ids

    path = args.docmap or (str(docmap_path(args.corpus)) if os.path.exists(docmap_path(args.corpus)) else None)
    if path is None:
        return None, None
    if not os.path.exists(path):
        raise InputError("no such document map", path)
    wanted = {g for rec in records() for g in gold_ids(rec)}
    return (read_docmap(path, only=wanted) if wanted else {}), path
