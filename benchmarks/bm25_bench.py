"""BM25 speed and agreement: fastdpr's BM25 (bm25s, numba) against Lucene (Anserini via pyjnius).

Same passages, same questions, same parameters (k1=0.9, b=0.4, English stopwords, Porter stemming, title + text).
Reports index time, queries/second with 1 thread and all threads (median of repeated runs, after a warm-up that
also pays numba's compilation), top-10 overlap between the two, and each one's top-k answer accuracy.

    python benchmarks/bm25_bench.py                       # questions of the quickstart's five test sets
    python benchmarks/bm25_bench.py --datasets squad --questions 1000 --repeats 3

Data: the quickstart's corpus (every paragraph of the published QA sets, one passage each) and the questions of
its test sets (``fastdpr.quickstart.experiment.EVAL_SETS``), written into ``--work`` by its data and corpus stages
from the files ``fastdpr data fetch`` checks into the cache.
Results: ``benchmarks/results/bm25.json`` and ``bm25.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=None, help="fastdpr data cache (default: $FASTDPR_CACHE or ~/.cache/fastdpr)")
    p.add_argument("--work", default=None, help="corpus and question files (default: <cache>/bm25_bench)")
    p.add_argument("--quick", action="store_true", help="SQuAD questions only, 200 of them, 1 repeat (smoke run)")
    p.add_argument("--datasets", default="nq_test,squad,new_wiki_test,reddit,amazon",
                   help="comma-separated test sets the questions are sampled from (the corpus is always every "
                        "paragraph)")
    p.add_argument("--questions", type=int, default=2000, help="questions sampled from those sources")
    p.add_argument("-k", type=int, default=100, help="passages retrieved per question when timing (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="timed search runs per setting (median reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lucene", action="store_true", help="skip the Lucene peer")
    p.add_argument("--out", default=str(HERE / "results"), help="results directory")
    args = p.parse_args(argv)
    if args.quick:
        args.datasets, args.questions, args.repeats = "squad", min(args.questions, 200), 1
    return args


def load_data(args):
    from fastdpr.data import sources
    from fastdpr.quickstart.experiment import EVAL_SETS

    names = [n for n in args.datasets.split(",") if n]
    unknown = [n for n in names if n not in EVAL_SETS]
    if unknown:
        raise SystemExit(f"unknown dataset(s) {unknown}; choose from {', '.join(EVAL_SETS)}")
    work = Path(args.work) if args.work else _common.default_work("bm25_bench", args.cache)
    ws = _common.quickstart_data(work, cache=args.cache, test_questions=None)
    passages = list(sources.read_jsonl(work / "corpus.jsonl"))
    questions = [q for name in names for q in ws.questions(name)]
    rng = np.random.default_rng(args.seed)
    chosen = rng.choice(len(questions), size=min(args.questions, len(questions)), replace=False)
    return passages, [questions[i] for i in sorted(chosen)], names


def timed(fn, repeats):
    times = []
    out = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, out


def accuracy(ids, questions, corpus_text, ks=(1, 5, 20)):
    from fastdpr.text.answers import has_answer

    depth = max(ks)
    first_hit = []
    for row, q in zip(ids, questions):
        rank = next((r for r, pid in enumerate(row[:depth]) if pid and has_answer(corpus_text[pid], q["answers"])),
                    None)
        first_hit.append(rank)
    return {f"top{k}": float(np.mean([r is not None and r < k for r in first_hit])) for k in ks}


def machine():
    return {**_common.machine(), "load_average_at_start": list(os.getloadavg())}


def main(argv=None):
    args = parse_args(argv)
    import bm25s
    import numba

    from fastdpr.sparse import BM25

    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + (argv or sys.argv[1:]))
    all_threads = os.cpu_count() or 1
    passages, questions, names = load_data(args)
    queries = [q["question"] for q in questions]
    corpus_text = {p["id"]: p["text"] for p in passages}
    print(f"{len(passages)} passages ({', '.join(names)}), {len(queries)} questions, k={args.k}, "
          f"{all_threads} cores", flush=True)

    result = {"command": command, "machine": machine(), "passages": len(passages), "questions": len(queries),
              "datasets": names, "k": args.k, "repeats": args.repeats, "threads_all": all_threads,
              "versions": {"bm25s": bm25s.__version__, "numba": numba.__version__}}

    # ---------------------------------------------------------------- fastdpr
    start = time.perf_counter()
    ours = BM25.from_corpus(passages, show_progress=False)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    ours.search(queries[:8], k=args.k, threads=1)
    ours.search(queries[:8], k=args.k, threads=all_threads)
    warmup_s = time.perf_counter() - start
    fd = {"index_s": build_s, "first_search_compile_s": warmup_s}
    for label, threads in (("1_thread", 1), ("all_threads", all_threads)):
        med, times, out = timed(lambda t=threads: ours.search(queries, k=args.k, threads=t), args.repeats)
        fd[f"qps_{label}"] = len(queries) / med
        fd[f"times_{label}_s"] = times
    our_ids = out[1]
    fd["accuracy"] = accuracy(our_ids, questions, corpus_text)
    result["fastdpr"] = fd
    print(f"fastdpr: index {build_s:.1f}s, {fd['qps_1_thread']:.0f} q/s (1 thread), "
          f"{fd['qps_all_threads']:.0f} q/s ({all_threads} threads)", flush=True)

    # ---------------------------------------------------------------- Lucene
    lucene_info = None
    if not args.no_lucene:
        from fastdpr.errors import MissingDependency
        from fastdpr.sparse.lucene import LuceneBM25, anserini_jar, lucene_available

        if not lucene_available():
            lucene_info = {"skipped": "Lucene peer not available (pyjnius, Java >= 11, Anserini jar)"}
        else:
            try:
                from jnius import autoclass

                with tempfile.TemporaryDirectory(prefix="fastdpr-bench-lucene-") as tmp:
                    start = time.perf_counter()
                    lucene = LuceneBM25.from_corpus(passages, Path(tmp) / "index", threads=all_threads)
                    lucene_build = time.perf_counter() - start
                    lucene.search(queries[:200], k=args.k)  # JIT warm-up
                    lucene.search(queries[:200], k=args.k, threads=all_threads)
                    lucene_info = {"index_s": lucene_build, "index_threads": all_threads,
                                   "java": autoclass("java.lang.System").getProperty("java.version"),
                                   "anserini_jar": os.path.basename(anserini_jar())}
                    for label, threads in (("1_thread", 1), ("all_threads", all_threads)):
                        med, times, out = timed(lambda t=threads: lucene.search(queries, k=args.k, threads=t),
                                                args.repeats)
                        lucene_info[f"qps_{label}"] = len(queries) / med
                        lucene_info[f"times_{label}_s"] = times
                    lucene_ids = out[1]
                lucene_info["accuracy"] = accuracy(lucene_ids, questions, corpus_text)
                overlap10 = [len(set(a[:10]) & set(b[:10]) - {""}) / 10 for a, b in zip(our_ids, lucene_ids)]
                result["agreement"] = {
                    "top10_overlap_mean": float(np.mean(overlap10)),
                    "top10_overlap_min": float(np.min(overlap10)),
                    "top1_same": float(np.mean([a[0] == b[0] for a, b in zip(our_ids, lucene_ids)])),
                    f"top{args.k}_overlap_mean": float(np.mean(
                        [len(set(a) & set(b) - {""}) / args.k for a, b in zip(our_ids, lucene_ids)])),
                }
                print(f"Lucene: index {lucene_build:.1f}s, {lucene_info['qps_1_thread']:.0f} q/s (1 thread), "
                      f"{lucene_info['qps_all_threads']:.0f} q/s ({all_threads} threads); top-10 overlap "
                      f"{result['agreement']['top10_overlap_mean']:.3f}", flush=True)
            except MissingDependency as err:
                lucene_info = {"skipped": str(err)}
    result["lucene"] = lucene_info
    write(result, Path(args.out))


def write(result, out: Path):
    from fastdpr.atomic import write_json, write_text

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bm25.json", result)
    fd, lu = result["fastdpr"], result.get("lucene") or {}
    m = result["machine"]
    lines = [
        "# BM25: fastdpr (bm25s + numba) vs Lucene (Anserini)",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores (shared), Python {m['python']}. Corpus: {result['passages']} "
        f"paragraphs (the quickstart's corpus); {result['questions']} questions of "
        f"{', '.join(result['datasets'])}; top-{result['k']}; "
        f"median of {result['repeats']} runs. k1=0.9, b=0.4, English stopwords, Porter stemming, title + text. "
        f"Load average when started: {', '.join(f'{x:.1f}' for x in m['load_average_at_start'])} (other work "
        "was running on the machine).",
        "",
        "| | index time (s) | q/s, 1 thread | q/s, all threads | top-1 | top-5 | top-20 |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row("fastdpr BM25", fd),
    ]
    if "qps_1_thread" in lu:
        lines.append(_row(f"Lucene (Anserini, Java {lu['java']})", lu))
        a, k = result["agreement"], result["k"]
        lines += [
            "",
            f"Speed-up over Lucene: {fd['qps_1_thread'] / lu['qps_1_thread']:.1f}x (1 thread), "
            f"{fd['qps_all_threads'] / lu['qps_all_threads']:.1f}x (all threads); index build "
            f"{lu['index_s'] / fd['index_s']:.2f}x Lucene's speed.",
            "",
            f"Agreement: top-10 overlap {a['top10_overlap_mean']:.3f} (mean; min {a['top10_overlap_min']:.1f}), "
            f"same top-1 passage {a['top1_same']:.3f}, top-{result['k']} overlap "
            f"{a[f'top{k}_overlap_mean']:.3f}.",
        ]
    else:
        lines += ["", f"Lucene: {lu.get('skipped', 'not run')}"]
    lines += ["", f"fastdpr's first search (numba compilation) took {fd['first_search_compile_s']:.1f}s, excluded "
              "from the rates above. Lucene is called from Python through pyjnius and Anserini's SimpleSearcher, "
              "as pyserini does (its results carry each hit's stored document); both rates include turning hits "
              "into numpy arrays of ids and scores. Top-k: fraction of questions with an answer-bearing passage "
              "(DPR has_answer) in the top k."]
    write_text(out / "bm25.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'bm25.json'} and {out / 'bm25.md'}")


def _row(name, r):
    acc = r["accuracy"]
    return (f"| {name} | {r['index_s']:.1f} | {r['qps_1_thread']:.0f} | {r['qps_all_threads']:.0f} | "
            f"{acc['top1']:.3f} | {acc['top5']:.3f} | {acc['top20']:.3f} |")


if __name__ == "__main__":
    _common.exit_if_data_unavailable(main)
