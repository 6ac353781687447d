"""Does training help, and do large batches help? The packaged MiniLM fine-tuned with fastdpr's recipe
(``fastdpr.train.recipe``) at several batch sizes on the same training examples (new Wikipedia and QED training
questions), evaluated on the quickstart's five test sets (NQ test, SQuAD, new Wikipedia test, and the unseen
domains Reddit and Amazon) over its corpus of every paragraph, against BM25 and the starting model on the same
corpus.

    python benchmarks/quality_bench.py                 # batches 16, 128, 1024 at 2,048 examples seen (≤ 60 min)
    python benchmarks/quality_bench.py --quick         # a small version for `fastdpr bench --quick`

Every batch size sees the same examples once (DPR Table 3 compares batch sizes at equal epochs). Batches above
``--chunk`` questions go through GradCache with that chunk, so the batch of 1,024 trains in the memory of the
batch of 16; each training runs in its own process and its peak resident memory is reported. The learning rate
follows the square-root rule from the recipe's (lr · sqrt(batch / 32)), the usual scaling for Adam.

Writes ``quality.json``, ``quality.md`` and ``quality.png`` in ``--out``; the corpus, BM25, mined examples, models
and vectors stay in ``--work`` (default: the fastdpr cache), so an interrupted run resumes stage by stage.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import exit_if_data_unavailable, markdown_table, write_results  # noqa: E402

from fastdpr.quickstart.report import DATASETS as RETRIEVAL_SETS  # noqa: E402
from fastdpr.quickstart.report import TITLES, UNSEEN  # noqa: E402


def _config(args):
    from fastdpr.quickstart.config import QuickstartConfig

    if args.quick:
        sizes = dict(test_questions=100, dev_questions=20, max_passages=600, dev_examples=32)
    else:
        sizes = dict(test_questions=1000, dev_questions=100, max_passages=args.max_passages, dev_examples=128)
    return QuickstartConfig(out=str(args.work), show_progress=False, train_examples=args.examples,
                            chunk_size=args.chunk, eval_times=2, **sizes)


def _train_in_child(config, batch: int, lr: float, queue) -> None:
    """One training run in its own process, so that its peak resident memory is its own."""
    import resource

    import torch

    from fastdpr.quickstart import experiment as ex

    torch.set_num_threads(config.threads or torch.get_num_threads())
    ws = ex.Workspace(config, Path(config.out), _cache(), log=lambda line: None)
    summary = ex.stage_train(ws, name=f"train_b{batch}", batch_size=batch, lr=lr)
    summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(summary)


def _train(config, batch: int, lr: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_train_in_child, args=(config, batch, lr, queue))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"training at batch {batch} failed (exit {child.exitcode})")
    return queue.get(timeout=10)


def _cache() -> Path:
    from fastdpr.data import sources

    return sources.default_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few minutes")
    parser.add_argument("--out", default=None, help="results folder (default: benchmarks/results)")
    parser.add_argument("--work", type=Path, default=None,
                        help="intermediate files (default: <fastdpr cache>/quality_bench[_quick])")
    parser.add_argument("--examples", type=int, default=None, help="training examples seen by every batch size")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--chunk", type=int, default=16, help="GradCache chunk: the memory of this batch size")
    parser.add_argument("--base-lr", type=float, default=None,
                        help="learning rate at batch 32, scaled by the sqrt rule (default: the recipe's)")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="corpus size (default: every paragraph; the test questions' paragraphs always kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the results from the stages already finished in --work (an unfinished batch "
                             "size is reported as such), running nothing")
    args = parser.parse_args()
    args.examples = args.examples or (64 if args.quick else 2048)
    from fastdpr.train import recipe

    args.base_lr = args.base_lr or recipe.DEFAULT_LR
    batches = [int(b) for b in (args.batches or ("16,32,64" if args.quick else "16,128,1024")).split(",")]
    if any(b > args.examples for b in batches):
        parser.error(f"--batches {batches}: every batch must be <= --examples {args.examples}")
    args.work = args.work or _cache() / ("quality_bench_quick" if args.quick else "quality_bench")

    import torch

    from fastdpr.quickstart import experiment as ex
    from fastdpr.quickstart.runner import StageRunner

    if args.threads:
        torch.set_num_threads(args.threads)
    config = _config(args)
    config.threads = args.threads
    config.batch_size = batches[0]
    ws = ex.Workspace(config, Path(args.work), _cache(), log=lambda line: print(line, flush=True))
    # each batch size has stages of its own (train_b<B>, ...): the list of batch sizes is not a setting of any stage
    settings = {**config.settings(), "base_lr": args.base_lr}
    if args.report_only:
        return _report(args, config, batches, _finished(Path(args.work)), wall=None)
    runner = StageRunner(args.work, settings, ws.log)
    wall = time.perf_counter()
    runner.stage("data", lambda: ex.stage_data(ws))
    corpus = runner.stage("corpus", lambda: ex.stage_corpus(ws), after=("data",))
    runner.stage("bm25", lambda: ex.stage_bm25(ws), after=("corpus",))
    mine = runner.stage("mine", lambda: ex.stage_mine(ws), after=("corpus",))
    zero = runner.stage("zero_shot", lambda: ex.stage_zero_shot(ws), after=("corpus",))

    def evaluate(name: str, index_name: str | None) -> dict:
        found = ex.retrievers(ws, include_dense=False) if index_name is None else None
        if index_name is None:
            retriever = found["bm25"] if name == "bm25" else found["zero_shot"]
        else:
            retriever = ex.dense_retriever(ws, f"train_{name}", index_name)
        return {d: ex.evaluate_retriever(ws, retriever, d) for d in RETRIEVAL_SETS}

    runner.stage("eval_bm25", lambda: evaluate("bm25", None), after=("bm25",))
    runner.stage("eval_zero_shot", lambda: evaluate("zero_shot", None), after=("zero_shot",))
    for batch in batches:
        lr = args.base_lr * math.sqrt(batch / 32)
        name = f"b{batch}"
        runner.stage(f"train_{name}", lambda b=batch, lr=lr: _train(config, b, lr), after=("mine",))
        runner.stage(f"dense_{name}", lambda n=name: ex.stage_dense(ws, f"train_{n}", f"dense_{n}"),
                     after=(f"train_{name}",))
        runner.stage(f"eval_{name}", lambda n=name: evaluate(n, f"dense_{n}"), after=(f"dense_{name}",))
    return _report(args, config, batches, _finished(Path(args.work)), wall=time.perf_counter() - wall)


def _finished(work: Path) -> dict:
    """Summaries of the stages finished in ``work`` (whatever settings they ran with: --report-only trusts the
    folder it is given)."""
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted((work / "stages").glob("*.json"))}


def _report(args, config, batches: list[int], stages: dict, wall: float | None) -> int:
    import torch

    corpus, mine = stages["corpus"]["summary"], stages["mine"]["summary"]
    zero = stages["zero_shot"]["summary"]
    rows = {"bm25": stages["eval_bm25"]["summary"], "starting model": stages["eval_zero_shot"]["summary"]}
    training, missing = {}, []
    for batch in batches:
        if f"eval_b{batch}" not in stages:
            missing.append(batch)
            continue
        training[batch] = {**stages[f"train_b{batch}"]["summary"], "eval": stages[f"eval_b{batch}"]["summary"]}
        rows[f"batch {batch}"] = training[batch]["eval"]
    batches = [b for b in batches if b in training]
    stage_seconds = sum(v.get("seconds", 0.0) for v in stages.values())
    gathered = wall is None
    wall = stage_seconds if wall is None else wall

    tables = ""
    for d in RETRIEVAL_SETS:
        rows_d = [{"system": system, **{k: metrics[d][k] for k in ("top1", "top5", "top20", "top100", "gold_top20")}}
                  for system, metrics in rows.items()]
        tables += f"\n**{TITLES[d]}**\n\n" + markdown_table(rows_d, floatfmt=".3f")
    train_rows = [{"batch": b, "steps": t["steps"], "lr": t["lr"], "grad_cache": t["grad_cache"],
                   "chunk": t["chunk_size"] if t["grad_cache"] else None, "precision": t["precision"],
                   "train s": round(t["train_seconds"], 1), "peak RSS MiB": round(t["peak_rss_mib"]),
                   "best step": t["best_step"],
                   **{f"{d} top-20": t["eval"][d]["top20"] for d in RETRIEVAL_SETS}}
                  for b, t in training.items()]
    # the claim rests on the domains no training, validation or setting saw: the mean of their top-20
    unseen = {b: sum(training[b]["eval"][d]["top20"] for d in UNSEEN) / len(UNSEEN) for b in batches}
    shown = ", ".join(f"{unseen[b]:.3f}" for b in batches)
    rises = all(unseen[a] <= unseen[b] for a, b in zip(batches, batches[1:]))
    best = max(batches, key=unseen.get) if batches else None
    verdict = ("fewer than two batch sizes finished: nothing to compare" if len(batches) < 2 else
               f"unseen-domain top-20 (mean of Reddit and Amazon) rises with the batch ({shown})" if rises else
               f"unseen-domain top-20 (mean of Reddit and Amazon) does not rise monotonically with the batch "
               f"({shown}); best at batch {best}. At equal examples seen, a batch of B makes {args.examples}/B "
               "optimizer steps: large batches get few updates here, while DPR and GTR compare batch sizes trained to "
               "convergence (many epochs, thousands of steps).")
    payload = {
        "examples_seen": args.examples, "batches": batches, "chunk": args.chunk, "base_lr": args.base_lr,
        "threads": torch.get_num_threads(), "wall_s": round(wall, 1), "corpus": corpus, "mining": mine["stats"],
        "zero_shot_index": zero, "retrieval": rows, "training": {str(b): t for b, t in training.items()},
        "verdict": verdict, "recipe_mixture": config.train_mixture, "quick": args.quick,
        "unfinished_batches": missing, "stage_seconds": round(stage_seconds, 1),
    }
    body = (f"{corpus['passages']:,} passages (one per paragraph, every set's paragraphs in one corpus); "
            f"{args.examples:,} training examples seen by every batch size (mixture "
            f"{config.train_mixture}, one BM25 hard negative each); {torch.get_num_threads()} threads; "
            f"wall {wall / 60:.1f} min"
            + (" (the sum of the stages' times: this file was gathered by --report-only from the stages that "
               f"`benchmarks/quality_bench.py` finished in {args.work})" if gathered else "") + ".\n\n"
            "### Retrieval (DPR top-k accuracy; gold_top20 = the question's own gold passage in the top 20)\n\n"
            + tables
            + "\n### Training runs\n\n" + markdown_table(train_rows, floatfmt=".3g")
            + f"\n**Batch claim:** {verdict}\n"
            + (f"\nNot finished in this run: batch {', '.join(map(str, missing))}.\n" if missing else ""))
    path = write_results("quality", args.out, payload, body)
    _plot(rows, batches, path.with_suffix(".png"))
    print(body)
    return 0


def _plot(rows: dict, batches: list[int], path: Path) -> None:
    try:
        from fastdpr.plotting import pyplot

        plt = pyplot()
    except Exception as err:  # the numbers are written already; a missing plot extra must not lose them
        print(f"no plot: {err}", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(RETRIEVAL_SETS), figsize=(5 * len(RETRIEVAL_SETS), 3.8), sharey=True)
    for ax, d in zip(axes, RETRIEVAL_SETS):
        ax.plot(batches, [rows[f"batch {b}"][d]["top20"] for b in batches], "o-", label="fine-tuned")
        ax.axhline(rows["bm25"][d]["top20"], color="gray", ls="--", label="BM25")
        ax.axhline(rows["starting model"][d]["top20"], color="C1", ls=":", label="starting model")
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch size (same examples seen)")
        ax.set_title(TITLES[d])
    axes[0].set_ylabel("top-20 accuracy")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(exit_if_data_unavailable(main))
