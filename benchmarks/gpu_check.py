"""GPU check: correctness and speed of the CUDA paths, in one short run (≤ 8 minutes on one H200).

  1. the compiled Triton in-batch NLL against the float64 reference: loss, dQ, dP; fp32, bf16, fp16;
  2. fused vs eager (matmul + cross_entropy) forward+backward time and peak memory, B = 1,024 … 65,536, d = 768;
  3. passage encoding throughput, fp16 and bf16 autocast vs fp32, BERT-base shape (random weights: speed only);
  4. one GradCache training step at a very large batch against the same batch without GradCache where it fits;
  5. fp16 passages/s of fastdpr against sentence-transformers with fp16 weights, same BERT-base-shaped model, same
     texts, same batch size, interleaved, and their vectors' agreement;
  6. the negatives ablation (benchmarks/negatives_bench.py) at GPU size, from the folder that
     ``negatives_bench.py --pack .gpu/negatives`` wrote on a machine with the data (carried along as ``.gpu``).

    python benchmarks/gpu_check.py RESULTS_DIR [--sections 1,2,3,4]

Prints a short table last and writes RESULTS_DIR/gpu.json + gpu.md. Every section runs even if an earlier one
fails; a failure is printed and recorded, never hidden."""
from __future__ import annotations

import argparse
import json
import math
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

    from fastdpr.kernels.loss import _dot_precision

    rows = []
    shapes = ((37, 1, 768, False), (1000, 3, 384, True), (4096, 1, 768, False))
    for dtype, tol in ((torch.float32, 2e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)):
        # every shape autotunes afresh (about 18 s each on an H200): the half types get the two extremes
        for B, h, d, bidir in (shapes if dtype == torch.float32 else (shapes[0], shapes[2])):
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
            # these unnormalised inputs at scale 20 give logits near 3,000, which fp32 holds only to 2.4e-4 (the
            # kernels work in base 2, log2 e larger): the softmax weights inherit that as a relative error, and so
            # does the chunked PyTorch path (benchmarks/fp32_rounding.py), so the bound grows with the logits
            top = float((20.0 * q.detach().float() @ p.detach().float().T).abs().max()) * math.log2(math.e)
            bound = max(tol, 4 * 2.0 ** (math.floor(math.log2(top)) - 23))
            rows.append({"dtype": str(dtype).replace("torch.", ""), "B": B, "h": h, "d": d, "bidirectional": bidir,
                         "dot_precision": _dot_precision(dtype),
                         "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                         "max_logit": top / math.log2(math.e), "tolerance": bound,
                         **{f"rel_err_{k}": v for k, v in err.items()}, "ok": all(v < bound for v in err.values())})
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
    """fastdpr's own passage-encoding path (length-sorted batches, dynamic padding, inference_mode, autocast) on a
    BERT-base-shaped tower with random weights: speed only, so no pretrained model has to travel to the machine."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import tiny_bert_dir

    from fastdpr.models import BiEncoder

    rows = []
    tmp = tempfile.mkdtemp()
    path = tiny_bert_dir(tmp, hidden=768, layers=12, heads=12, intermediate=3072, max_position=512)
    model = BiEncoder.from_pretrained(path, pooling="cls", max_passage_length=256).cuda().eval()
    g = torch.Generator().manual_seed(0)
    n = 4096
    lengths = torch.randint(64, 257, (n,), generator=g).tolist()  # passages of 64..256 tokens, as in psgs_w100
    vocab = model.tokenizer.vocab_size
    seqs = [([2] + torch.randint(5, vocab, (L - 2,), generator=g).tolist() + [3], None) for L in lengths]
    reference = None
    for precision in ("float32", "float16", "bfloat16"):
        run = lambda: model.encode_token_lists(seqs, "passage", 256, "cuda", False, precision)  # noqa: E731
        run()  # warm-up (cuBLAS/cuDNN heuristics)
        _sync()
        t = time.perf_counter()
        vectors = run()
        _sync()
        sec = time.perf_counter() - t
        if reference is None:
            reference = vectors
        cos = (vectors * reference).sum(1) / (
            (vectors ** 2).sum(1) ** 0.5 * (reference ** 2).sum(1) ** 0.5)
        rows.append({"precision": precision, "passages_per_s": n / sec, "min_cosine_vs_fp32": float(cos.min()),
                     "batch": 256, "lengths": "64..256"})
    base = rows[0]["passages_per_s"]
    for r in rows:
        r["x_fp32"] = r["passages_per_s"] / base
    return rows


def section_encoding_vs_st() -> list[dict]:
    """fastdpr fp16 (packed, fp16 weights) against sentence-transformers with fp16 weights on the same random
    BERT-base-shaped directory (mean pooling: what sentence-transformers puts on a plain Hugging Face encoder)."""
    import tempfile

    import numpy as np
    from sentence_transformers import SentenceTransformer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import tiny_bert_dir, tiny_vocab

    from fastdpr.models import BiEncoder

    path = tiny_bert_dir(tempfile.mkdtemp(), hidden=768, layers=12, heads=12, intermediate=3072, max_position=512)
    words = [w for w in tiny_vocab() if w.isalpha() and len(w) > 2]
    rng = np.random.default_rng(0)
    n, batch = 8192, 128
    texts = [" ".join(rng.choice(words, size=int(rng.integers(60, 250)))) for _ in range(n)]
    fast = BiEncoder.from_pretrained(path, pooling="mean", shared=True, max_passage_length=256).cuda()
    st = SentenceTransformer(str(path), device="cuda").half()
    st.max_seq_length = 256
    runs = {"sentence-transformers fp16 weights": lambda: st.encode(texts, batch_size=batch, convert_to_numpy=True),
            "fastdpr fp16": lambda: fast.encode_passages(texts, batch_size=batch, precision="fp16",
                                                         show_progress=False)}
    for fn in runs.values():  # warm-up
        fn()
    times = {name: [] for name in runs}
    out = {}
    for round_ in range(3):
        for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
            _sync()
            t = time.perf_counter()
            out[name] = np.asarray(runs[name](), dtype=np.float32)
            _sync()
            times[name].append(time.perf_counter() - t)
    a, b = out["fastdpr fp16"], out["sentence-transformers fp16 weights"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rows = [{"method": name, "passages_per_s": n / sorted(t)[1], "batch": batch, "n": n,
             "tokens": "62..252 words"} for name, t in times.items()]
    rows[1]["x_sentence_transformers"] = rows[1]["passages_per_s"] / rows[0]["passages_per_s"]
    rows[1]["min_cosine_vs_st"] = float(cos.min())
    return rows


def section_grad_cache() -> list[dict]:
    from train_bench import grad_cache_step_benchmark
    from transformers import BertConfig

    return grad_cache_step_benchmark(BertConfig(num_hidden_layers=4), device="cuda")


def section_negatives(out: Path) -> list[dict]:
    """The ablation of negatives at a fixed batch (groups 8 … 1,024 of a batch of 1,024) on the packed data, sized
    to about 3 minutes of an H200; its own result files land in ``out``."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    pack = Path(os.environ.get("FASTDPR_NEGATIVES_PACK", repo / ".gpu" / "negatives"))
    if not (pack / "inputs.tar.xz").is_file():
        return [{"skipped": f"no packed inputs at {pack}: run `python benchmarks/negatives_bench.py --examples "
                            "16384 --pack .gpu/negatives` on a machine with the data and carry .gpu"}]
    cmd = [sys.executable, str(Path(__file__).with_name("negatives_bench.py")), "--device", "cuda",
           "--inputs", str(pack), "--model", str(pack / "model"), "--steps", os.environ.get("NEGATIVES_STEPS", "40"),
           "--chunk", "256", "--name", "negatives_gpu", "--out", str(out), "--work", str(out / "negatives_work")]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    data = json.loads((out / "negatives_gpu.json").read_text())
    return [{"system": name, "set": s, **m} for name, sets in data["metrics"].items() for s, m in sets.items()]


SECTIONS = {"1": ("triton_vs_reference", section_correctness), "2": ("loss_speed", section_loss_speed),
            "3": ("encoding", section_encoding), "4": ("grad_cache", section_grad_cache),
            "5": ("encoding_vs_sentence_transformers", section_encoding_vs_st), "6": ("negatives", section_negatives)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sections", default="6,1,2,3,5,4")
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
            rows = fn(args.out) if name in ("loss_speed", "negatives") else fn()
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
