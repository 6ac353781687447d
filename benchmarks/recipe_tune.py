"""The quickstart's fine-tuning recipe re-tuned on its validation questions only.

Every arm is the recipe (``fastdpr.train.recipe.arguments``) with some settings changed: how many examples are seen
(``examples``, mined from the training questions in the recipe's mixture exactly as the quickstart mines them),
``lr``, ``batch_size``, ``mixture``. An arm trains once to its last step (its weights saved), then its weight
interpolation with the starting model (WiSE-FT: start + alpha (trained - start)) is measured at each ``--alphas``.

**What decides, named before any run:** the mean of top-20 accuracy (DPR answer match) over the two validation
sets, new Wikipedia dev (735 questions) and QED dev (138), each searched over the quickstart's whole corpus
(7,247 paragraphs, exact search); ties within 0.002 go to the higher mean MRR@10. No test set (NQ test, XQuAD,
new Wikipedia test) and neither unseen domain (Reddit, Amazon) is read here: the chosen setting is then measured on
those by a quickstart run.

Two rows come without training, from the indexes of the quickstart run given by ``--run``: the starting model and
the recipe as that run used it.

    python benchmarks/recipe_tune.py --run QUICKSTART_OUT --arm '{"examples": 6144}' --alphas 0.5,0.75,1.0
    python benchmarks/recipe_tune.py --run QUICKSTART_OUT --report     # benchmarks/results/recipe_tune.{json,md}

Each measured row is appended to ``<work>/rows.jsonl`` as it finishes (an arm already measured at an alpha is
skipped when run again); an arm's trained weights stay in ``<work>/<arm>/model``, so an interrupted arm retrains only
if its weights were not saved.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

DEV_SETS = ("dev_new_wiki", "dev_qed")
KS = (1, 5, 20, 100)
ARM_KEYS = {"examples", "lr", "batch_size", "mixture"}


def arm_name(arm: dict) -> str:
    text = json.dumps(arm, sort_keys=True)
    return "arm-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def read_rows(work: Path) -> list[dict]:
    path = work / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def append_row(work: Path, row: dict) -> None:
    with open(work / "rows.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def measure(ws, retriever, what: dict) -> dict:
    from fastdpr.quickstart.experiment import evaluate_retriever

    row = dict(what)
    for name in DEV_SETS:
        acc = evaluate_retriever(ws, retriever, name)
        row[name] = {k: round(float(acc[k]), 4) for k in (*(f"top{k}" for k in KS), "mrr10")}
        row[name]["questions"] = len(ws.questions(name))
        row[name]["ranks"] = acc["ranks"]  # each question's first-hit rank, for paired intervals between rows
    row["dev_top20"] = round(sum(row[n]["top20"] for n in DEV_SETS) / len(DEV_SETS), 4)
    row["dev_mrr10"] = round(sum(row[n]["mrr10"] for n in DEV_SETS) / len(DEV_SETS), 4)
    print(json.dumps(row), flush=True)
    return row


def train_arm(ws, arm: dict, folder: Path) -> dict:
    """The recipe with ``arm``'s changes, trained to its last step; the trained (not interpolated) weights are
    saved to ``folder/model``."""
    from fastdpr.data import write_dpr_biencoder
    from fastdpr.quickstart.experiment import _mine, load_model
    from fastdpr.train import BiEncoderTask, Trainer, load_examples, recipe

    c = ws.config
    counts = recipe.mixture_counts(arm.get("mixture", c.train_mixture), arm.get("examples", c.train_examples))
    records, stats = _mine(ws, "train", counts)
    write_dpr_biencoder(folder / "train.dpr.json", records)
    train = load_examples(str(folder / "train.dpr.json"))
    args, task_args = recipe.arguments(
        output_dir=str(folder / "run"), examples=len(train), batch_size=arm.get("batch_size", c.batch_size),
        lr=arm.get("lr", c.lr), chunk_size=c.chunk_size, eval_times=1, seed=c.seed, show_progress=c.show_progress,
        n_hard=c.mine_hard, interpolate=1.0)
    model = load_model(c)
    log = []
    start = time.perf_counter()
    Trainer(BiEncoderTask(model, train, task_args), args, callbacks=[lambda _t, r: log.append(r)]).train()
    seconds = time.perf_counter() - start
    model.save_pretrained(str(folder / "model.partial"))
    shutil.rmtree(folder / "model", ignore_errors=True)
    os.replace(folder / "model.partial", folder / "model")
    shutil.rmtree(folder / "run", ignore_errors=True)
    losses = [float(r["loss"]) for r in log if "loss" in r]
    info = {"examples": len(train), "per_source": {k: v["kept"] for k, v in stats.items()}, "steps": args.max_steps,
            "train_seconds": round(seconds, 1), "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}
    (folder / "train.json").write_text(json.dumps(info, indent=1))
    return info


def interpolated(ws, folder: Path, alpha: float):
    import torch

    from fastdpr.quickstart.experiment import load_model

    start = load_model(ws.config)
    if alpha == 0.0:
        return start
    tuned = load_model(ws.config, str(folder / "model"))
    s, t = start.state_dict(), tuned.state_dict()
    start.load_state_dict({k: torch.lerp(s[k], t[k], alpha) if s[k].is_floating_point() else t[k] for k in s})
    return start


def dense_over_corpus(ws, model):
    from fastdpr.index import build_index
    from fastdpr.quickstart.experiment import encode_precision
    from fastdpr.retrieve import DenseRetriever

    model.eval()
    corpus = ws.corpus()
    precision = encode_precision(ws.config)
    vectors = model.encode_passages(list(corpus), batch_size=ws.config.encode_batch_size, precision=precision,
                                    show_progress=ws.config.show_progress)
    return DenseRetriever(model, build_index(vectors, "flat"), corpus, precision=precision)


def run_recipe(run: Path, config) -> dict:
    """The recipe the quickstart run ``run`` trained with, from its train stage's summary (the config's defaults
    are today's, not necessarily the run's; runs before the summary named its interpolation used the recipe's)."""
    from fastdpr.train import recipe

    path = run / "stages" / "train.json"
    summary = json.loads(path.read_text()).get("summary", {}) if path.is_file() else {}
    examples = summary.get("examples", config.train_examples)
    return {"examples": examples, "lr": summary.get("lr", config.lr),
            "steps": summary.get("steps", examples // config.batch_size),
            "alpha": summary.get("interpolate", recipe.INTERPOLATE)}


def intervals(rows: list[dict], chosen: dict) -> list[dict]:
    """Paired bootstrap intervals (95%, over each validation set's questions) of the chosen row against the
    starting model and the run's recipe, where both rows kept their per-question ranks."""
    from fastdpr.eval.compare import paired_bootstrap

    table = []
    for base in ("starting model", "quickstart recipe"):
        other = next((r for r in rows if r["row"] == base), None)
        if other is None or other is chosen:
            continue
        for name in DEV_SETS:
            a, b = other[name].get("ranks"), chosen[name].get("ranks")
            if not a or not b or len(a) != len(b):
                continue
            cell = {"comparison": f"chosen - {base}", "set": name}
            for metric in ("top20", "mrr10"):
                mean, lo, hi = paired_bootstrap(a, b, metric)
                cell[metric] = f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            table.append(cell)
    return table


def _without_ranks(row: dict) -> dict:
    return {k: ({kk: vv for kk, vv in v.items() if kk != "ranks"} if k in DEV_SETS else v) for k, v in row.items()}


def report(work: Path, out: str | None, run: Path) -> int:
    rows = read_rows(work)
    if not rows:
        raise SystemExit(f"{work}/rows.jsonl: nothing measured yet")
    best = max(rows, key=lambda r: (r["dev_top20"], r["dev_mrr10"]))
    near = [r for r in rows if best["dev_top20"] - r["dev_top20"] <= 0.002]
    chosen = max(near, key=lambda r: r["dev_mrr10"])
    table = []
    for r in rows:
        cell = {"row": r["row"], "examples": r.get("examples", ""), "steps": r.get("steps", ""),
                "lr": r.get("lr", ""), "alpha": r.get("alpha", "")}
        for name in DEV_SETS:
            cell[f"{name} top-20"] = r[name]["top20"]
            cell[f"{name} MRR@10"] = r[name]["mrr10"]
        cell["mean top-20"] = r["dev_top20"]
        cell["mean MRR@10"] = r["dev_mrr10"]
        cell["train s"] = r.get("train_seconds", "")
        table.append(cell)
    md = (f"Validation questions only (new Wikipedia dev and QED dev of the quickstart run `{run}`), each over its "
          f"whole corpus, exact search; DPR answer match. Decided by the mean top-20 of the two sets (ties within "
          f"0.002 by mean MRR@10), named before the runs.\n\n"
          + _common.markdown_table(table, floatfmt=".4f")
          + f"\n\nChosen: **{chosen['row']}** (mean top-20 {chosen['dev_top20']:.4f}, mean MRR@10 "
            f"{chosen['dev_mrr10']:.4f}).\n")
    paired = intervals(rows, chosen)
    md += ("\nPaired bootstrap intervals of the chosen row (2,000 resamples of each set's questions, 95%):\n\n"
           + _common.markdown_table(paired) + "\n" if paired else
           "\nNo paired intervals: the rows compared were measured before rows kept per-question ranks.\n")
    path = _common.write_results("recipe_tune", out, {"run": str(run), "rows": [_without_ranks(r) for r in rows],
                                                      "chosen": chosen["row"], "intervals": paired}, md)
    print(md)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="output directory of a finished `fastdpr quickstart`")
    ap.add_argument("--work", type=Path, default=None, help="default: <fastdpr cache>/bench/recipe-tune")
    ap.add_argument("--arm", default=None, help=f"JSON: the recipe's settings to change ({sorted(ARM_KEYS)})")
    ap.add_argument("--alphas", default="0.5,1.0", help="weight interpolations measured for --arm")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--report", action="store_true", help="write the results table of every row measured")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from fastdpr.data import sources
    from fastdpr.quickstart.config import QuickstartConfig
    from fastdpr.quickstart.experiment import Workspace, dense_retriever, retrievers

    missing = [p for p in ("corpus.jsonl", "train_corpus.jsonl", "index_zero_shot", "index_dense",
                           *(f"questions/{n}.jsonl" for n in DEV_SETS)) if not (args.run / p).exists()]
    if missing:
        raise SystemExit(f"--run {args.run}: not a finished quickstart run (missing {', '.join(missing)})")
    work = args.work or sources.default_cache() / "bench" / "recipe-tune"
    work.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report(work, args.out, args.run)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    ws = Workspace(QuickstartConfig.preset(), args.run, sources.default_cache(), print)
    done = {r["row"] for r in read_rows(work)}
    if "starting model" not in done:
        append_row(work, measure(ws, retrievers(ws, include_dense=False)["zero_shot"], {"row": "starting model"}))
    if "quickstart recipe" not in done:
        append_row(work, measure(ws, dense_retriever(ws), {"row": "quickstart recipe",
                                                            **run_recipe(args.run, ws.config)}))
    if args.arm is None:
        return 0
    try:
        arm = json.loads(args.arm)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--arm {args.arm!r}: not JSON ({err})") from None
    if not isinstance(arm, dict):
        raise SystemExit(f"--arm {args.arm!r}: a JSON object of settings, e.g. '{{\"examples\": 6144}}'")
    unknown = set(arm) - ARM_KEYS
    if unknown:
        raise SystemExit(f"--arm: unknown settings {sorted(unknown)}; known: {sorted(ARM_KEYS)}")
    try:
        alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    except ValueError:
        raise SystemExit(f"--alphas {args.alphas!r}: comma-separated numbers in [0, 1]") from None
    if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
        raise SystemExit(f"--alphas {args.alphas!r}: comma-separated numbers in [0, 1]")
    folder = work / arm_name(arm)
    folder.mkdir(exist_ok=True)
    info_path = folder / "train.json"
    if (folder / "model").is_dir() and info_path.is_file():
        info = json.loads(info_path.read_text())
    else:
        info = train_arm(ws, arm, folder)
    for alpha in alphas:
        row = f"{json.dumps(arm, sort_keys=True)} alpha {alpha}"
        if row in done:
            continue
        model = interpolated(ws, folder, alpha)
        append_row(work, measure(ws, dense_over_corpus(ws, model), {
            "row": row, "arm": arm, "alpha": alpha, "lr": arm.get("lr", ws.config.lr), **info}))
    return 0


if __name__ == "__main__":
    sys.exit(_common.exit_if_data_unavailable(main))
