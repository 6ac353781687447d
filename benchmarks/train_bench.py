"""Training benchmark: the largest batch that trains within a memory budget, with and without GradCache, and the
time per example of each.

Each configuration runs in a fresh subprocess (CPU) so its peak memory is that process's resident-set high-water
mark (``ru_maxrss``): everything the step touches counts (activations, Adam state, allocator slack), not only what
Python's tracemalloc sees. On CUDA the peak is ``torch.cuda.max_memory_allocated`` of one in-process run per
configuration (reset in between). A step is the full ``Trainer`` step: tokenising, encoding, the fused loss,
backward, gradient clipping and AdamW.

The batch doubles from ``--start-batch`` until a step no longer fits the budget (or ``--max-batch``): plain
training first, then GradCache from the plain maximum upwards. Time per example is the median over ``--steps``
timed steps (after one warm-up step) at each mode's largest fitting batch, and for GradCache also at the plain
maximum (a like-for-like overhead). On the CPU the ratios use the process CPU time of the step (one thread), which a
busy shared machine disturbs far less than wall time; both are reported.

Against sentence-transformers' CachedMultipleNegativesRankingLoss on a real model and text (throughput and peak
memory at equal batch): benchmarks/train_vs_st.py.

    python benchmarks/train_bench.py --budget-mb 1500               # CPU, small random BERT
    python benchmarks/train_bench.py --device cuda --budget-mb 8192 --hidden 768 --layers 4 --p-len 128
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = 2000  # synthetic vocabulary: one token per word, so text length = token count


def _vocab() -> list[str]:
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(WORDS)]


def build_model(workdir: Path, hidden: int, layers: int, heads: int, intermediate: int, q_len: int, p_len: int):
    """A randomly initialised BERT dual encoder (separate towers, [CLS], dot: the DPR shape) with a WordPiece
    tokenizer over a synthetic vocabulary; built offline, speed and memory only."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from fastdpr.models import BiEncoder, BiEncoderConfig

    (workdir / "vocab.txt").write_text("\n".join(_vocab()) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(workdir / "vocab.txt"), do_lower_case=True)
    config = BertConfig(vocab_size=len(_vocab()), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate,
                        max_position_embeddings=max(q_len, p_len) + 8)
    dirs = []
    for name, seed in (("q", 0), ("p", 1)):
        torch.manual_seed(seed)
        path = workdir / name
        BertModel(config, add_pooling_layer=False).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    cfg = BiEncoderConfig(max_question_length=q_len, max_passage_length=p_len)
    return BiEncoder.from_encoders(dirs[0], dirs[1], config=cfg)


def make_examples(n: int, q_len: int, p_len: int, seed: int = 0):
    """``n`` questions, each with a positive and one hard negative, long enough to fill the token limits."""
    import numpy as np

    from fastdpr.train.data import examples_from_records

    rng = np.random.default_rng(seed)

    def text(length):
        return " ".join(f"w{i}" for i in rng.integers(0, WORDS, size=length))

    records = []
    for i in range(n):
        records.append({
            "question": text(q_len),
            "positive_ctxs": [{"title": "", "text": text(p_len), "passage_id": f"p{i}"}],
            "hard_negative_ctxs": [{"title": "", "text": text(p_len), "passage_id": f"h{i}"}],
        })
    return examples_from_records(records)


def run_config(opts: argparse.Namespace, batch: int, grad_cache: bool, steps: int) -> dict:
    """One configuration in this process: ``steps`` optimizer steps (the first is a warm-up, excluded from the
    times when there are more); returns peak memory and the step times. Two steps suffice for the memory peak:
    the second one holds activations, gradients and the Adam state at once."""
    import torch

    from fastdpr.train.biencoder import BiEncoderArguments, BiEncoderTask
    from fastdpr.train.trainer import Trainer, TrainingArguments

    torch.set_num_threads(opts.threads)
    device = torch.device(opts.device)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), opts.hidden, opts.layers, opts.heads, opts.intermediate, opts.q_len,
                            opts.p_len)
        examples = make_examples(batch * steps, opts.q_len, opts.p_len)
        args = TrainingArguments(output_dir=str(Path(tmp) / "out"), batch_size=batch, lr=1e-5,
                                 precision=opts.precision, device=str(device), show_progress=False)
        task_args = BiEncoderArguments(n_hard=1, grad_cache=grad_cache, chunk_size=opts.chunk_size,
                                       loss_backend="auto")
        trainer = Trainer(BiEncoderTask(model, examples, task_args), args)
        trainer._setup()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        baseline_mb = (torch.cuda.memory_allocated() / 2**20 if device.type == "cuda"
                       else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        times, cpu_times, losses = [], [], []
        for step in range(steps):
            b = trainer.task.builder.batch(0, step)
            start, cpu_start = time.perf_counter(), time.process_time()
            losses.append(float(trainer.training_step(b)))
            trainer.optimizer_step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    timed, cpu_timed = times[1:] or times, cpu_times[1:] or cpu_times
    return {"batch": batch, "grad_cache": grad_cache, "peak_mb": peak, "baseline_mb": baseline_mb,
            "step_s": statistics.median(timed), "ms_per_example": 1e3 * statistics.median(timed) / batch,
            "cpu_ms_per_example": 1e3 * statistics.median(cpu_timed) / batch,
            "loss": losses[-1], "steps_timed": len(timed)}


def measure(opts: argparse.Namespace, batch: int, grad_cache: bool, timed: bool) -> dict:
    """Run one configuration; on the CPU in a fresh subprocess (a clean RSS high-water mark)."""
    if opts.device == "cuda":
        import torch

        try:
            result = run_config(opts, batch, grad_cache, opts.steps + 1 if timed else 2)
        except torch.OutOfMemoryError:
            result = {"batch": batch, "grad_cache": grad_cache, "peak_mb": float("inf"), "oom": True}
        torch.cuda.empty_cache()
        return result
    steps = opts.steps + 1 if timed else 2
    cmd = [sys.executable, __file__, "--_worker", "--batch", str(batch), "--steps", str(steps)]
    cmd += ["--grad-cache"] if grad_cache else []
    for name in ("device", "hidden", "layers", "heads", "intermediate", "q_len", "p_len", "chunk_size",
                 "precision", "threads"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(opts, name))]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(opts.threads)}
    env.pop("TRITON_INTERPRET", None)  # the CPU run uses the chunked torch loss, not the interpreter
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        # killed for memory, or failed: reported as not fitting, with the reason
        return {"batch": batch, "grad_cache": grad_cache, "peak_mb": float("inf"),
                "error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest_fitting(opts, grad_cache: bool, start: int, log) -> tuple[int | None, list[dict]]:
    rows, best, batch = [], None, start
    while batch <= opts.max_batch:
        row = measure(opts, batch, grad_cache, timed=False)
        rows.append(row)
        log(row)
        if row["peak_mb"] > opts.budget_mb:
            break
        best = batch
        batch *= 2
    return best, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--budget-mb", type=float, default=1500, help="peak memory budget (CPU: process RSS)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--q-len", type=int, default=16)
    ap.add_argument("--p-len", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=32)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--start-batch", type=int, default=8)
    ap.add_argument("--max-batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--out", help="results directory (default benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help="a tiny model, batches up to 64, one timed step (smoke run)")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--grad-cache", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.quick and not opts._worker:
        opts.hidden, opts.intermediate, opts.max_batch, opts.steps, opts.chunk_size = 32, 64, 64, 1, 8

    if opts._worker:
        print(json.dumps(run_config(opts, opts.batch, opts.grad_cache, opts.steps)))
        return 0

    def log(row):
        print(json.dumps(row), flush=True)

    plain_max, plain_rows = largest_fitting(opts, False, opts.start_batch, log)
    if plain_max is None:
        print(f"plain training does not fit {opts.budget_mb} MB even at batch {opts.start_batch}", file=sys.stderr)
        return 1
    gc_max, gc_rows = largest_fitting(opts, True, plain_max, log)
    timed = {
        "plain@plain_max": measure(opts, plain_max, False, timed=True),
        "grad_cache@plain_max": measure(opts, plain_max, True, timed=True),
    }
    if gc_max and gc_max != plain_max:
        timed["grad_cache@gc_max"] = measure(opts, gc_max, True, timed=True)
    for row in timed.values():
        log(row)
    # on a shared CPU the process CPU time (one thread) is the honest cost; wall time is reported beside it
    key = "cpu_ms_per_example" if opts.device == "cpu" else "ms_per_example"
    base = timed["plain@plain_max"][key]
    summary = {
        "budget_mb": opts.budget_mb,
        "plain_max_batch": plain_max,
        "grad_cache_max_batch": gc_max,
        "grad_cache_search_capped": bool(gc_max and gc_max * 2 > opts.max_batch),
        "batch_ratio": (gc_max or 0) / plain_max,
        "time_measure": "process CPU time" if opts.device == "cpu" else "wall time",
        "time_per_example_ratio_at_max": timed.get("grad_cache@gc_max", timed["grad_cache@plain_max"])[key] / base,
        "time_per_example_ratio_same_batch": timed["grad_cache@plain_max"][key] / base,
    }
    from _common import markdown_table, write_results

    settings = {k: getattr(opts, k) for k in ("device", "hidden", "layers", "heads", "intermediate", "q_len",
                                                "p_len", "chunk_size", "precision", "threads", "steps")}
    table = [{"run": name, **{k: row.get(k) for k in ("batch", "peak_mb", "step_s", "ms_per_example",
                                                      "cpu_ms_per_example")}}
             for name, row in timed.items()]
    search = [{k: row.get(k) for k in ("grad_cache", "batch", "peak_mb", "error", "oom")}
              for row in plain_rows + gc_rows]
    body = (markdown_table([summary]) + "\nTimed runs (median of the timed steps):\n\n" + markdown_table(table)
            + "\nSearch:\n\n" + markdown_table(search))
    name = "train_bench_cuda" if opts.device == "cuda" else "train_bench_cpu"
    path = write_results(name, opts.out, {"settings": settings, "summary": summary, "timed": timed,
                                          "search": plain_rows + gc_rows}, body)
    print(body)
    print(f"written {path}")
    return 0


def grad_cache_step_benchmark(bert_config, device: str = "cuda", budget_mb: float = 16384,
                              max_batch: int = 8192) -> list[dict]:
    """For the GPU check script: the same search on CUDA with ``bert_config``'s sizes; returns the timed rows
    and a summary row."""
    opts = argparse.Namespace(
        device=device, budget_mb=budget_mb, hidden=bert_config.hidden_size, layers=bert_config.num_hidden_layers,
        heads=bert_config.num_attention_heads, intermediate=bert_config.intermediate_size, q_len=32, p_len=128,
        chunk_size=64, precision="bf16", threads=1, start_batch=32, max_batch=max_batch, steps=2)
    plain_max, _ = largest_fitting(opts, False, opts.start_batch, lambda row: None)
    rows = []
    if plain_max is None:
        return [{"error": f"plain training does not fit {budget_mb} MB at batch {opts.start_batch}"}]
    gc_max, _ = largest_fitting(opts, True, plain_max, lambda row: None)
    plain = measure(opts, plain_max, False, timed=True)
    cached = measure(opts, gc_max, True, timed=True)
    for name, row in (("plain", plain), ("grad_cache", cached)):
        rows.append({"run": name, **{k: row.get(k) for k in ("batch", "peak_mb", "step_s", "ms_per_example")}})
    rows.append({"run": "ratio", "batch": cached["batch"] / plain["batch"],
                 "ms_per_example": cached["ms_per_example"] / plain["ms_per_example"]})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
