"""Writing an encode output directory: corpus access, tokenisation in a background thread, shards written
atomically, and resuming from the last complete shard."""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdpr.atomic import remove_stale_temp_files_in, write_json
from fastdpr.data import vectors as vector_files  # write_shard through the module: tests interrupt it there
from fastdpr.data.vectors import (
    DTYPES,
    FORMAT,
    MANIFEST,
    VERSION,
    part_manifest_name,
    read_manifest_file,
    shard_intact,
    shard_name,
)
from fastdpr.encode.fingerprint import model_fingerprint
from fastdpr.encode.layout import _IDENTITY, parse_shard_spec, worker_from_env, worker_shards
from fastdpr.errors import InputError
from fastdpr.models.inference import resolve_precision
from fastdpr.progress import progress

log = logging.getLogger("fastdpr.encode")


class _CorpusView:
    """Uniform row access over a Corpus, a list of passages, or a path (opened as a Corpus)."""

    def __init__(self, corpus):
        self.name = None
        if isinstance(corpus, (str, os.PathLike)):
            from fastdpr.data import Corpus

            self.name = str(corpus)
            corpus = Corpus.open(corpus)
        elif getattr(corpus, "path", None) is not None:
            self.name = str(corpus.path)
        if not hasattr(corpus, "__len__") or not hasattr(corpus, "__getitem__"):
            raise InputError("corpus must be a Corpus, a list of passages or a path to a passage file")
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)

    def rows(self, start: int, end: int) -> tuple[list[str], list]:
        passages, ids = [], []
        for row in range(start, end):
            p = self.corpus[row]
            if isinstance(p, dict):
                pid = p.get("id")
                ids.append(str(pid) if pid is not None else str(row))
            else:
                ids.append(str(row))
            passages.append(p)
        return ids, passages


def _remove_stale_temp_files(out_dir: Path) -> int:
    """Temporary files killed writers left behind (``.shard-*.tmp``, ``.manifest*.tmp``); those of live writers
    (other shards' workers writing into the same folder) are theirs."""
    return len(remove_stale_temp_files_in(out_dir, (".shard-", ".manifest")))


@dataclass
class _Prepared:
    index: int
    row_start: int
    ids: list[str]
    seqs: list
    empty: int


def encode_corpus(model, corpus, out_dir: str | os.PathLike, batch_size: int = 128, dtype: str = "float16",
                  shard_size: int = 4096, shard: tuple[int, int] | str | None = None, precision: str = "auto",
                  device=None, max_length: int | None = None, show_progress: bool = True,
                  model_name: str | None = None) -> dict:
    """Encode every passage of ``corpus`` with the passage tower into ``out_dir``; return the manifest.

    ``shard``: ``(i, n)`` or ``"i/n"`` to encode only worker i's part (default: RANK/WORLD_SIZE under torchrun,
    else everything). Rerunning with the same arguments resumes; a directory holding vectors of another model,
    corpus or setting is refused. Tokenisation of the next shard runs in a background thread while the current
    one is encoded. ``shard_size`` is the resume unit: a killed run loses at most one shard's work (4,096 passages
    by default: under a minute for a small model on one GPU, minutes on a CPU). ``precision``: auto, fp32, bf16, fp16
    or int8 (see :meth:`BiEncoder.encode_passages`). ``show_progress``: a bar on a terminal, a line every 10 s in a
    log.

    Example::

        manifest = encode_corpus(model, "passages.tsv", "vectors/", shard_size=50_000)
        manifest["count"], manifest["dim"]
    """
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not (isinstance(shard_size, int) and shard_size >= 1):
        raise InputError(f"shard_size must be a positive integer, got {shard_size!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    worker, workers = parse_shard_spec(shard) if isinstance(shard, str) else (shard or worker_from_env())
    if workers < 1 or not 0 <= worker < workers:
        raise InputError(f"shard {worker}/{workers}: need 0 <= i < n")
    if max_length is not None:
        if not (isinstance(max_length, int) and max_length >= 2):
            raise InputError(f"max_length must be an integer >= 2, got {max_length!r}")
        saved_config = model.config
        model.config = model._fit_lengths(model.config.replace(max_passage_length=max_length),
                                          model.passage_encoder, model.tokenizer)
        try:
            return encode_corpus(model, corpus, out_dir, batch_size=batch_size, dtype=dtype, shard_size=shard_size,
                                 shard=(worker, workers), precision=precision, device=device, max_length=None,
                                 show_progress=show_progress, model_name=model_name)
        finally:
            model.config = saved_config
    if device is not None:
        model.to(device)

    view = _CorpusView(corpus)
    n_rows = len(view)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_files(out_dir)
    my_shards = worker_shards(n_rows, shard_size, worker, workers)
    row_range = [min(my_shards.start * shard_size, n_rows), min(my_shards.stop * shard_size, n_rows)]
    identity = {
        "format": FORMAT, "version": VERSION, "dim": model.dim, "dtype": dtype,
        "model_fingerprint": model_fingerprint(model), "corpus_rows": n_rows, "shard_size": shard_size,
        "worker": [worker, workers], "rows": row_range, "max_length": model.config.max_passage_length,
        "pooling": model.config.pooling, "similarity": model.config.similarity,
        # vectors computed in int8 or bf16 must not be mixed into an fp32 run on resume
        "precision": resolve_precision(precision, model.device),
    }
    manifest_path = out_dir / part_manifest_name(worker, workers)
    manifest = _resume_or_start(manifest_path, identity, out_dir, view)
    manifest.update({"model": model_name or manifest.get("model"), "corpus": view.name or manifest.get("corpus")})

    done = {entry["index"] for entry in manifest["shards"]}
    todo = [j for j in my_shards if j not in done]
    total = row_range[1] - row_range[0]
    bar = progress(total=total, desc="encode passages", unit="passage", initial=manifest["count"],
                   enabled=None if show_progress else False)
    started, encoded_now = time.perf_counter(), 0
    try:
        for prepared in _prepare_in_background(model, view, todo, shard_size, n_rows):
            # one counter for the whole run, advanced batch by batch inside the shard
            before = bar.n
            vectors = model.encode_token_lists(prepared.seqs, "passage", batch_size=batch_size,
                                               precision=precision, bar=bar)
            entry = vector_files.write_shard(out_dir, prepared.index, prepared.row_start, vectors.astype(dtype, copy=False),
                                 prepared.ids)
            manifest["shards"].append(entry)
            manifest["shards"].sort(key=lambda e: e["index"])
            manifest["count"] += entry["count"]
            manifest["empty_passages"] += prepared.empty
            manifest["truncated"] += model.last_truncated
            manifest["complete"] = manifest["count"] == total
            write_json(manifest_path, manifest)  # last: only now does the shard count
            encoded_now += entry["count"]
            bar.update(entry["count"] - (bar.n - before))  # what the batches did not count (a lone passage)
    finally:
        bar.close()
    elapsed = time.perf_counter() - started
    if encoded_now:
        log.info("encoded %d passages in %.1f s (%.1f passages/s)", encoded_now, elapsed, encoded_now / elapsed)
    if manifest["truncated"]:
        log.warning("%d passages were longer than the %d-token limit and were truncated", manifest["truncated"],
                    identity["max_length"])
    if manifest["empty_passages"]:
        log.warning("%d passages have neither title nor text (encoded as an empty input)",
                    manifest["empty_passages"])
    manifest["complete"] = manifest["count"] == total
    write_json(manifest_path, manifest)
    manifest["seconds"] = elapsed
    manifest["encoded_now"] = encoded_now
    return manifest


def _resume_or_start(manifest_path: Path, identity: dict, out_dir: Path, view: _CorpusView) -> dict:
    if manifest_path.exists():
        old = read_manifest_file(manifest_path)
        differ = [k for k in _IDENTITY if old.get(k) != identity.get(k)]
        if differ:
            details = ", ".join(f"{k}: {old.get(k)!r} there vs {identity.get(k)!r} now" for k in differ)
            raise InputError(f"this directory holds vectors of a different run ({details}); use a new output "
                             "directory or delete this one", path=str(manifest_path))
        kept, dropped = [], []
        for entry in old.get("shards", []):
            if shard_intact(out_dir, entry) and _ids_match(entry, out_dir, view):
                kept.append(entry)
            else:
                dropped.append(entry["index"])
        if dropped:
            log.warning("%s: shards %s failed their checksum or no longer match the corpus; encoding them again",
                        manifest_path, dropped)
        manifest = dict(old)
        manifest["shards"] = kept
        manifest["count"] = sum(e["count"] for e in kept)
        if kept:
            log.info("resuming: %d passages in %d shards already encoded", manifest["count"], len(kept))
        return manifest
    if (out_dir / MANIFEST).exists() and manifest_path.name != MANIFEST:
        raise InputError("this directory already holds a merged encoding; use a new output directory",
                         path=str(out_dir / MANIFEST))
    return {**identity, "count": 0, "complete": False, "empty_passages": 0, "truncated": 0, "shards": []}


def _ids_match(entry: dict, out_dir: Path, view: _CorpusView) -> bool:
    ids = json.loads((out_dir / entry["ids"]).read_text(encoding="utf-8"))
    start = entry["row_start"]
    # the ids alone (no passage parsing) when the corpus can give them cheaply
    if hasattr(view.corpus, "id_at"):
        want = [view.corpus.id_at(r) for r in range(start, start + entry["count"])]
    else:
        want, _ = view.rows(start, start + entry["count"])
    return ids == want


def _prepare_in_background(model, view: _CorpusView, todo: Sequence[int], shard_size: int,
                           n_rows: int) -> Iterator[_Prepared]:
    """Read and tokenise shard k+1 in a thread while shard k is encoded (the fast tokenizer releases the GIL)."""
    from fastdpr.models import passage_fields

    results: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def work():
        try:
            for j in todo:
                if stop.is_set():
                    return
                start, end = j * shard_size, min((j + 1) * shard_size, n_rows)
                ids, passages = view.rows(start, end)
                try:
                    fields = [passage_fields(p, start + i) for i, p in enumerate(passages)]
                except InputError as err:
                    raise InputError(err.reason.replace("passage ", "corpus row ", 1), path=view.name) from None
                empty = sum(1 for title, text in fields if not title and not text.strip())
                seqs = model.tokenize_passage_lists(fields)
                _put(_Prepared(j, start, ids, seqs, empty))
            _put(None)
        except BaseException as err:  # handed to the consumer, re-raised there
            _put(err)

    def _put(item):
        while not stop.is_set():
            try:
                results.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=work, name="fastdpr-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            item = results.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
