"""GPU check: correctness and speed of the CUDA paths, in one short run (≤ 8 minutes on one H200).

  1. the compiled Triton in-batch NLL against the float64 reference: loss, dQ, dP; fp32, bf16, fp16;
  2. fused vs eager (matmul + cross_entropy) forward+backward time and peak memory, B = 1,024 … 65,536, d = 768;
  3. passage encoding throughput, fp16 and bf16 autocast vs fp32, BERT-base shape (random weights: speed only);
  4. one GradCache training step at a very large batch against the same batch without GradCache where it fits.

    python benchmarks/gpu_check.py RESULTS_DIR [--sections 1,2,3,4]

Prints a short table last and writes RESULTS_DIR/gpu.json + gpu.md. Every section runs even if an earlier one
fails; a failure is printed and recorded, never hidden."""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch  # noqa: E402  (the machine's own CUDA build)

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import machine, markdown_table, command_line  # noqa: E402


def _sync():
    torch.cuda.synchronize()


def _time_cuda(fn, warmup: int = 2, repeat: int = 5) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        _sync()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def _inputs(B: int, h: int, d: int, dtype, seed: int, scale_q: float = 1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(B, d, device="cuda", generator=g) * scale_q).to(dtype)
    p = torch.randn(B * (1 + h), d, device="cuda", generator=g).to(dtype)
    targets = torch.arange(B, device="cuda") * (1 + h)
    return q, p, targets


def section_correctness() -> list[dict]:
    from fastdpr.kernels import inbatch_nll

    rows = []
    for dtype, tol in ((torch.float32, 2e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)):
        for B, h, d, bidir in ((37, 1, 768, False), (1000, 3, 384, True), (4096, 1, 768, False)):
            q, p, t = _inputs(B, h, d, dtype, seed=B + d)
            ids = torch.arange(p.shape[0], device="cuda")
            ids[1] = ids[0] if h > 0 else ids[1]  # one duplicated passage id: a masked false negative
            q.requires_grad_(True)
            p.requires_grad_(True)
            loss = inbatch_nll(q, p, t, scale=20.0, column_ids=ids, bidirectional=bidir, backend="triton")
            gq, gp = torch.autograd.grad(loss, (q, p))
            q64 = q.detach().double().requires_grad_(True)
            p64 = p.detach().double().requires_grad_(True)
            ref = inbatch_nll(q64, p64, t, scale=20.0, column_ids=ids, bidirectional=bidir, backend="reference")
            rq, rp = torch.autograd.grad(ref, (q64, p64))

            def rel(a, b):
                return float((a.double() - b).abs().max() / (b.abs().max() + 1e-12))

            err = {"loss": abs(float(loss) - float(ref)) / max(abs(float(ref)), 1e-12),
                   "dq": rel(gq, rq), "dp": rel(gp, rp)}
            rows.append({"dtype": str(dtype).replace("torch.", ""), "B": B, "h": h, "d": d, "bidirectional": bidir,
                         **{f"rel_err_{k}": v for k, v in err.items()}, "ok": all(v < tol for v in err.values())})
    return rows


def section_loss_speed(out: Path) -> list[dict]:
    """Delegates to benchmarks/loss_bench.py (the same script as the CPU rows), CUDA events and
    torch.cuda.max_memory_allocated; eager sizes that cannot fit are skipped by its memory estimate."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).with_name("loss_bench.py")), "--device", "cuda", "--dtype", "bfloat16",
           "--sizes", "1024,4096,16384,65536", "--out", str(out)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=240)
    newest = max(out.glob("loss*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(newest.read_text())
    return data.get("rows", [data])


def section_encoding() -> list[dict]:
    from transformers import BertConfig, BertModel

    rows = []
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()  # BERT-base shape; random weights (speed only)
    n, L, batch = 4096, 256, 256
    ids = torch.randint(1000, 30000, (n, L), device="cuda")
    mask = torch.ones_like(ids)
    for name, dtype in (("fp32", None), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        def run():
            with torch.inference_mode(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                for i in range(0, n, batch):
                    model(input_ids=ids[i:i + batch], attention_mask=mask[i:i + batch]).last_hidden_state[:, 0]
        sec = _time_cuda(run, warmup=1, repeat=3)
        rows.append({"precision": name, "passages_per_s": n / sec, "max_len": L, "batch": batch})
    base = rows[0]["passages_per_s"]
    for r in rows:
        r["x_fp32"] = r["passages_per_s"] / base
    return rows


def section_grad_cache() -> list[dict]:
    from train_bench import grad_cache_step_benchmark
    from transformers import BertConfig

    return grad_cache_step_benchmark(BertConfig(num_hidden_layers=4), device="cuda")


SECTIONS = {"1": ("triton_vs_reference", section_correctness), "2": ("loss_speed", section_loss_speed),
            "3": ("encoding", section_encoding), "4": ("grad_cache", section_grad_cache)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sections", default="1,2,3,4")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU check needs one", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"command": command_line(), "machine": machine(), "sections": {}}
    md = ""
    for key in args.sections.split(","):
        name, fn = SECTIONS[key]
        t = time.perf_counter()
        try:
            rows = fn(args.out) if name == "loss_speed" else fn()
            results["sections"][name] = {"rows": rows, "seconds": time.perf_counter() - t}
            md += f"### {name}\n\n" + markdown_table(rows) + "\n"
        except Exception as err:
            results["sections"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            md += f"### {name}\n\nFAILED: {type(err).__name__}: {err}\n\n"
            traceback.print_exc()
        (args.out / "gpu.json").write_text(json.dumps(results, indent=2, default=str))
    m = results["machine"]
    header = f"## gpu\n\nCommand: `{results['command']}`  \nMachine: {m['gpu']}, {m['cpu']}; {m['date']}\n\n"
    (args.out / "gpu.md").write_text(header + md)
    print("\n" + header + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
