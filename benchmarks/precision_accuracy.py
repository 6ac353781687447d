"""Retrieval accuracy of each encoding precision on the quickstart's sets.

The fine-tuned model of a finished quickstart run encodes the run's corpus (every paragraph of the published QA
sets) and its five test sets' questions (NQ test, SQuAD, new Wikipedia test, and the unseen domains Reddit and
Amazon) in fp32, bf16 and int8; exact inner-product search; DPR's top-k accuracy
(the answer string in a retrieved passage). What a faster precision costs where it matters: in retrieval, not in
cosine similarity.

    fastdpr quickstart --out RUN
    python benchmarks/precision_accuracy.py --run RUN [--precisions fp32,bf16,int8] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="output directory of a finished `fastdpr quickstart`")
    ap.add_argument("--precisions", default="fp32,bf16,int8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    from fastdpr.data import sources
    from fastdpr.index import build_index
    from fastdpr.models import BiEncoder
    from fastdpr.quickstart.config import QuickstartConfig
    from fastdpr.quickstart.experiment import Workspace, evaluate_retriever, trained_model_path
    from fastdpr.quickstart.report import DATASETS
    from fastdpr.retrieve import DenseRetriever

    torch.set_num_threads(args.threads)
    datasets = list(DATASETS)
    missing = [d for d in datasets if not (args.run / "questions" / f"{d}.jsonl").is_file()]
    if missing or not (args.run / "corpus.jsonl").is_file():
        raise SystemExit(f"--run {args.run}: not a finished quickstart run (no corpus.jsonl or questions {missing})")
    ws = Workspace(QuickstartConfig.preset(), args.run, sources.default_cache(), print)
    model = BiEncoder.from_pretrained(trained_model_path(ws))
    model.eval()
    corpus = ws.corpus()
    passages = list(corpus)
    rows = []
    for precision in [p.strip() for p in args.precisions.split(",") if p.strip()]:
        start = time.perf_counter()
        vectors = model.encode_passages(passages, batch_size=32, precision=precision, show_progress=False)
        seconds = time.perf_counter() - start
        retriever = DenseRetriever(model, build_index(vectors, "flat"), corpus, precision=precision)
        for dataset in datasets:
            acc = evaluate_retriever(ws, retriever, dataset)
            rows.append({"precision": precision, "dataset": dataset, "questions": len(ws.questions(dataset)),
                         **{f"top{k}": acc[f"top{k}"] for k in (1, 5, 20, 100)},
                         "encode_s": round(seconds, 1)})
        print(f"{precision}: " + ", ".join(f"{r['dataset']} top-20 {r['top20']:.3f}" for r in rows
                                           if r["precision"] == precision), flush=True)
    reference = {r["dataset"]: r for r in rows if r["precision"] == "fp32"}
    for r in rows:
        if r["dataset"] in reference and r["precision"] != "fp32":
            r["top20_minus_fp32"] = round(r["top20"] - reference[r["dataset"]]["top20"], 4)
    md = (f"Fine-tuned model of the quickstart run `{args.run}`, its {len(passages):,}-passage corpus, exact search, "
          f"{args.threads} thread(s); DPR top-k accuracy.\n\n"
          + _common.markdown_table(rows, ["precision", "dataset", "questions", "top1", "top5", "top20", "top100",
                                          "top20_minus_fp32", "encode_s"], floatfmt=".3f") + "\n")
    path = _common.write_results("precision_accuracy", args.out, {"run": str(args.run), "rows": rows}, md)
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
