"""``fastdpr read``: extract an answer for each question from its retrieved passages; EM/F1 when answers are known.

    fastdpr read test.results.json --reader reader/ --top-k 10 --out answers.json [--precision bf16]

The results file is what ``fastdpr search`` writes (DPR JSON, ``-o run.json``). Rows of all questions are read
together, sorted by length, packed without padding; ``--precision bf16`` is several times faster on CPUs with
AMX/AVX512-BF16 (recent Xeons) and costs no measurable accuracy (benchmarks/results/reader.md at c97483c).
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="DPR retriever-results JSON (question, answers, ctxs)")
    parser.add_argument("--reader", required=True, help="reader directory (from train-reader)")
    parser.add_argument("-o", "--out", required=True, help="predictions JSON")
    parser.add_argument("--top-k", type=int, default=10, help="passages read per question")
    parser.add_argument("--batch-size", type=int, default=64, help="question-passage rows per forward pass")
    parser.add_argument("--precision", default="auto",
                        help="auto (fp32 on a CPU, fp16 on CUDA), fp32, bf16, fp16 (CUDA) or int8 (CPU)")
    parser.add_argument("--select", choices=["passage", "joint", "span"], default="passage",
                        help="how the answer is chosen among the passages: passage (DPR: best passage by selection "
                             "logit, then its best span), joint (selection + span logits), span (best span anywhere)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    from fastdpr.atomic import write_json
    from fastdpr.reader import Reader, evaluate_answers
    from fastdpr.reader.io import load_retriever_results

    from fastdpr.errors import InputError

    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    records = load_retriever_results(args.results)
    if not records:
        raise InputError("no questions in these retriever results: nothing to read", path=args.results)
    reader = Reader.from_pretrained(args.reader)
    if args.device:
        reader.to(args.device)
    predictions = reader.read(
        [r["question"] for r in records], [r["ctxs"] for r in records], top_k=args.top_k,
        batch_size=args.batch_size, precision=args.precision, show_progress=None if not args.quiet else False,
        select=args.select,
    )
    out = [{"question": r["question"], "answers": r.get("answers", []), **p} for r, p in zip(records, predictions)]
    metrics = evaluate_answers([p["answer"] for p in predictions], [r.get("answers", []) for r in records])
    write_json(args.out, {"metrics": metrics, "predictions": out})
    print(f"EM {metrics['em']:.4f}  F1 {metrics['f1']:.4f}  over {metrics['n']} questions -> {args.out}")
    return 0
