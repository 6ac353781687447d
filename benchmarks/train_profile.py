"""Where a training step's time goes: one GradCache step of each arm of ``train_vs_st.py`` under torch's profiler,
with the time of the matrix products (``aten::mm``, ``addmm``, ``bmm``) apart from everything else.

Both arms compute the same matrix products (same model, text, loss, chunking), so the products set a floor under
any speed-up one arm can get over the other: if fastdpr's linear layers alone take longer than sentence-transformers'
step divided by the target ratio, no change around them reaches that ratio.

Each arm runs in a fresh 1-thread process: model and data as in ``train_vs_st.py``, a warm-up step, one timed step
without the profiler, then one step under it (the profiler adds overhead, so the profiled totals run above the timed
step; the shares are what it is for).

    python benchmarks/train_profile.py                       # batch 128, fp32
    python benchmarks/train_profile.py --batch 128 --precision bf16
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = ("fastdpr", "sentence-transformers")
PRODUCTS = {"linear": ("aten::mm", "aten::addmm"), "attention": ("aten::bmm",)}


def run_worker(opts) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import train_vs_st

    torch.set_num_threads(1)
    torch.manual_seed(0)
    arm = (train_vs_st.FastdprArm if opts.arm == "fastdpr" else train_vs_st.SentenceTransformersArm)(opts)
    arm.step(arm.warm_batch(opts.warmup_batch))
    start = time.perf_counter()
    arm.step(arm.batch(0))
    step_s = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        arm.step(arm.batch(1))
    self_s = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    out = {"arm": opts.arm, "batch": opts.batch, "precision": opts.precision, "step_s": step_s,
           "profiled_total_s": sum(self_s.values())}
    for name, ops in PRODUCTS.items():
        out[f"{name}_products_s"] = sum(self_s.get(op, 0.0) for op in ops)
    out["other_s"] = out["profiled_total_s"] - sum(out[f"{name}_products_s"] for name in PRODUCTS)
    out["top"] = sorted(((round(v, 3), k) for k, v in self_s.items()), reverse=True)[:12]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--q-len", type=int, default=32)
    ap.add_argument("--p-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--warmup-batch", type=int, default=32)
    ap.add_argument("--target", type=float, default=1.5, help="the speed-up whose floor is reported")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--name", default="train_profile")
    ap.add_argument("--_worker", choices=ARMS, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    opts.steps = 2
    if opts._worker:
        opts.arm = opts._worker
        print(json.dumps(run_worker(opts)))
        return 0

    from _common import markdown_table, write_results

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    env.pop("TRITON_INTERPRET", None)
    rows = {}
    for arm in ARMS:
        cmd = [sys.executable, __file__, "--_worker", arm]
        for name in ("batch", "precision", "chunk", "q_len", "p_len", "lr", "warmup_batch"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(opts, name))]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{arm} failed:\n{proc.stderr[-3000:]}")
        rows[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(rows[arm]), flush=True)
    fast, st = rows["fastdpr"], rows["sentence-transformers"]
    budget = st["step_s"] / opts.target
    # the profiled products, scaled to the unprofiled step: the profiler's overhead falls on every operator
    linear_in_step = fast["linear_products_s"] * fast["step_s"] / fast["profiled_total_s"]
    summary = {"batch": opts.batch, "precision": opts.precision, "st_step_s": st["step_s"],
               "fastdpr_step_s": fast["step_s"], "speedup": st["step_s"] / fast["step_s"],
               "budget_s_at_target": budget, "fastdpr_linear_products_s": linear_in_step,
               "linear_share": fast["linear_products_s"] / fast["profiled_total_s"],
               "ceiling_if_only_linear": st["step_s"] / linear_in_step}
    table = [{k: v for k, v in r.items() if k != "top"} for r in (fast, st)]
    body = (f"One step of batch {opts.batch}, {opts.precision}, 1 thread, each arm in its own process (timed without "
            "the profiler, then profiled). Seconds are self CPU time per operator group.\n\n"
            + markdown_table(table) + f"\nAgainst a {opts.target}x target:\n\n" + markdown_table([summary])
            + "\n`fastdpr_linear_products_s` is the profiled share of the linear layers' products applied to the "
            "unprofiled step; `ceiling_if_only_linear` is the speed-up if everything else in fastdpr's step took "
            "no time at all.\n\nLargest operators (seconds, profiled):\n\n"
            + "\n".join(f"- {arm}: " + ", ".join(f"{k} {v}" for v, k in rows[arm]["top"]) for arm in ARMS) + "\n")
    path = write_results(opts.name, opts.out, {"settings": vars(opts) | {"_worker": None}, "arms": rows,
                                               "summary": summary}, body)
    print(body)
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
