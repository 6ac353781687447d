"""``fastdpr tune-hybrid``: choose the hybrid weight alpha (score = dense + alpha * bm25) on a dev set.

    fastdpr tune-hybrid nq-dev.qa.csv --model model/ --index index/ --bm25 bm25/ --corpus psgs.tsv -o alpha.json
    fastdpr search nq-test.qa.csv --mode hybrid ... --alpha-file alpha.json

The default fusion normalises both score lists and works untuned with alpha 1; tuning can still gain a little, and
alpha 1 is kept unless another weight does better on the dev set.
Raw linear fusion (``--fusion linear-raw``) needs it. The file records the fusion, and ``search`` uses it.
Tune on a dev split, never on the test questions.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fastdpr.commands.search import add_retriever_arguments

    parser.add_argument("qa", metavar="DEV_QA_FILE", help="dev questions with answers")
    add_retriever_arguments(parser)
    parser.add_argument("-o", "--output", required=True, help="JSON file to write the chosen alpha to")
    parser.add_argument("--grid", help="comma-separated alphas to try (default: 0 and 0.001 .. 100, log-spaced)")
    parser.add_argument("--at", type=int, default=20, help="maximise top-k accuracy at this k (default 20)")
    parser.add_argument("--fusion", choices=["linear", "linear-raw"], default="linear",
                        help="fusion to tune: linear = min-max normalised scores (default), linear-raw = raw scores")


def run(args: argparse.Namespace) -> int:
    import sys

    from fastdpr.atomic import write_json
    from fastdpr.commands.search import build_retriever
    from fastdpr.data import iter_qa
    from fastdpr.errors import InputError
    from fastdpr.retrieve import DEFAULT_ALPHA_GRID
    from fastdpr.retrieve.hybrid import DEFAULT_ALPHA

    grid = DEFAULT_ALPHA_GRID
    if args.grid:
        try:
            grid = [float(x) for x in args.grid.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--grid must be comma-separated numbers, got {args.grid!r}") from None
        if not grid:
            raise InputError("--grid is empty")
    if args.at < 1:
        raise InputError("--at must be >= 1")
    qa = [q for q in iter_qa(args.qa) if q["answers"]]
    if not qa:
        raise InputError("no dev questions with answers", path=args.qa)
    hybrid = build_retriever(args, "hybrid", method=args.fusion)
    alpha = hybrid.tune_alpha([q["question"] for q in qa], [q["answers"] for q in qa], grid=grid, k=args.at,
                              match=args.match, show_progress=True)
    key = f"top{args.at}"
    scores = {row["alpha"]: row[key] for row in hybrid.tuning_table}
    # normalised fusion works untuned at alpha 1: leave it only for a weight that does better on the dev set (the
    # smallest of tied weights would be 0, i.e. dense alone, whenever top-k is saturated)
    if args.fusion == "linear" and scores.get(DEFAULT_ALPHA, -1.0) == max(scores.values()):
        alpha = DEFAULT_ALPHA
    if len(set(scores.values())) == 1:
        print(f"warning: every alpha gives the same {key} ({scores[alpha]:.4f}) on these {len(qa)} dev questions, "
              f"so they cannot choose one; more dev questions or a smaller --at can", file=sys.stderr)
    for row in hybrid.tuning_table:
        mark = "  <- chosen" if row["alpha"] == alpha else ""
        print(f"alpha {row['alpha']:>10.4g}  {key} {row[key]:.4f}{mark}")
    write_json(args.output, {"alpha": alpha, "fusion": args.fusion, "metric": key, "k_union": args.k_union,
                             "dev_questions": len(qa), "dev_file": args.qa, "table": hybrid.tuning_table})
    print(f"alpha = {alpha:g} -> {args.output}")
    return 0
