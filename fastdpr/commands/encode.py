"""`fastdpr encode`: passages -> fp16/fp32 vector shards + ids + manifest (resumable, splittable).

    fastdpr encode --model model/ passages.tsv -o vectors/
    fastdpr encode --model model/ passages.tsv -o vectors/ --shard 0/4      # worker 0 of 4 (or torchrun)
    fastdpr encode --merge vectors/                                          # check + join the workers' parts
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

# what `fastdpr` adds when this command is interrupted (Ctrl-C, SIGTERM)
ON_INTERRUPT = "rerun the same command to resume: the shards already written are kept"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", nargs="?", type=Path, help="passage file (DPR TSV, JSONL or BEIR corpus.jsonl)")
    p.add_argument("--model", "-m", type=Path, help="fastdpr, sentence-transformers or Hugging Face model directory")
    p.add_argument("-o", "--out", type=Path, help="output directory for shards and manifest")
    p.add_argument("--batch-size", type=int, default=128, help="passages per forward pass (default 128)")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="stored vector type")
    p.add_argument("--precision", type=_precision, default="auto", metavar="{auto,fp32,bf16,fp16,int8}",
                   help="compute precision, the names of `fastdpr train` (float32, bfloat16, float16 are accepted "
                        "too). auto: fp16 on CUDA, fp32 on the CPU. bf16 is several times faster on CPUs with AMX; "
                        "int8 (CPU only) quantizes the linear layers. Both change the vectors slightly: speed and "
                        "retrieval accuracy in benchmarks/results/encode.md at c97483c (default auto)")
    p.add_argument("--shard-size", type=int, default=4096,
                   help="passages per shard file, the resume unit: a killed run redoes at most one (default 4096)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="encode only part I of N (default: RANK/WORLD_SIZE under torchrun, else all)")
    p.add_argument("--max-length", type=int, default=None, help="passage token limit (default: the model's)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda:LOCAL_RANK when available)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="DIR", default=None,
                   help="merge and check the worker parts in DIR... (into -o, default the first DIR)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar on a terminal, a line every 10 s when stderr is a file)")


def _precision(value: str) -> str:
    from fastdpr.models.inference import ALIASES, PRECISIONS

    name = ALIASES.get(value, value)
    if name not in PRECISIONS:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(PRECISIONS)} (or "
                                         f"{', '.join(ALIASES)})")
    return name


def run(args: argparse.Namespace) -> int:
    import os

    from fastdpr.errors import InputError

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from fastdpr.encode import encode_corpus, merge_shards, parse_shard_spec, worker_from_env

    if args.merge:
        manifest = merge_shards(args.merge, args.out)
        print(f"merged {len(manifest['shards'])} shards, {manifest['count']} passages, each exactly once -> "
              f"{(args.out or args.merge[0]) / 'manifest.json'}")
        return 0
    missing = [name for name, value in (("CORPUS", args.corpus), ("--model", args.model), ("-o", args.out))
               if value is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (or use --merge DIR...)")

    import torch

    from fastdpr.models import BiEncoder

    worker, workers = parse_shard_spec(args.shard) if args.shard else worker_from_env()
    device = args.device
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    model = BiEncoder.from_pretrained(args.model)
    manifest = encode_corpus(model, args.corpus, args.out, batch_size=args.batch_size, dtype=args.dtype,
                             shard_size=args.shard_size, shard=(worker, workers), precision=args.precision,
                             device=device, max_length=args.max_length, show_progress=not args.no_progress,
                             model_name=str(args.model))
    rate = manifest["encoded_now"] / manifest["seconds"] if manifest["seconds"] > 0 else 0.0
    print(f"{manifest['count']} passages ({manifest['dim']}-d {manifest['dtype']}) in {len(manifest['shards'])} "
          f"shards -> {args.out}; {manifest['encoded_now']} encoded now at {rate:.1f} passages/s")
    if workers > 1:
        merged = _merge_under_torchrun(args.out, worker, workers)
        if not merged:
            print(f"worker {worker}/{workers} done; when all are, run: fastdpr encode --merge {args.out}")
    return 0


def _merge_under_torchrun(out: Path, worker: int, workers: int) -> bool:
    """Under torchrun, wait for every rank and let rank 0 merge; otherwise leave merging to the user."""
    import torch.distributed as dist

    if "MASTER_ADDR" not in __import__("os").environ or not dist.is_available():
        return False
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    dist.barrier()
    if worker == 0:
        from fastdpr.encode import merge_shards

        manifest = merge_shards([out])
        print(f"merged {len(manifest['shards'])} shards from {workers} workers, {manifest['count']} passages")
    dist.barrier()
    dist.destroy_process_group()
    return True
