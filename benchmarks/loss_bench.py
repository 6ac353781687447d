"""Forward+backward time and peak memory of the in-batch NLL: eager PyTorch (matmul + cross_entropy, the B×N score
matrix in memory) against fastdpr's ``inbatch_nll`` (fused Triton kernels on a GPU, the row-chunked fallback on
the CPU), over batch sizes B with N = B·(1 + hard negatives) passages of width d.

CPU (default)::

    python benchmarks/loss_bench.py --sizes 128,256,512,1024,2048,4096

  Each (method, B) runs in a fresh subprocess; peak memory is the growth of the process's peak resident set
  (VmHWM, reset through /proc/self/clear_refs) over its resident set just before the step.  fastdpr runs the
  PyTorch fallback here (no GPU), so the numbers show its memory bound, not the Triton kernels' speed.

GPU::

    python benchmarks/loss_bench.py --device cuda --dtype bfloat16 --sizes 128,1024,4096,16384,65536

  Runs in-process; peak memory is ``torch.cuda.max_memory_allocated`` over what was allocated before the step,
  times are CUDA-event medians after warm-up (the warm-up includes Triton's autotuning).  With half inputs the
  eager baseline does what autocast does: matmul in the input dtype, cross_entropy in fp32.

Configurations whose estimated memory exceeds ``--budget-gb`` are skipped and reported as such, not run.
Results go to ``benchmarks/results/loss_bench_<device>.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1024 ** 3


# ---------------------------------------------------------------------------------------------------------------
# One forward+backward step of each method
# ---------------------------------------------------------------------------------------------------------------

def make_inputs(batch, dim, hard, dtype, device, seed=0):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    n_cols = batch * (1 + hard)
    q = (torch.randn(batch, dim, generator=gen) / dim ** 0.5).to(device=device, dtype=dtype).requires_grad_()
    p = (torch.randn(n_cols, dim, generator=gen) / dim ** 0.5).to(device=device, dtype=dtype).requires_grad_()
    targets = (torch.arange(batch) * (1 + hard)).to(device)
    return q, p, targets


def step(method, q, p, targets, scale, backend):
    """One forward+backward; returns the loss value as a Python float (after the backward)."""
    import torch

    q.grad = None
    p.grad = None
    if method == "eager":
        # the scale goes on q (B×d) rather than on the B×N scores, so eager holds no extra score-sized copy
        scores = (q * scale if scale != 1.0 else q) @ p.t()
        if scores.dtype != torch.float32:
            scores = scores.float()  # what autocast does for cross_entropy
        loss = torch.nn.functional.cross_entropy(scores, targets)
    else:
        from fastdpr.kernels import inbatch_nll

        loss = inbatch_nll(q, p, targets, scale=scale, backend=backend)
    loss.backward()
    return loss.detach()


def estimate_bytes(method, batch, n_cols, dim, elem):
    """Rough peak of one step, for skipping what cannot fit: inputs and their gradients, plus, for eager, the
    score matrix, its log-softmax and their gradients (fp32); for fastdpr a few chunks of scores."""
    inputs = 2 * (batch + n_cols) * dim * elem
    if method == "eager":
        return inputs + 4 * batch * n_cols * 4
    return inputs + 3 * (batch + n_cols) * dim * 4 + 3 * (1 << 22) * 4


# ---------------------------------------------------------------------------------------------------------------
# CPU: one subprocess per configuration, peak RSS growth
# ---------------------------------------------------------------------------------------------------------------

def _rss_kib(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def cpu_worker(args):
    """Runs inside the subprocess: prints one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    # a tiny step first, so that imports and first-call setup are not counted as the step's memory
    step(args.method, *make_inputs(8, args.dim, args.hard_negatives, dtype, "cpu"), args.scale, "torch")
    q, p, targets = make_inputs(args.batch, args.dim, args.hard_negatives, dtype, "cpu")
    # the gradients are part of every method's footprint; allocate them inside the measured step
    times, memory, loss = [], None, None
    for rep in range(args.repeats):
        q.grad = p.grad = None
        rss_before = _rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current RSS
            fh.write("5")
        start = time.perf_counter()
        loss = step(args.method, q, p, targets, args.scale, "torch")
        times.append(time.perf_counter() - start)
        peak = _rss_kib("VmHWM")
        memory = max(memory or 0, (peak - rss_before) * 1024)
    print(json.dumps({"times_s": times, "peak_bytes": memory, "loss": float(loss)}))


def run_cpu(args):
    rows = []
    for batch in args.sizes:
        n_cols = batch * (1 + args.hard_negatives)
        for method in ("eager", "fastdpr"):
            est = estimate_bytes(method, batch, n_cols, args.dim, 4)
            row = {"method": method, "backend": "torch-fallback" if method == "fastdpr" else "eager",
                   "B": batch, "N": n_cols, "d": args.dim, "dtype": args.dtype, "estimate_bytes": est}
            if est > args.budget_gb * GIB:
                row["status"] = f"skipped: estimated {est / GIB:.1f} GiB > budget {args.budget_gb} GiB"
                print(f"B={batch:>6} {method:8s} {row['status']}", flush=True)
                rows.append(row)
                continue
            repeats = args.repeats if batch <= args.repeat_below else 1
            cmd = [sys.executable, __file__, "--_worker", "--method", method, "--batch", str(batch),
                   "--dim", str(args.dim), "--hard-negatives", str(args.hard_negatives), "--dtype", args.dtype,
                   "--scale", str(args.scale), "--threads", str(args.threads), "--repeats", str(repeats)]
            env = dict(os.environ)
            env.pop("TRITON_INTERPRET", None)  # the fallback is what runs on a CPU without the interpreter
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                row["status"] = f"failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}"
            else:
                res = json.loads(out.stdout.strip().splitlines()[-1])
                row.update(status="ok", time_ms=1000 * statistics.median(res["times_s"]),
                           times_ms=[1000 * t for t in res["times_s"]], peak_bytes=res["peak_bytes"],
                           loss=res["loss"])
            print(f"B={batch:>6} {method:8s} {row.get('status')} "
                  f"{row.get('time_ms', float('nan')):10.1f} ms  {row.get('peak_bytes', 0) / 2**20:9.1f} MiB",
                  flush=True)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# GPU: in-process, CUDA events and the caching allocator's peak
# ---------------------------------------------------------------------------------------------------------------

def run_cuda(args):
    import torch

    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    total = torch.cuda.get_device_properties(device).total_memory
    budget = min(args.budget_gb * GIB, 0.9 * total)
    rows = []
    for batch in args.sizes:
        n_cols = batch * (1 + args.hard_negatives)
        for method in ("eager", "fastdpr"):
            est = estimate_bytes(method, batch, n_cols, args.dim, elem)
            row = {"method": method, "backend": "triton" if method == "fastdpr" else "eager", "B": batch,
                   "N": n_cols, "d": args.dim, "dtype": args.dtype, "estimate_bytes": est}
            if est > budget:
                row["status"] = f"skipped: estimated {est / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB"
                print(f"B={batch:>6} {method:8s} {row['status']}", flush=True)
                rows.append(row)
                continue
            try:
                q, p, targets = make_inputs(batch, args.dim, args.hard_negatives, dtype, device)
                for _ in range(args.warmup):  # includes autotuning on the first fastdpr call
                    step(method, q, p, targets, args.scale, "triton")
                torch.cuda.synchronize()
                q.grad = p.grad = None
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
                loss = step(method, q, p, targets, args.scale, "triton")
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated(device) - before
                times = []
                for _ in range(args.repeats):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    step(method, q, p, targets, args.scale, "triton")
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                row.update(status="ok", time_ms=statistics.median(times), times_ms=times, peak_bytes=peak,
                           loss=float(loss))
            except torch.cuda.OutOfMemoryError as exc:
                row["status"] = f"out of memory: {str(exc).splitlines()[0]}"
            finally:
                q = p = targets = None
                torch.cuda.empty_cache()
            print(f"B={batch:>6} {method:8s} {row.get('status')} "
                  f"{row.get('time_ms', float('nan')):10.2f} ms  {row.get('peak_bytes', 0) / 2**20:9.1f} MiB",
                  flush=True)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------

def _fmt_mem(row):
    return f"{row['peak_bytes'] / 2**20:,.1f} MiB" if row.get("status") == "ok" else "—"


def useful_tflops(row):
    """3 products of B·N·d multiply-adds (2 FLOPs each) over the step's time; None for a row that did not run."""
    if row.get("status") != "ok":
        return None
    return 3 * 2 * row["B"] * row["N"] * row["d"] / (row["time_ms"] / 1e3) / 1e12


def _fmt_tflops(row):
    value = useful_tflops(row)
    return "—" if value is None else f"{value:,.1f}" if value >= 1 else f"{value:.3g}"


def _fmt_time(row):
    return f"{row['time_ms']:,.2f} ms" if row.get("status") == "ok" else row.get("status", "—")


def markdown(meta, rows):
    lines = [f"# In-batch NLL loss: forward + backward ({meta['device']})", "",
             f"Command: `{meta['command']}`", "",
             f"Machine: {meta['machine']}; torch {meta['torch']}; threads {meta['threads']}; "
             f"d = {meta['d']}, {meta['hard_negatives']} hard negative(s) per query "
             f"(N = B·{1 + meta['hard_negatives']}), "
             f"dtype {meta['dtype']}; fastdpr backend: {meta['fastdpr_backend']}.", "",
             f"Memory: {meta['memory_method']}", "",
             f"Load average (1 min) at start / end: {meta['load_start']} / {meta['load_end']} "
             "(other work on a shared machine inflates and scatters CPU times).", "",
             "| B | N | eager time | fastdpr time | speed-up | eager TFLOP/s | fastdpr TFLOP/s | eager peak | "
             "fastdpr peak | memory ratio | loss diff |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_key = {(r["B"], r["method"]): r for r in rows}
    for batch in sorted({r["B"] for r in rows}):
        e, f = by_key.get((batch, "eager"), {}), by_key.get((batch, "fastdpr"), {})
        both = e.get("status") == "ok" and f.get("status") == "ok"
        speed = f"{e['time_ms'] / f['time_ms']:.2f}×" if both else "—"
        mem = f"{e['peak_bytes'] / max(f['peak_bytes'], 1):.1f}×" if both else "—"
        dloss = f"{abs(e['loss'] - f['loss']):.1e}" if both else "—"
        lines.append(f"| {batch:,} | {f.get('N', e.get('N', 0)):,} | {_fmt_time(e)} | {_fmt_time(f)} | {speed} | "
                     f"{_fmt_tflops(e)} | {_fmt_tflops(f)} | {_fmt_mem(e)} | {_fmt_mem(f)} | {mem} | {dloss} |")
    lines += ["", "Times are medians of the repeats listed in the JSON; speed-up and memory ratio are eager / fastdpr; "
              "loss diff is |eager loss − fastdpr loss|. TFLOP/s = 3 · 2·B·N·d / time: the useful matrix work of "
              "a step (forward S = s·Q·Pᵀ, backward dQ = dS·P and dP = dSᵀ·Q); the fused kernels' recomputation of "
              "S in the backward is not credited.", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--sizes", default="128,256,512,1024,2048,4096",
                        help="comma-separated batch sizes B (queries)")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--hard-negatives", type=int, default=1)
    parser.add_argument("--dtype", default=None, help="float32 (CPU default), float16 or bfloat16 (GPU default)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repeat-below", type=int, default=1024,
                        help="CPU: sizes above this run once (a single step already takes seconds)")
    parser.add_argument("--warmup", type=int, default=2, help="GPU warm-up steps (autotuning happens here)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--budget-gb", type=float, default=None,
                        help="skip configurations estimated above this (default: 6 on CPU, 90%% of GPU memory)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quick", action="store_true", help="B = 128..1024, one repeat (smoke run)")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args._worker:
        cpu_worker(args)
        return 0
    if args.quick:
        args.sizes, args.repeats = "128,256,512,1024", 1
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.budget_gb is None:
        args.budget_gb = 6.0 if args.device == "cpu" else 1e9

    import torch

    load_start = round(os.getloadavg()[0], 2)
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python", "benchmarks/loss_bench.py"] + [shlex.quote(a) for a in given])
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda: no CUDA device visible", file=sys.stderr)
            return 2
        machine = torch.cuda.get_device_name(0)
        rows = run_cuda(args)
        memory_method = "torch.cuda.max_memory_allocated during one step, minus memory allocated before it."
        backend = "triton (compiled, autotuned)"
    else:
        machine = f"{cpu_model()}, {os.cpu_count()} logical CPUs"
        rows = run_cpu(args)
        memory_method = ("growth of peak resident memory (VmHWM, reset via /proc/self/clear_refs) over resident "
                         "memory just before one step, in a fresh process per configuration; includes the "
                         "gradients of q and p.")
        backend = "torch row-chunked fallback (no GPU here)"
    meta = {"device": args.device, "command": command, "machine": machine, "torch": torch.__version__,
            "threads": args.threads if args.device == "cpu" else None, "d": args.dim,
            "hard_negatives": args.hard_negatives, "dtype": args.dtype, "fastdpr_backend": backend,
            "memory_method": memory_method, "budget_gb": args.budget_gb,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_start": load_start, "load_end": round(os.getloadavg()[0], 2)}

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastdpr.atomic import write_json, write_text

    for row in rows:
        row["tflops"] = useful_tflops(row)
    out = Path(args.out)
    write_json(out / f"loss_bench_{args.device}.json", {"meta": meta, "rows": rows})
    text = markdown(meta, rows)
    write_text(out / f"loss_bench_{args.device}.md", text)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
