"""``fastdpr evaluate``: top-k accuracy (DPR), MRR@k / nDCG@k / recall@k (qrels) of a run.

    fastdpr evaluate nq-test.results.json
    fastdpr evaluate run.trec --answers nq-test.qa.csv --corpus psgs.tsv --ks 1,5,20,100
    fastdpr evaluate run.trec --qrels qrels/test.tsv --ks 10,100 --json
    fastdpr evaluate runs/nq_test.hybrid.json             # the quickstart's compact runs, pyserini and BEIR runs too
    fastdpr evaluate curated.results.json --match regex --recompute
"""
from __future__ import annotations

import argparse

# fastdpr.data.runs.RUN_FORMATS, spelled out so that building the parser imports nothing heavy (a test keeps the
# two equal)
RUN_FORMATS = ("dpr", "pyserini", "trec", "beir", "compact")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run file: DPR retriever results, pyserini DPR run, TREC, BEIR or compact JSON "
                                    "(told apart by content)")
    parser.add_argument("--run-format", choices=["auto", *RUN_FORMATS],
                        default="auto", help="the run's format (default: detected from its content)")
    parser.add_argument("--qrels", help="relevance judgements (BEIR qrels TSV or TREC qrels) for MRR/nDCG/recall")
    parser.add_argument("--answers", metavar="QA_FILE",
                        help="questions with answers (DPR CSV/TSV, JSONL); matched to the run by question id")
    parser.add_argument("--corpus", help="passage file, to check answers in passages a run stores without text "
                                         "(TREC, BEIR, compact)")
    parser.add_argument("--ks", default="1,5,20,100", help="comma-separated cut-offs (default 1,5,20,100)")
    parser.add_argument("--match", choices=["string", "regex"], default="string",
                        help="answer matching: DPR tokens (default) or regex answers (CuratedTREC; re-checks every "
                             "passage)")
    parser.add_argument("--recompute", action="store_true",
                        help="recompute has_answer from passage text even where the run stores it")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")


def _parse_ks(text: str) -> list[int]:
    from fastdpr.errors import InputError

    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--ks must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise InputError(f"--ks must be positive integers, got {text!r}")
    return ks


def format_table(metrics: dict) -> str:
    width = max(len(k) for k in metrics)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    for name, value in metrics.items():
        shown = str(value) if isinstance(value, int) else f"{value:.4f}"
        lines.append(f"{name:<{width}}  {shown}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import json

    from fastdpr.data import attach_answers, attach_texts, read_qrels, read_run
    from fastdpr.errors import InputError
    from fastdpr.eval import evaluate_retrieval

    ks = _parse_ks(args.ks)
    results = read_run(args.run, fmt=args.run_format)
    if not results:
        raise InputError("the run holds no queries", args.run)
    if args.answers:
        attach_answers(results, args.answers)
    needs_text = args.answers and any(
        (args.recompute or args.match == "regex" or c.get("has_answer") is None) and not c.get("text")
        for r in results for c in r["ctxs"]
    )
    if needs_text:
        if not args.corpus:
            raise InputError("this run's passages have no text: give --corpus to check answers", args.run)
        attach_texts(results, args.corpus)
    qrels = read_qrels(args.qrels) if args.qrels else None
    if qrels is None and any(r.get("answers") is None for r in results) and not all(
        c.get("has_answer") is not None for r in results for c in r["ctxs"]
    ):
        raise InputError("nothing to evaluate against: give --answers (with --corpus for TREC runs) or --qrels",
                         args.run)
    if qrels is None and all(r.get("answers") is not None and not r["answers"] for r in results):
        # a question file without answers gives a run whose every passage "has no answer": top-k 0.0, silently
        raise InputError("no question of this run has an answer (was the question file without answers?): "
                         "give --answers with a file that has them, or --qrels", args.answers or args.run)
    try:
        metrics = evaluate_retrieval(results, ks=ks, qrels=qrels, mode=args.match,
                                     recompute=args.recompute or args.match == "regex")
    except ValueError as exc:
        raise InputError(str(exc), args.run) from None
    print(json.dumps(metrics, indent=2) if args.json else format_table(metrics))
    return 0
