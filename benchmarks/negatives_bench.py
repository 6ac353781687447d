"""Do more negatives make a better retriever? The number of negatives isolated at a fixed batch.

Every arm trains the packaged MiniLM on the same examples in the same order, with the same batch, learning rate,
optimizer steps, seed (so the same dropout draws) and the same GradCache encoding of every batch; the arms differ
only in how many of the batch's passages each question is scored against: the softmax is split into groups of G
consecutive questions (``TrainingArguments.group_size``), so a question sees G − 1 in-batch negatives plus the
hard negatives of its group (one BM25 hard negative per question). G = batch is DPR's full in-batch loss.

Every arm is trained once per seed of ``--seeds`` (default three; the seed sets the dropout draws, the same in every
arm for one seed), and reported as the mean over its seeds with the spread between them.

Evaluation: the quickstart's test sets (NQ test, SQuAD, and the unseen domains Reddit and Amazon reported together;
no test article reaches training) against its corpus of every paragraph with exact search; DPR top-k accuracy and
MRR@10 (of the first passage holding an answer), with paired-bootstrap 95% intervals of each arm's difference to
the smallest group (per question, each arm's value averaged over its seeds; seeds paired by number).

**What decides, named before any run:** top-20 on the unseen domains (Reddit and Amazon together), the largest group
minus the smallest; no training, validation or setting reads those questions. The other sets and MRR@10 are
reported beside it. The hard negatives' share is the same in every arm: a question meets G − 1 in-batch and G hard
negatives (its own group's), so about half of its negatives are hard whatever G is.

    python benchmarks/negatives_bench.py                       # groups 8 and 128 at the recipe's batch of 128
    python benchmarks/negatives_bench.py --quick               # a smoke run of a few minutes
    python benchmarks/negatives_bench.py --frozen-pools none,1000,4000,all   # and the question-side arms

The CPU default is the recipe's own training (batch 128, lr 1e-4, 24 steps: 3,072 examples), which lifts the
starting model on every test set (``quickstart.md``), so that both arms end above the starting model and the
comparison is between two trained models, not a trained one and a damaged one; three seeds per arm take about
1 h 45 min on 2 cores.

On a GPU machine that cannot fetch the data or the packaged model, pack both here and carry the folder there
(``benchmarks/gpu_check.sh`` runs the GPU arm when ``.gpu/negatives`` exists)::

    python benchmarks/negatives_bench.py --examples 16384 --pack .gpu/negatives     # here: data stages + fp16 model
    python benchmarks/negatives_bench.py --inputs .gpu/negatives --model .gpu/negatives/model \
        --device cuda --batch 1024 --groups 8,1024,32,128 --lr 5e-4 --steps 40 --chunk 256 --name negatives_gpu  # there

Writes ``<name>.json``, ``<name>.md`` and ``<name>.png`` in ``--out``; the corpus, mined examples, models and vectors
stay in ``--work`` (default: the fastdpr cache), so an interrupted run resumes stage by stage (``--report-only``
writes the results from the stages already done).
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

import numpy as np  # noqa: E402

from fastdpr.eval.compare import paired_bootstrap, per_question  # noqa: E402

# reported set -> the quickstart's question files it is made of
SETS = {"nq": ("nq_test",), "squad": ("squad",), "unseen": ("reddit", "amazon")}
KS = (1, 5, 20, 100)
DECIDING = "unseen"
DECIDING_METRIC = "top20"


def _config(args):
    from fastdpr.quickstart.config import QuickstartConfig

    n = args.questions
    return QuickstartConfig(
        out=str(args.work), show_progress=False, seed=0, test_questions=n, dev_questions=0, max_passages=args.pool,
        passage_length=args.passage_length, train_examples=args.examples, dev_examples=0, batch_size=args.batch,
        chunk_size=args.chunk, lr=args.lr, threads=args.threads)


def _cache() -> Path:
    from fastdpr.data import sources

    return sources.default_cache()


def _workspace(config, log=lambda line: None):
    from fastdpr.quickstart import experiment as ex

    return ex.Workspace(config, Path(config.out), _cache(), log=log)


# ------------------------------------------------------------------------------------------------------ training

def load_start(config, model_path: str | None = None):
    """The starting model (the packaged MiniLM unless ``model_path``), in float32 whatever it was saved in."""
    from fastdpr.quickstart import experiment as ex

    return ex.load_model(config, model_path).float()


def _train_in_child(config, group: int, steps: int, device: str, queue, model_path: str | None = None,
                    pool: str | None = None, seed: int = 0) -> None:
    """One arm in its own process, so that its peak memory is its own and no state leaks between arms. ``pool``
    (none | all | K) makes it a question-side arm: passage tower frozen, the starting model's pool vectors as
    negatives (none of them, all, or each question's K best)."""
    import resource

    import torch

    from fastdpr.quickstart import experiment as ex
    from fastdpr.train import BiEncoderTask, Trainer, load_examples, recipe

    if config.threads:
        torch.set_num_threads(config.threads)
    ws = _workspace(config)
    train = load_examples(str(ws.out / "train.dpr.json"))
    out = ws.out / (f"train_g{group}_s{seed}" if pool is None else f"train_f{pool}")
    frozen = {} if pool is None else dict(
        freeze_passages=True, negatives_from=None if pool == "none" else str(ws.out / "vectors_zero_shot"),
        pool_negatives=0 if pool in ("none", "all") else int(pool))
    args, task_args = recipe.arguments(
        output_dir=str(out), examples=len(train), batch_size=config.batch_size, lr=config.lr,
        chunk_size=config.chunk_size, seed=seed, show_progress=False, n_hard=config.mine_hard,
        device=device, max_steps=steps, epochs=math.ceil(steps * config.batch_size / len(train)),
        # the arms are compared as trained: no interpolation with the starting weights, no checkpoint selection
        interpolate=1.0, group_size=group if pool is None else 0, save_steps=10**9, logging_steps=1, warmup_steps=0.1, **frozen)
    log: list[dict] = []
    trainer = Trainer(BiEncoderTask(load_start(config, model_path), train, task_args), args,
                      callbacks=[lambda _t, record: log.append(record)])
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    import shutil

    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda")
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    queue.put({"group": group, "pool": pool, "seed": seed, "steps": trainer.total_steps, "examples": len(train), "batch": args.batch_size,
               "lr": args.lr, "precision": args.precision, "grad_cache": task_args.grad_cache,
               "chunk": task_args.chunk_size, "loss_backend": task_args.loss_backend, "train_seconds": seconds,
               "examples_per_s": trainer.total_steps * args.batch_size / seconds,
               "peak_mib": peak, "peak_kind": "CUDA allocated" if device.startswith("cuda") else "RSS",
               "losses": [round(float(r["loss"]), 5) for r in log]})


def _train(config, group: int, steps: int, device: str, model_path: str | None = None,
           pool: str | None = None, seed: int = 0) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_train_in_child, args=(config, group, steps, device, queue, model_path, pool, seed))
    child.start()
    child.join()
    if child.exitcode != 0:
        arm = f"groups of {group}" if pool is None else f"question-side arm with pool {pool}"
        raise RuntimeError(f"training the {arm} failed (exit {child.exitcode})")
    return queue.get(timeout=30)


# ---------------------------------------------------------------------------------------------------- evaluation

def metrics_of(ranks) -> dict:
    from fastdpr.eval.compare import per_question

    return {m: float(per_question(ranks, m).mean()) for m in [f"top{k}" for k in KS] + ["mrr10"]}


def _evaluate(ws, retriever) -> dict:
    """Per reported set, the 1-based first-hit rank of every question (0: none in the top 100 of exact search)."""
    from fastdpr.eval import first_hit_ranks
    from fastdpr.eval.compare import ranks_from_first_hits
    from fastdpr.eval.retrieval import ranking_hits

    out = {}
    for name, files in SETS.items():
        qs = [q for f in files for q in ws.questions(f)]
        ranked = retriever.ranked_ids([q["question"] for q in qs], max(KS))
        hits = ranking_hits(ranked, [q["answers"] for q in qs], ws.corpus())
        out[name] = ranks_from_first_hits(first_hit_ranks(hits)).tolist()
    return out


# -------------------------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default=None,
                        help="comma-separated softmax group sizes, run in this order (default 8,128; list the "
                             "extremes first when adding sizes)")
    parser.add_argument("--batch", type=int, default=None, help="questions per step (default 128, the recipe's)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps of every arm (default 24)")
    parser.add_argument("--frozen-pools", default=None,
                        help="question-side arms (passage tower frozen, the starting model's index reused), each "
                             "with pool negatives none | all | K best (default: none of these arms; e.g. none,1000,4000,all)")
    parser.add_argument("--seeds", default=None, help="comma-separated training seeds of every group arm (default "
                                                       "0,1,2; --quick 0,1)")
    parser.add_argument("--chunk", type=int, default=32, help="GradCache chunk (texts per encoder call)")
    # the recipe's 1e-4 at batch 32 scaled by sqrt(batch / 32), rounded: a few steps of a large batch must move
    parser.add_argument("--lr", type=float, default=1e-4, help="default: the recipe's")
    parser.add_argument("--examples", type=int, default=None,
                        help="distinct training examples mined (default batch x steps, at most what the sources "
                             "hold); fewer than batch x steps means more than one epoch")
    parser.add_argument("--questions", type=int, default=None,
                        help="questions of each test set (default 1,000; the unseen set holds Reddit's and Amazon's)")
    parser.add_argument("--pool", type=int, default=None,
                        help="evaluation corpus size limit (default: every paragraph; the test questions' always kept)")
    parser.add_argument("--passage-length", type=int, default=256,
                        help="passage tokens (train and evaluation; the packaged model's limit, as the quickstart)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="starting model directory (default: the packaged MiniLM)")
    parser.add_argument("--pack", type=Path, default=None,
                        help="run the data stages, then write their outputs and an fp16 copy of the starting model "
                             "into this folder (for a machine without the data or the model package) and stop")
    parser.add_argument("--inputs", type=Path, default=None,
                        help="a folder written by --pack: its data instead of the data stages")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--name", default=None, help="result file name (default negatives[_quick])")
    parser.add_argument("--out", default=None, help="results folder (default: benchmarks/results)")
    parser.add_argument("--work", type=Path, default=None, help="intermediate files (default: in the fastdpr cache)")
    parser.add_argument("--report-only", action="store_true", help="report the stages already done, run nothing")
    args = parser.parse_args()
    quick = args.quick
    args.groups = [int(g) for g in (args.groups or ("2,8" if quick else "8,128")).split(",")]
    pools = args.frozen_pools if args.frozen_pools is not None else ("none,all" if quick else "")
    args.frozen_pools = [p.strip() for p in pools.split(",") if p.strip()]
    if any(p not in ("none", "all") and not (p.isdigit() and int(p) > 0) for p in args.frozen_pools):
        parser.error(f"--frozen-pools {pools!r}: each must be none, all or a positive count")
    try:
        args.seeds = [int(x) for x in (args.seeds or ("0,1" if quick else "0,1,2")).split(",") if x.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: comma-separated whole numbers")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds}: at least one, each once")
    args.batch = args.batch or (8 if quick else 128)
    args.steps = args.steps or (2 if quick else 24)
    args.questions = args.questions or (40 if quick else 1000)
    args.pool = args.pool or (600 if quick else None)
    args.examples = args.examples or args.batch * args.steps
    args.name = args.name or ("negatives_quick" if quick else "negatives")
    args.work = args.work or _cache() / f"negatives_bench-{args.name}"
    if any(g < 1 or g > args.batch for g in args.groups):
        parser.error(f"--groups {args.groups}: every group must lie in [1, --batch {args.batch}]")
    if args.batch < 1 or args.steps < 1 or args.chunk < 1 or args.lr <= 0:
        parser.error("--batch, --steps, --chunk and --lr must be positive")

    import torch

    from fastdpr.quickstart import experiment as ex
    from fastdpr.quickstart.runner import StageRunner

    if args.threads:
        torch.set_num_threads(args.threads)
    config = _config(args)
    ws = _workspace(config, log=lambda line: print(line, flush=True))
    settings = {**config.settings(), "steps": args.steps, "device": args.device.split(":")[0],
                "sets": {k: list(v) for k, v in SETS.items()}}
    if not args.report_only:
        runner = StageRunner(args.work, settings, ws.log)
        if args.inputs:
            summaries = unpack_inputs(args.inputs, Path(args.work))
            for name in ("corpus", "mine"):
                runner.stage(name, lambda n=name: summaries[n])
        else:
            runner.stage("data", lambda: ex.stage_data(ws))
            runner.stage("corpus", lambda: ex.stage_corpus(ws), after=("data",))
            runner.stage("bm25", lambda: ex.stage_bm25(ws), after=("corpus",))
            runner.stage("mine", lambda: ex.stage_mine(ws), after=("corpus",))
        if args.pack:
            return pack_inputs(Path(args.work), args.pack, load_start(config, args.model))
        runner.stage("zero_shot", lambda: ex._encode_and_index(ws, load_start(config, args.model), "zero_shot"),
                     after=("corpus",))

        def zero_shot():
            from fastdpr.index import load_index
            from fastdpr.retrieve import DenseRetriever

            retriever = DenseRetriever(load_start(config, args.model), load_index(ws.out / "index_zero_shot"),
                                       ws.corpus(), precision=ex.encode_precision(config))
            retriever.model.eval()
            return _evaluate(ws, retriever)

        if (Path(args.work) / "bm25").is_dir():  # a packed input carries no BM25 (it is the CPU's baseline)
            runner.stage("eval_bm25", lambda: _evaluate(ws, ex.retrievers(ws, include_dense=False)["bm25"]),
                         after=("bm25",))
        runner.stage("eval_zero_shot", zero_shot, after=("zero_shot",))
        for group, seed in [(g, s) for s in args.seeds for g in args.groups]:  # every arm of a seed, then the next
            name = f"g{group}_s{seed}"
            runner.stage(f"train_{name}", lambda g=group, sd=seed: _train(config, g, args.steps, args.device,
                                                                          args.model, seed=sd),
                         after=("mine",))
            runner.stage(f"dense_{name}", lambda n=name: ex.stage_dense(ws, f"train_{n}", f"dense_{n}"),
                         after=(f"train_{name}",))
            runner.stage(f"eval_{name}", lambda n=name: _evaluate(ws, ex.dense_retriever(ws, f"train_{n}",
                                                                                        f"dense_{n}")),
                         after=(f"dense_{name}",))
        for pool in args.frozen_pools:
            name = f"f{pool}"
            runner.stage(f"train_{name}", lambda p=pool: _train(config, args.batch, args.steps, args.device,
                                                                args.model, pool=p, seed=args.seeds[0]),
                         after=("mine", "zero_shot"))
            # the passage tower did not move: the starting model's index serves the trained question tower
            runner.stage(f"eval_{name}", lambda n=name: _evaluate(ws, ex.dense_retriever(ws, f"train_{n}",
                                                                                        "zero_shot")),
                         after=(f"train_{name}",))
    return _report(args, _finished(args.work))


PACKED = ("corpus.jsonl", "train.dpr.json") + tuple(f"questions/{f}.jsonl" for fs in SETS.values() for f in fs)


def pack_inputs(work: Path, folder: Path, model) -> int:
    """The data stages' outputs (``inputs.tar.xz``, their summaries) and the starting model in fp16 (half the
    bytes to carry; ``load_start`` widens it again) in ``folder``."""
    import json
    import tarfile

    from fastdpr.atomic import atomic_open, write_json

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_open(folder / "inputs.tar.xz", "wb") as fh, tarfile.open(fileobj=fh, mode="w:xz") as tar:
        for name in PACKED:
            tar.add(work / name, arcname=name)
    stages = {n: json.loads((work / "stages" / f"{n}.json").read_text())["summary"] for n in ("corpus", "mine")}
    write_json(folder / "summaries.json", stages)
    model.half().save_pretrained(folder / "model")
    sizes = {p.name: p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    print(f"packed {folder}: {sum(sizes.values()) / 2**20:.1f} MiB in {len(sizes)} files")
    return 0


def unpack_inputs(folder: Path, work: Path) -> dict:
    """Unpack a ``--pack`` folder into the work folder (once); the corpus and mining summaries it carries."""
    import json
    import tarfile

    if not (work / "train.dpr.json").is_file():
        work.mkdir(parents=True, exist_ok=True)
        with tarfile.open(folder / "inputs.tar.xz", "r:xz") as tar:
            tar.extractall(work, filter="data")
    return json.loads((folder / "summaries.json").read_text())


def _finished(work: Path) -> dict:
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted((work / "stages").glob("*.json"))}


def seed_mean(runs: dict, s: str) -> dict:
    """The metrics of set ``s`` averaged over the runs (seed -> {set: first-hit ranks}) of one system."""
    per_seed = [metrics_of(r[s]) for r in runs.values()]
    return {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}


def seed_values(runs: dict, s: str, metric: str) -> list[float]:
    return [metrics_of(r[s])[metric] for r in runs.values()]


def paired_over_seeds(base: dict, arm: dict, s: str, metric: str, rounds: int = 2000) -> dict:
    """``arm`` minus ``base`` on set ``s``: the mean difference with a 95% interval over resamples of the questions
    (each question's value averaged over the seeds both ran), and the difference seed by seed."""
    seeds = [sd for sd in arm if sd in base]
    diff = np.mean([per_question(arm[sd][s], metric) - per_question(base[sd][s], metric) for sd in seeds], axis=0)
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), size=(rounds, len(diff)))].mean(axis=1)
    by_seed = [float((per_question(arm[sd][s], metric) - per_question(base[sd][s], metric)).mean()) for sd in seeds]
    lo, hi = float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
    return {"difference": float(diff.mean()), "ci95_low": lo, "ci95_high": hi,
            "excludes 0": "yes" if lo > 0 or hi < 0 else "no", "seeds": len(seeds),
            "per seed min": min(by_seed), "per seed max": max(by_seed), "per seed": [round(v, 4) for v in by_seed]}


def _report(args, stages: dict) -> int:
    import torch

    corpus, mine = stages["corpus"]["summary"], stages["mine"]["summary"]
    # system -> seed -> set -> first-hit ranks (one "seed" for what is not trained per seed)
    systems = {"starting model": {0: stages["eval_zero_shot"]["summary"]}}
    if "eval_bm25" in stages:
        systems = {"bm25": {0: stages["eval_bm25"]["summary"]}, **systems}
    arms, training, missing = {}, [], []
    for g in sorted(args.groups):  # run in any order (the extremes first, say), reported by size
        runs = {sd: stages[f"eval_g{g}_s{sd}"]["summary"] for sd in args.seeds if f"eval_g{g}_s{sd}" in stages}
        missing += [f"groups of {g}, seed {sd}" for sd in args.seeds if sd not in runs]
        if runs:
            arms[g] = runs
            systems[f"groups of {g}"] = runs
            training += [stages[f"train_g{g}_s{sd}"]["summary"] for sd in runs]
    sizes = {s: len(r) for s, r in systems["starting model"][0].items()}

    tables, intervals = "", []
    for s in SETS:
        rows = []
        for name, runs in systems.items():
            row = {"system": name, "negatives": (g - 1 + g) if (g := _group_of(name)) else None,
                   "seeds": len(runs), **seed_mean(runs, s)}
            values = seed_values(runs, s, DECIDING_METRIC)
            row[f"{DECIDING_METRIC} seed min"] = min(values)
            row[f"{DECIDING_METRIC} seed max"] = max(values)
            rows.append(row)
        tables += f"\n**{s}** ({sizes[s]:,} questions)\n\n" + markdown_table(rows, floatfmt=".3f")
    base = min(arms) if arms else None
    for s in SETS:
        for g in arms:
            if g == base:
                continue
            for metric in (DECIDING_METRIC, "mrr10"):
                intervals.append({"set": s, "arm": f"groups of {g} − groups of {base}", "metric": metric,
                                  **paired_over_seeds(arms[base], arms[g], s, metric)})
    train_rows = [{"group": t["group"], "seed": t.get("seed", 0), "negatives": 2 * t["group"] - 1,
                   "steps": t["steps"], "batch": t["batch"], "lr": t["lr"], "precision": t["precision"],
                   "chunk": t["chunk"], "loss backend": t["loss_backend"], "train s": round(t["train_seconds"], 1),
                   "examples/s": round(t["examples_per_s"], 1), f"peak MiB ({t['peak_kind']})": round(t["peak_mib"]),
                   "first loss": t["losses"][0], "last loss": t["losses"][-1]} for t in training]
    frozen, frozen_rows = {}, []
    for pool in args.frozen_pools:
        if f"eval_f{pool}" not in stages:
            missing.append(f"frozen {pool}")
            continue
        frozen[pool] = stages[f"train_f{pool}"]["summary"]
        label = f"question side, pool {pool}"
        systems[label] = {args.seeds[0]: stages[f"eval_f{pool}"]["summary"]}
        t = frozen[pool]
        frozen_rows.append({"pool negatives": pool, "train s": round(t["train_seconds"], 1),
                            "examples/s": round(t["examples_per_s"], 1), **{
                                f"{s} {m}": seed_mean(systems[label], s)[m] for s in SETS for m in ("top20", "mrr10")}})
    if arms and frozen:  # the reference row of the question-side table
        full = max(arms)
        t = next(t for t in training if t["group"] == full)
        frozen_rows.append({"pool negatives": f"full fine-tuning (groups of {full}; re-encodes the corpus)",
                            "train s": round(t["train_seconds"], 1), "examples/s": round(t["examples_per_s"], 1),
                            **{f"{s} {m}": seed_mean(arms[full], s)[m] for s in SETS for m in ("top20", "mrr10")}})
    for pool in frozen:
        for s in SETS:
            mean, lo, hi = paired_bootstrap(systems["starting model"][0][s],
                                            systems[f"question side, pool {pool}"][args.seeds[0]][s], "top20")
            intervals.append({"set": s, "arm": f"question side, pool {pool} − starting model", "metric": "top20",
                              "difference": mean, "ci95_low": lo, "ci95_high": hi,
                              "excludes 0": "yes" if lo > 0 or hi < 0 else "no", "seeds": 1})
    verdict = _verdict(systems, arms, intervals)
    payload = {"groups": args.groups, "seeds": args.seeds, "batch": args.batch, "steps": args.steps, "lr": args.lr,
               "chunk": args.chunk, "device": args.device, "threads": torch.get_num_threads(),
               "passage_length": args.passage_length, "corpus": corpus, "mining": mine,
               "question_sets": {k: list(v) for k, v in SETS.items()},
               "deciding": {"set": DECIDING, "metric": DECIDING_METRIC},
               "metrics": {name: {str(sd): {s: metrics_of(r) for s, r in run.items()} for sd, run in runs.items()}
                           for name, runs in systems.items()},
               "first_hit_ranks": {name: {str(sd): run for sd, run in runs.items()} for name, runs in systems.items()},
               "training": training, "question_side_training": frozen, "intervals": intervals, "verdict": verdict,
               "frozen_pools": args.frozen_pools, "unfinished": missing,
               "stage_seconds": {k: round(v.get("seconds", 0.0), 1) for k, v in stages.items()}}
    wall = sum(v.get("seconds", 0.0) for v in stages.values())
    warmup = int(round(0.1 * args.steps))  # the recipe's 10%, rounded as the trainer rounds it
    body = (f"**Result** (decided by {DECIDING_METRIC} on the {DECIDING} set, named before the run): {verdict}\n\n"
            f"Batch {args.batch:,} questions, {args.steps} optimizer steps per arm at lr {args.lr:g} ({warmup} warm-up "
            f"steps, then linear decay to 0), GradCache chunk {args.chunk}, {mine['train_records']:,} distinct training examples "
            f"(one BM25 hard negative each, mixture of the recipe), passages of {args.passage_length} tokens; "
            f"seeds {', '.join(map(str, args.seeds))} for every group arm; "
            f"device {args.device}, {torch.get_num_threads()} threads; stages took {wall / 60:.1f} min in all.\n"
            f"Evaluation corpus: {corpus['passages']:,} passages; exact search; DPR has_answer. "
            "\"negatives\" = in-batch negatives + hard negatives a question is scored against (G − 1 + G). Metrics "
            "are means over an arm's seeds, with the lowest and highest seed beside the deciding metric.\n\n"
            "### Retrieval\n" + tables
            + f"\n### Paired bootstrap (2,000 resamples of the questions), each arm minus groups of {base}\n\n"
              "Each question's value averaged over the seeds; \"per seed\": the same difference seed by seed. "
              f"Only the deciding row ({DECIDING}, {DECIDING_METRIC}) carries the claim; the others are descriptive "
              "95% intervals, not corrected for their number.\n\n"
            + markdown_table(intervals, floatfmt=".4f")
            + "\n### Training runs (same examples, order, steps and lr; only the softmax groups and seeds differ)\n\n"
            + markdown_table(train_rows, floatfmt=".4g")
            + "\nLosses are not comparable across arms: a softmax over more negatives starts higher.\n"
            + ("\n### Question-side fine-tuning (passage tower frozen, the starting model's index reused)\n\n"
               f"Seed {args.seeds[0]} only. Same examples, batch, steps and lr as above; only the question tower "
               "trains, and each question also meets the pool's passages (the evaluation corpus as the starting model "
               "encoded it) as negatives: none, each question's K best, or all. Train time includes encoding the "
               "batch's passages without a graph; no arm re-encodes the corpus, which full fine-tuning must.\n\n"
               + markdown_table(frozen_rows, floatfmt=".3f") if frozen_rows else "")
            + (f"\nNot finished: {', '.join(map(str, missing))}.\n" if missing else ""))
    path = write_results(args.name, args.out, payload, body)
    _plot(systems, arms, path.with_suffix(".png"))
    print(body)
    return 0


def _group_of(name: str) -> int | None:
    return int(name.rsplit(" ", 1)[1]) if name.startswith("groups of ") else None


def _verdict(systems: dict, arms: dict, intervals: list[dict]) -> str:
    if len(arms) < 2:
        return "fewer than two arms finished: nothing to compare"
    groups = sorted(arms)
    m = DECIDING_METRIC
    start = seed_mean(systems["starting model"], DECIDING)[m]
    values = [seed_mean(arms[g], DECIDING)[m] for g in groups]
    r = next(r for r in intervals
             if r["set"] == DECIDING and r["metric"] == m and r["arm"].startswith(f"groups of {groups[-1]} "))
    text = (f"groups of {groups[-1]} minus groups of {groups[0]}: {r['difference']:+.4f} "
            f"[{r['ci95_low']:+.4f}, {r['ci95_high']:+.4f}] over {r['seeds']} seeds (seed by seed "
            f"{', '.join(f'{v:+.4f}' for v in r['per seed'])}); "
            + ("the interval excludes 0. " if r["excludes 0"] == "yes" else "the interval includes 0: no difference "
               "shown. ")
            + f"{m} across groups {', '.join(map(str, groups))}: {', '.join(f'{v:.3f}' for v in values)} "
            f"(starting model {start:.3f}). ")
    below = [f"groups of {g}, seed {sd}" for g in groups for sd, run in arms[g].items()
             if metrics_of(run[DECIDING])[m] <= start]
    text += ("Every arm ends above the starting model on every seed." if not below else
             f"Not above the starting model: {', '.join(below)} (more steps needed for a sound comparison).")
    return text


def _plot(systems: dict, arms: dict, path: Path) -> None:
    try:
        from fastdpr.plotting import pyplot

        plt = pyplot()
    except Exception as err:  # the numbers are written already; a missing plot extra must not lose them
        print(f"no plot: {err}", file=sys.stderr)
        return
    groups = sorted(arms)
    if not groups:
        return
    fig, axes = plt.subplots(1, len(SETS), figsize=(5 * len(SETS), 3.8))
    for ax, s in zip(axes, SETS):
        for metric, style in (("top20", "o-"), ("mrr10", "s--")):
            ax.plot([2 * g - 1 for g in groups], [seed_mean(arms[g], s)[metric] for g in groups],
                    style, label=f"{metric}, fine-tuned (mean of seeds)")
            ax.axhline(seed_mean(systems["starting model"], s)[metric], color="C2" if metric == "top20" else "C3",
                       ls=":", label=f"{metric}, starting model")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("negatives per question (in-batch + hard)")
        ax.set_title(s)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(exit_if_data_unavailable(main))
