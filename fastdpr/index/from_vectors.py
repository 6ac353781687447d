"""``index_from_vectors``: an index file from encoded passage vectors, carrying the fingerprint of the model that
encoded them, so that a search with another model is refused (``fastdpr.retrieve.dense.check_same_model``).
``fastdpr index`` is this function on the command line.

The vectors are a ``fastdpr encode`` directory, read one shard at a time (they are held once, in the index), or an
array (n, dim). Needs numpy only: the vectors' files are read by ``fastdpr.data.vectors``, not by the encoder.

Example::

    from fastdpr.index import index_from_vectors
    built = index_from_vectors("vectors/", "auto", "wiki.fdpr")
    built.path, built.kind, built.count
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdpr.data.vectors import iter_vector_shards, read_manifest
from fastdpr.errors import InputError
from fastdpr.index.base import INDEX_FILE_NAME, Index
from fastdpr.index.checks import check_ids, check_shape
from fastdpr.index.disk_build import IVFPQDiskBuilder
from fastdpr.index.factory import make_index
from fastdpr.index.tune import TUNERS, TuneResult
from fastdpr.progress import progress


@dataclass
class BuiltIndex:
    """What ``index_from_vectors`` wrote: the file, the index type, how many vectors of which dimension, the
    model fingerprint it carries, the tuning (when asked for) and the seconds it took. ``index`` is the index
    itself, or None for an ``on_disk`` build, whose rows were never held in memory (``load_index(path,
    mmap=True)`` opens it)."""

    path: Path
    kind: str
    count: int
    dim: int
    fingerprint: str | None
    seconds: float
    tuned: TuneResult | None = None
    index: Index | None = None


@dataclass
class _Source:
    """The vectors, whichever form they came in: their count and dimension, the fingerprint they record, and how
    to read them (shards of (rows, ids) in row order)."""

    count: int
    dim: int
    fingerprint: str | None
    shards: Callable[[], Iterator[tuple[np.ndarray, np.ndarray | None]]]
    directory: Path | None = None


def index_from_vectors(vectors: str | os.PathLike | np.ndarray, spec: str, out: str | os.PathLike, *,
                       fingerprint: str | None = None,
                       ids: Any = None, memory_budget: Any = None, train_size: int = 100_000, seed: int = 0,
                       verify: bool = True, tune_queries: Any = None, target_recall: float = 0.95,
                       tune_k: int = 100, on_disk: bool = False, show_progress: bool = False) -> BuiltIndex:
    """Build an index of ``vectors`` from ``spec`` (``fastdpr.index.build_index``'s specs; ``"auto"`` chooses by
    the number of vectors, their dimension and ``memory_budget``) and save it to ``out`` (a file, or a directory
    that gets ``index.fdpr``).

    ``vectors``: a ``fastdpr encode`` output directory (ids are corpus rows; checksums checked unless
    ``verify=False``) or an array (n, dim) (ids: ``ids``, default the row numbers). ``fingerprint``: the model
    fingerprint the index carries (``fastdpr.encode.model_fingerprint(model)``); a directory's own is used when
    none is given, and one that differs from it is an ``InputError`` (the vectors are another model's).
    ``train_size`` rows, drawn with ``seed``, train the types that need training. ``tune_queries`` (an array of
    query vectors, a ``.npy`` file, a ``fastdpr encode`` directory, or a count N of the indexed vectors to draw)
    tunes the search settings to ``target_recall`` at ``tune_k`` (``Index.tune``). ``on_disk``: ivfpq with fp16
    rows only, streamed into the file and never held in memory (``fastdpr.index.disk_build``); resumes an
    interrupted build of the same ``out``.
    """
    if isinstance(train_size, bool) or not isinstance(train_size, (int, np.integer)) or train_size < 1:
        raise InputError(f"train_size must be an integer >= 1, got {train_size!r}")
    if not 0 < target_recall <= 1:  # (NaN fails this too)
        raise InputError(f"target_recall must be in (0, 1], got {target_recall}")
    if isinstance(tune_k, bool) or not isinstance(tune_k, (int, np.integer)) or tune_k < 1:
        raise InputError(f"tune_k must be an integer >= 1, got {tune_k!r}")
    if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint):
        raise InputError(f"fingerprint must be a non-empty string, got {fingerprint!r}")
    source = _source(vectors, ids, verify)
    if source.fingerprint and fingerprint and source.fingerprint != fingerprint:
        raise InputError(f"the vectors were encoded by another model (fingerprint {source.fingerprint}; the model "
                         f"given is {fingerprint})", path=None if source.directory is None else str(source.directory))
    fingerprint = fingerprint or source.fingerprint
    queries = None if tune_queries is None else _tune_queries(tune_queries, source, seed, verify)
    if on_disk:
        if queries is not None:
            raise InputError("tune_queries: tune an on_disk index after it is built (tuning rewrites the file)")
        return _build_on_disk(source, spec, out, fingerprint, train_size, seed, show_progress)

    index = make_index(spec, source.dim, n_hint=source.count, memory_budget=memory_budget)
    if queries is not None and index.kind not in TUNERS:  # said before the build, not after it
        raise InputError(f"tune_queries: {index.kind} indexes are not tuned (ivfpq is; flat is exact)")
    index.model_fingerprint = fingerprint
    start = time.perf_counter()
    if not index.is_trained:
        index.train(_sample(source, train_size, seed))
    with progress(total=source.count, unit="vec", desc="index", enabled=show_progress) as bar:
        for rows, row_ids in source.shards():
            # ids equal to the index's own row numbers are left implicit (no id table in the file)
            if row_ids is not None and row_ids.shape[0] and row_ids[0] == len(index) and \
                    np.array_equal(row_ids, np.arange(len(index), len(index) + rows.shape[0])):
                row_ids = None
            index.add(rows, ids=row_ids)
            bar.update(rows.shape[0])
    tuned = None
    if queries is not None:
        tuned = index.tune(queries, target_recall=target_recall, k=tune_k)
    path = index.save(out)
    return BuiltIndex(path=path, kind=index.kind, count=len(index), dim=index.dim, fingerprint=fingerprint,
                      seconds=time.perf_counter() - start, tuned=tuned, index=index)


def _source(vectors: Any, ids: Any, verify: bool) -> _Source:
    if isinstance(vectors, (str, os.PathLike)):
        directory = Path(vectors)
        if ids is not None:
            raise InputError("ids: the ids of a vectors directory are its corpus rows; give ids with an array only",
                             path=str(directory))
        manifest = read_manifest(directory)
        count, dim = int(manifest["count"]), int(manifest["dim"])
        if count == 0:
            raise InputError("no vectors to index", path=str(directory))

        def shards() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            for shard in iter_vector_shards(directory, verify=verify):
                n = len(shard.ids)
                yield shard.vectors, np.arange(shard.row_start, shard.row_start + n, dtype=np.int64)

        return _Source(count, dim, manifest.get("model_fingerprint") or None, shards, directory)
    array = check_shape(vectors, None, "vectors")
    if array.shape[0] == 0:
        raise InputError(f"no vectors to index: got shape {array.shape}")
    row_ids = None if ids is None else check_ids(ids, array.shape[0])
    return _Source(array.shape[0], array.shape[1], None, lambda: iter([(array, row_ids)]))


def _sample(source: _Source, size: int, seed: int) -> np.ndarray:
    """Up to ``size`` rows drawn uniformly without replacement across all shards, in row order, as float32 (every
    row when there are no more than ``size``)."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(source.count, size=min(size, source.count), replace=False))
    parts, offset = [], 0
    for rows, _ in source.shards():
        n = rows.shape[0]
        lo, hi = np.searchsorted(chosen, [offset, offset + n])
        if hi > lo:
            parts.append(np.asarray(rows[chosen[lo:hi] - offset], dtype=np.float32))
        offset += n
    return np.concatenate(parts)


def _tune_queries(value: Any, source: _Source, seed: int, verify: bool) -> np.ndarray:
    """Query vectors for tuning: an array, a ``.npy`` file, a ``fastdpr encode`` directory, or a count of the
    indexed vectors to draw."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 1:
            raise InputError(f"tune_queries must be at least 1 vector, got {value}")
        return _sample(source, int(value), seed + 1)
    where = None
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        where = str(path)
        if path.is_dir():
            queries = np.concatenate([np.asarray(s.vectors, dtype=np.float32)
                                      for s in iter_vector_shards(path, verify=verify)])
        elif path.is_file():
            try:
                queries = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise InputError(f"tune_queries: not a .npy array of query vectors: {exc}", path=where) from None
        else:
            raise InputError("tune_queries: no such file or directory (or give a number of indexed vectors)",
                             path=where)
    else:
        queries = np.asarray(value)
    if queries.ndim != 2 or queries.shape[1] != source.dim or queries.shape[0] == 0:
        raise InputError(f"tune_queries must hold (n >= 1, {source.dim}) vectors, got shape {queries.shape}",
                         path=where)
    return queries


def _build_on_disk(source: _Source, spec: str, out: str | os.PathLike, fingerprint: str | None, train_size: int,
                   seed: int, show_progress: bool) -> BuiltIndex:
    path = Path(out)
    # the slash is read from the argument, as Index.save does: Path("newdir/") drops it
    if path.is_dir() or str(os.fspath(out)).endswith(("/", os.sep)):
        path = path / INDEX_FILE_NAME
    start = time.perf_counter()
    builder = IVFPQDiskBuilder(path, source.dim, spec)  # refuses a spec that is not ivfpq with fp16 rows
    with progress(total=source.count, unit="vec", desc="rows to disk", enabled=show_progress) as bar:
        bar.update(builder.rows)
        for rows, row_ids in source.shards():
            first = 0 if row_ids is None else int(row_ids[0])
            n = rows.shape[0]
            if first + n <= builder.rows:  # appended by an earlier, interrupted run
                continue
            if first != builder.rows or (row_ids is not None and
                                         not np.array_equal(row_ids, np.arange(first, first + n))):
                raise InputError(f"on_disk: rows must follow one another from 0 (ids are row numbers); a block "
                                 f"starts at row {first}, expected {builder.rows}",
                                 path=None if source.directory is None else str(source.directory))
            builder.append(rows)
            bar.update(n)
    builder.train(sample=min(train_size, source.count), seed=seed, show_progress=show_progress)
    builder.add(show_progress=show_progress)
    written = builder.finish(model_fingerprint=fingerprint)
    return BuiltIndex(path=Path(written), kind="ivfpq", count=source.count, dim=source.dim, fingerprint=fingerprint,
                      seconds=time.perf_counter() - start)
