"""The quickstart's reader stage alone, on top of a finished quickstart run: train the reader for a fixed number of
steps on the run's training questions (new Wikipedia and QED), read the top passages of the hybrid retriever for
the held-out NQ test questions (QED's test articles) and the SQuAD questions (XQuAD) from their gold paragraph, and
report EM from the top 1 and the top k with the CPU seconds the stage took.

``--eval dev`` reads the validation questions instead (QED dev and new Wikipedia dev, open domain from the same
hybrid top passages), and nothing of the test sets: the reader's settings are chosen there, by the metric named
here before any run (:data:`DECIDING`): EM from the top ``reader_top_k`` passages pooled over both validation sets.

    fastdpr quickstart --out qs                      # once: every stage the reader stage builds on
    python benchmarks/quickstart_reader.py qs [--steps 300 --lr 1e-4 --passages 2 --train-length 192] \\
        [--threads 1] [--json run.json]

Recipe options left out are the quickstart's defaults. The quickstart's own directory is not written to: the run
works in a directory of links to it (``--work``), so several recipes can run side by side.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

# what the reader stage writes; everything else in the quickstart directory is only read
WRITTEN = ("reader", "reader_predictions.json")
#: the validation sets of ``--eval dev`` and the metric that chooses a reader recipe on them
DEV_SETS = ("dev_qed", "dev_new_wiki")
DECIDING = "EM from the top-k hybrid passages, pooled over dev_qed and dev_new_wiki"


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children, user + system, all threads."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def linked_workspace(source: Path, work: Path) -> Path:
    """``work`` holding a link to every entry of the quickstart directory ``source`` but what the stage writes."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        link = work / entry.name
        if entry.name not in WRITTEN and not link.exists():
            link.symlink_to(entry.resolve())
    return work


def validate(ws, ex, trained: str | None = None) -> dict:
    """The reader of the quickstart's recipe trained (or the one already trained in ``trained``), then read open
    domain on :data:`DEV_SETS` only: EM/F1 from the top 1 and the top k of each set, and the deciding figure (EM
    from the top k pooled over both)."""
    if trained:
        from fastdpr.reader import Reader

        reader, stats = Reader.from_pretrained(trained).eval(), {"trained": str(trained)}
    else:
        reader, stats = ex.train_reader(ws)
    k = ws.config.reader_top_k
    corpus = ws.corpus()
    by_set, hits, n = {}, 0.0, 0
    for name in DEV_SETS:
        questions = ws.questions(name)
        scores, _ = ex.read_open_domain(ws, reader, questions)
        gold, _ = ex.read_answers(ws, reader, questions, [[corpus.get(q["gold_ids"][0])] for q in questions], [1])
        by_set[name] = {"questions": len(questions), **scores, "gold_paragraph": gold["top1"]}
        hits += scores[f"top{k}"]["em"] * len(questions)
        n += len(questions)
    return {f"em_top{k}_pooled": round(hits / max(n, 1), 4), "questions": n, "by_set": by_set, "train": stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("quickstart", help="a finished quickstart's output directory")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="questions a step")
    parser.add_argument("--passages", type=int, default=None, help="passages a question in training")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--train-length", type=int, default=None, help="tokens of a training row")
    parser.add_argument("--train-questions", type=int, default=None)
    parser.add_argument("--mixture", default=None,
                        help='JSON shares of the training sources, e.g. \'{"new_wiki": 0.75, "qed": 0.25}\' '
                             "(default: every training question once)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--cache", default=None, help="the quickstart's data cache (default: its default)")
    parser.add_argument("--work", default=None, help="working directory (default: a new temporary one)")
    parser.add_argument("--json", default=None, help="write the result here as well")
    parser.add_argument("--trained", default=None,
                        help="with --eval dev: read with this already trained reader instead of training one")
    parser.add_argument("--eval", choices=("test", "dev"), default="test",
                        help="test: the quickstart's reader stage (NQ test, XQuAD); dev: the validation questions "
                             "only, for choosing a recipe")
    args = parser.parse_args(argv)

    import torch

    from fastdpr.data import sources
    from fastdpr.quickstart import QuickstartConfig
    from fastdpr.quickstart import experiment as ex

    source = Path(args.quickstart)
    if not (source / "index_zero_shot").exists() or not (source / "questions").is_dir():
        parser.error(f"{source}: not a finished quickstart run (run `fastdpr quickstart --out {source}` first)")
    mixture = None
    if args.mixture is not None:
        try:
            mixture = json.loads(args.mixture)
        except json.JSONDecodeError as err:
            parser.error(f"--mixture {args.mixture!r}: not JSON ({err})")
        if not isinstance(mixture, dict) or not all(isinstance(v, (int, float)) for v in mixture.values()):
            parser.error(f"--mixture {args.mixture!r}: a JSON object of source -> share")
    config = QuickstartConfig.preset(
        out=str(source), cache=args.cache, threads=args.threads, show_progress=False,
        reader_steps=args.steps, reader_batch_size=args.batch_size, reader_passages=args.passages,
        reader_lr=args.lr, reader_train_length=args.train_length, reader_train_questions=args.train_questions,
        reader_mixture=mixture,
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    work = linked_workspace(source, Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="qs_reader_")))
    ws = ex.Workspace(config, work, Path(config.cache) if config.cache else sources.default_cache(),
                      log=lambda line: print(line, file=sys.stderr, flush=True))
    cpu, wall = cpu_seconds(), time.perf_counter()
    if args.trained and args.eval != "dev":
        parser.error("--trained needs --eval dev (the test sets are read by the quickstart's own stage)")
    if args.trained and not (Path(args.trained) / "fastdpr_reader.json").is_file():
        parser.error(f"--trained {args.trained}: not a reader directory (no fastdpr_reader.json)")
    result = ex.stage_reader(ws) if args.eval == "test" else validate(ws, ex, args.trained)
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    recipe = {k: getattr(config, k) for k in ("reader_steps", "reader_batch_size", "reader_passages", "reader_lr",
                                              "reader_train_length", "reader_train_questions", "reader_mixture",
                                              "seed")}
    if args.eval == "test":
        scores = {
            "em_top1": result["by_top_k"]["top1"]["em"], f"em_top{config.reader_top_k}": result["em"],
            "f1_top1": result["by_top_k"]["top1"]["f1"], f"f1_top{config.reader_top_k}": result["f1"],
            "questions": result["n"], "squad_gold_paragraph": result["squad_gold_paragraph"],
            "nq_gold_paragraph": result["nq_gold_paragraph"],
        }
    else:
        scores = {"deciding": DECIDING, **{k: v for k, v in result.items() if k != "train"}}
    report = {
        "recipe": recipe, "eval": args.eval, "threads": torch.get_num_threads(), **scores,
        "stage_cpu_s": round(cpu, 1), "stage_wall_s": round(wall, 1),
        "train": result["train"], "load_average": os.getloadavg(), "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
