"""Benchmark data for the ANN benchmark: cached synthetic mixtures, real passage embeddings, and exact ground truth.

- ``synthetic(n, dim, n_queries)``: the non-normalised Gaussian mixture of ``fastdpr.index.synthetic`` (cluster
  centres + low-rank spread + log-normal norms), generated once and cached as ``.npy`` under the cache directory
  (``$FASTDPR_BENCH_CACHE`` or ``<repo>/cache/bench``, which git ignores); the base is read back memory-mapped.
- ``calibrated_synthetic(n, dim, profile, n_queries)``: ``fastdpr.index.synthetic.calibrated`` (profiles
  ``minilm-mean``, ``minilm-cls``: fitted to the real MiniLM pool by ``ann_fit_synthetic.py``; ``minilm-mean-growth``
  and ``minilm-mean-pool`` to the growth of ``real_pool.py``'s pool), cached the same way
  and written in chunks, so 1M x 768 never sits in memory twice.
- ``real(vectors_dir, n_queries)``: vectors written by ``fastdpr encode`` (e.g. the quickstart passages encoded by
  the packaged MiniLM with raw [CLS] or unnormalised mean pooling). Queries are ``queries.npy`` in that directory
  when present (encoded questions), otherwise ``n_queries`` passages held out of the base at random.
- ``ground_truth(ds, k)``: exact top-k by inner product, computed once with numpy's BLAS (independent of the
  indexes being measured) and cached next to the data.

>>> ds = synthetic(2000, 32, n_queries=10)        # doctest: +SKIP
>>> ids = ground_truth(ds, k=100)                 # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # running from a checkout without an install
    sys.path.insert(0, str(REPO))


def cache_dir() -> Path:
    return Path(os.environ.get("FASTDPR_BENCH_CACHE", REPO / "cache" / "bench"))


@dataclass
class Dataset:
    name: str
    base: np.ndarray  # (n, d) float32 (possibly memory-mapped)
    queries: np.ndarray  # (nq, d) float32
    directory: Path  # where the cached ground truth goes
    description: str

    @property
    def n(self) -> int:
        return int(self.base.shape[0])

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])


def _save(path: Path, array: np.ndarray) -> None:
    from fastdpr.atomic import save_npy

    save_npy(path, array)


def synthetic(n: int, dim: int, n_queries: int = 1000, seed: int = 0, n_clusters: int = 64, rank: int = 16,
              norm_sigma: float = 0.35) -> Dataset:
    """The cached synthetic mixture at ``n x dim`` with ``n_queries`` queries drawn the same way."""
    from fastdpr.index.synthetic import gaussian_mixture

    name = f"synthetic-{n}x{dim}"
    d = cache_dir() / f"{name}-q{n_queries}-s{seed}-c{n_clusters}-r{rank}-ns{norm_sigma:g}"
    base_path, q_path = d / "base.npy", d / "queries.npy"
    if not (base_path.exists() and q_path.exists()):
        base, queries = gaussian_mixture(n, dim, n_queries=n_queries, n_clusters=n_clusters, rank=rank,
                                         norm_sigma=norm_sigma, seed=seed)
        _save(base_path, np.ascontiguousarray(base, dtype=np.float32))
        _save(q_path, np.ascontiguousarray(queries, dtype=np.float32))
        del base, queries
    return Dataset(name=name, base=np.load(base_path, mmap_mode="r"), queries=np.load(q_path), directory=d,
                   description=f"synthetic Gaussian mixture ({n_clusters} clusters, rank {rank}, log-normal norms "
                               f"sigma {norm_sigma}), seed {seed}")


def calibrated_synthetic(n: int, dim: int, profile: str, n_queries: int = 1000, seed: int = 0) -> Dataset:
    """The cached calibrated synthetic set (``profile`` as in ``fastdpr.index.synthetic.PROFILES``)."""
    from fastdpr.atomic import atomic_open
    from fastdpr.index.synthetic import BLOCK, PROFILES, CalibratedGenerator

    if profile not in PROFILES:
        raise ValueError(f"unknown synthetic profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
    # the fitted numbers are part of the key: a refit profile never reuses vectors drawn with the old one. A profile
    # whose leaves grow as they did before growth was a parameter, and one without families, keeps its old key (and
    # its cached sets)
    text = repr(PROFILES[profile]).replace(", families=0, family_share=0.0)", ")")
    text = text.replace(", leaf_growth=1.0, reference_n=10000)", ")")
    tag = hashlib.sha1(text.encode()).hexdigest()[:8]
    name = f"synthetic-{profile}-{n}x{dim}"
    d = cache_dir() / f"{name}-q{n_queries}-s{seed}-{tag}"
    base_path, q_path = d / "base.npy", d / "queries.npy"
    if not (base_path.exists() and q_path.exists()):
        gen = CalibratedGenerator(n, dim, profile, seed)
        with atomic_open(base_path, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                      "fortran_order": False, "shape": (n, dim)})
            for start in range(0, n, 4 * BLOCK):
                fh.write(gen.passages(start, min(n, start + 4 * BLOCK)).tobytes())
        _save(q_path, gen.queries(n_queries))
    return Dataset(name=name, base=np.load(base_path, mmap_mode="r"), queries=np.load(q_path), directory=d,
                   description=f"synthetic vectors calibrated to all-MiniLM-L6-v2 ({profile}: shared vector, "
                               f"decaying spectrum, topic/leaf clusters, measured norm tables, off-manifold "
                               f"queries), seed {seed}")


def real(vectors_dir: str | os.PathLike, n_queries: int = 1000, seed: int = 0) -> Dataset:
    """Passage vectors from a ``fastdpr encode`` output directory (fp16 or fp32 shards + manifest)."""
    from fastdpr.encode import load_vectors

    vectors_dir = Path(vectors_dir)
    vectors, _ = load_vectors(vectors_dir)
    vectors = np.asarray(vectors, dtype=np.float32)
    tag = hashlib.sha1(str(vectors_dir.resolve()).encode()).hexdigest()[:8]
    name = f"real-{vectors_dir.name}"
    directory = cache_dir() / f"{name}-{tag}-q{n_queries}-s{seed}"
    q_file = vectors_dir / "queries.npy"
    if q_file.exists():
        queries = np.ascontiguousarray(np.load(q_file), dtype=np.float32)[:n_queries]
        base = np.ascontiguousarray(vectors)
        how = f"{len(queries)} encoded questions from {q_file.name}"
    else:  # hold passages out as queries: they are not in the base, so no query finds itself
        rng = np.random.default_rng(seed)
        held = np.zeros(len(vectors), dtype=bool)
        held[rng.choice(len(vectors), min(n_queries, len(vectors) // 10), replace=False)] = True
        queries, base = np.ascontiguousarray(vectors[held]), np.ascontiguousarray(vectors[~held])
        how = f"{int(held.sum())} passages held out as queries"
    # say how the vectors were made and how far from unit length they are: non-normalised vectors are the case
    # inner-product graphs find hard
    manifest = json.loads((vectors_dir / "manifest.json").read_text())
    made = ", ".join(f"{key} {manifest[key]}" for key in ("pooling", "similarity", "max_length", "corpus")
                     if manifest.get(key) is not None)
    norms = [np.linalg.norm(a, axis=1) for a in (base, queries)]
    spread = "; ".join(f"{what} norms min/median/max {v.min():.2f}/{np.median(v):.2f}/{v.max():.2f}"
                       for what, v in zip(("passage", "query"), norms))
    return Dataset(name=name, base=base, queries=queries, directory=directory,
                   description=f"real embeddings from {vectors_dir} ({made}; {how}; {spread})")


def ground_truth(ds: Dataset, k: int = 100, block: int = 65536) -> np.ndarray:
    """Exact top-``k`` row ids by inner product (ties: smaller row), cached in ``ds.directory``."""
    path = ds.directory / f"gt-top{k}.npy"
    if path.exists():
        gt = np.load(path)
        if gt.shape == (len(ds.queries), k):
            return gt
    # numpy's BLAS, independent of the indexes being measured; the running top-k is the project's one (TopK)
    from fastdpr.index.flat import TopK

    q = np.ascontiguousarray(ds.queries, dtype=np.float32)
    top = TopK(len(q), k)
    for start in range(0, ds.n, block):
        top.add(q @ np.asarray(ds.base[start:start + block], dtype=np.float32).T, start)
    gt = top.result()[1]
    _save(path, gt)
    return gt

