"""Encoding a corpus into vector shards: batched, length-sorted, resumable, splittable across workers.

Layout of an output directory::

    manifest.json                 one worker (or the merge of several): the shards in row order
    manifest.part-I-of-N.json     worker I of N (``--shard I/N`` or torchrun), until merged
    shard-00000.npy               float16/float32 (rows, dim), rows [0, S) of the corpus
    shard-00000.ids.json          the passage ids of those rows

The corpus is cut into fixed shards of ``shard_size`` rows; worker I of N owns a contiguous block of shards. A shard
counts only once its vectors, its ids and its manifest entry are all written (each atomically, the manifest last),
so a run killed at any point restarts from the last complete shard, and, since every shard is encoded as its own
length-sorted window with the same batches, the result equals an uninterrupted run.

Example::

    from fastdpr.encode import encode_corpus, load_vectors
    encode_corpus(model, Corpus.open("passages.tsv"), "vectors/", batch_size=128, dtype="float16")
    vectors, ids = load_vectors("vectors/")
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdpr.atomic import atomic_open, write_json
from fastdpr.errors import InputError
from fastdpr.models.inference import resolve_precision
from fastdpr.progress import progress

log = logging.getLogger("fastdpr.encode")

FORMAT = "fastdpr-vectors"
VERSION = 1
MANIFEST = "manifest.json"
DTYPES = ("float16", "float32")
_PART_RE = re.compile(r"^manifest\.part-(\d+)-of-(\d+)\.json$")
# fields that must agree between a resumed run and the directory it resumes
_IDENTITY = ("format", "version", "dim", "dtype", "model_fingerprint", "corpus_rows", "shard_size", "worker",
             "rows", "max_length", "pooling", "similarity", "precision")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def part_manifest_name(worker: int, workers: int) -> str:
    return MANIFEST if workers == 1 else f"manifest.part-{worker}-of-{workers}.json"


def parse_shard_spec(spec: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if not match:
        raise InputError(f"--shard must look like i/n (e.g. 0/4), got {spec!r}")
    i, n = int(match.group(1)), int(match.group(2))
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard {spec}: need 0 <= i < n")
    return i, n


def worker_from_env() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) under torchrun, else (0, 1)."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise InputError("RANK / WORLD_SIZE must be integers") from None


def worker_shards(corpus_rows: int, shard_size: int, worker: int, workers: int) -> range:
    """The global shard indices worker ``worker`` of ``workers`` owns (a contiguous block)."""
    total = math.ceil(corpus_rows / shard_size)
    return range(worker * total // workers, (worker + 1) * total // workers)


def model_fingerprint(model) -> str:
    """A short hash of the passage tower's weights and the model config: vectors from different weights must never
    be mixed in one directory."""
    import torch

    h = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    with torch.no_grad():
        modules = [model.passage_encoder] + ([model.passage_projection] if model.passage_projection is not None
                                             else [])
        for module in modules:
            for name, param in module.named_parameters():
                flat = param.detach().reshape(-1)
                # sum, sum of squares and a strided sample: changes to any trained weight show up
                sample = flat[:: max(1, flat.numel() // 64)][:64].double().cpu().numpy()
                stats = [float(flat.double().sum()), float(flat.double().square().sum())]
                h.update(name.encode())
                h.update(np.asarray(stats + sample.tolist(), dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- corpus access
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


# ---------------------------------------------------------------------------------------------------- writing
def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _write_bytes(path: Path, data: bytes) -> str:
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return hashlib.sha256(data).hexdigest()


def _write_shard(out_dir: Path, index: int, row_start: int, vectors: np.ndarray, ids: list[str]) -> dict:
    """Vectors then ids, each atomically; the caller records the returned entry in the manifest afterwards."""
    name = shard_name(index)
    vec_sha = _write_bytes(out_dir / f"{name}.npy", _npy_bytes(vectors))
    ids_sha = _write_bytes(out_dir / f"{name}.ids.json", json.dumps(ids, ensure_ascii=False).encode("utf-8"))
    return {"index": index, "vectors": f"{name}.npy", "ids": f"{name}.ids.json", "row_start": row_start,
            "count": len(ids), "sha256": vec_sha, "ids_sha256": ids_sha}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _shard_intact(out_dir: Path, entry: dict) -> bool:
    try:
        return (_sha256_file(out_dir / entry["vectors"]) == entry["sha256"]
                and _sha256_file(out_dir / entry["ids"]) == entry["ids_sha256"])
    except (OSError, KeyError):
        return False


def _remove_stale_temp_files(out_dir: Path) -> int:
    """Temporary files a killed writer left behind (``.shard-*.tmp``, ``.manifest*.tmp``)."""
    removed = 0
    for path in out_dir.glob(".*.tmp"):
        if path.name.startswith((".shard-", ".manifest")):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _read_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no manifest here (not an encode output directory)", path=str(path)) from None
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON ({err.msg})", path=str(path), line=err.lineno) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"not a {FORMAT} manifest", path=str(path))
    if data.get("version", 0) > VERSION:
        raise InputError(f"written by a newer fastdpr (version {data['version']})", path=str(path))
    return data


# ---------------------------------------------------------------------------------------------------- encoding
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
            vectors = model.encode_token_lists(prepared.seqs, "passage", batch_size=batch_size,
                                               precision=precision)
            entry = _write_shard(out_dir, prepared.index, prepared.row_start, vectors.astype(dtype, copy=False),
                                 prepared.ids)
            manifest["shards"].append(entry)
            manifest["shards"].sort(key=lambda e: e["index"])
            manifest["count"] += entry["count"]
            manifest["empty_passages"] += prepared.empty
            manifest["truncated"] += model.last_truncated
            manifest["complete"] = manifest["count"] == total
            write_json(manifest_path, manifest)  # last: only now does the shard count
            encoded_now += entry["count"]
            bar.update(entry["count"])
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
        old = _read_manifest(manifest_path)
        differ = [k for k in _IDENTITY if old.get(k) != identity.get(k)]
        if differ:
            details = ", ".join(f"{k}: {old.get(k)!r} there vs {identity.get(k)!r} now" for k in differ)
            raise InputError(f"this directory holds vectors of a different run ({details}); use a new output "
                             "directory or delete this one", path=str(manifest_path))
        kept, dropped = [], []
        for entry in old.get("shards", []):
            if _shard_intact(out_dir, entry) and _ids_match(entry, out_dir, view):
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


# ---------------------------------------------------------------------------------------------------- merging
def merge_shards(dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike | None = None,
                 verify: bool = True) -> dict:
    """Merge the part manifests of workers (one or several directories) into ``out_dir/manifest.json``.

    Checks that the parts agree (model, dim, dtype, corpus, shard size), that every shard of the corpus is present
    exactly once, that checksums hold (``verify``) and that no passage id appears twice. Shards in other
    directories are hard-linked (or copied) into ``out_dir``.

    Example::

        merge_shards(["vectors-0", "vectors-1"], "vectors")
    """
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise InputError("merge needs at least one directory")
    out = Path(out_dir) if out_dir is not None else dirs[0]
    parts: list[tuple[Path, dict]] = []
    for d in dirs:
        found = sorted(p for p in d.glob("manifest*.json") if _PART_RE.match(p.name) or p.name == MANIFEST)
        if not found:
            raise InputError("no encode manifests here", path=str(d))
        for path in found:
            parts.append((path, _read_manifest(path)))
    first_path, first = parts[0]
    for path, m in parts:
        for key in ("dim", "dtype", "model_fingerprint", "corpus_rows", "shard_size", "max_length", "pooling"):
            if m.get(key) != first.get(key):
                raise InputError(f"{key} differs from {first_path} ({m.get(key)!r} vs {first.get(key)!r})",
                                 path=str(path))
        if not m.get("complete"):
            raise InputError(f"incomplete: {m.get('count')} of {m['rows'][1] - m['rows'][0]} passages encoded; "
                             "rerun that worker to finish it", path=str(path))
    n_rows, shard_size = first["corpus_rows"], first["shard_size"]
    expected = math.ceil(n_rows / shard_size)
    owner: dict[int, tuple[Path, dict]] = {}
    for path, m in parts:
        for entry in m["shards"]:
            j = entry["index"]
            if j in owner and owner[j][0].parent / owner[j][1]["vectors"] != path.parent / entry["vectors"]:
                raise InputError(f"shard {j} was encoded twice ({owner[j][0]} and {path})", path=str(path))
            owner[j] = (path, entry)
    missing = sorted(set(range(expected)) - set(owner))
    if missing:
        raise InputError(f"shards {missing[:10]}{' ...' if len(missing) > 10 else ''} of {expected} are missing "
                         "(a worker did not run?)", path=str(dirs[0]))
    seen: set[str] = set()
    shards = []
    out.mkdir(parents=True, exist_ok=True)
    for j in range(expected):
        path, entry = owner[j]
        src_dir = path.parent
        want_start, want_count = j * shard_size, min(shard_size, n_rows - j * shard_size)
        if entry["row_start"] != want_start or entry["count"] != want_count:
            raise InputError(f"shard {j} covers rows {entry['row_start']}+{entry['count']}, expected "
                             f"{want_start}+{want_count}", path=str(path))
        if verify and not _shard_intact(src_dir, entry):
            raise InputError(f"shard {j} fails its checksum", path=str(src_dir / entry["vectors"]))
        ids = json.loads((src_dir / entry["ids"]).read_text(encoding="utf-8"))
        if len(ids) != entry["count"]:
            raise InputError(f"shard {j} lists {len(ids)} ids for {entry['count']} vectors", path=str(path))
        dup = next((i for i in ids if i in seen), None)
        if dup is not None:
            raise InputError(f"passage id {dup!r} was encoded more than once", path=str(src_dir / entry["ids"]))
        seen.update(ids)
        if src_dir.resolve() != out.resolve():
            for key in ("vectors", "ids"):
                _link_or_copy(src_dir / entry[key], out / entry[key])
        shards.append(entry)
    merged = {key: first.get(key) for key in _IDENTITY}
    merged.update({"worker": [0, 1], "rows": [0, n_rows], "count": n_rows, "complete": True,
                   "model": first.get("model"), "corpus": first.get("corpus"),
                   "empty_passages": sum(m.get("empty_passages", 0) for _, m in parts),
                   "truncated": sum(m.get("truncated", 0) for _, m in parts),
                   "merged_from": [str(p) for p, _ in parts], "shards": shards})
    write_json(out / MANIFEST, merged)
    return merged


def _link_or_copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


# ---------------------------------------------------------------------------------------------------- reading
@dataclass
class VectorShard:
    vectors: np.ndarray  # (count, dim), memory-mapped
    ids: list[str]
    row_start: int  # corpus row of the first vector: rows are row_start .. row_start + count - 1


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The complete manifest of an encode output directory (InputError when unfinished or unmerged)."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        parts = sorted(p.name for p in out_dir.glob("manifest.part-*.json"))
        if parts:
            raise InputError(f"only worker parts here ({', '.join(parts)}); merge them first: "
                             f"fastdpr encode --merge {out_dir}", path=str(out_dir))
    manifest = _read_manifest(path)
    if not manifest.get("complete"):
        total = manifest["rows"][1] - manifest["rows"][0]
        raise InputError(f"incomplete encoding ({manifest.get('count')} of {total} passages); rerun the same "
                         "fastdpr encode command to resume", path=str(path))
    return manifest


def iter_vector_shards(out_dir: str | os.PathLike, verify: bool = False) -> Iterator[VectorShard]:
    """Stream the shards in corpus-row order (memory-mapped), e.g. to add them to an index one by one.

    Example::

        for shard in iter_vector_shards("vectors/"):
            index.add(shard.vectors.astype("float32"), ids=np.arange(shard.row_start, shard.row_start + len(shard.ids)))
    """
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    for entry in manifest["shards"]:
        if verify and not _shard_intact(out_dir, entry):
            raise InputError("shard fails its checksum", path=str(out_dir / entry["vectors"]))
        try:
            vectors = np.load(out_dir / entry["vectors"], mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read shard ({err})", path=str(out_dir / entry["vectors"])) from None
        ids = json.loads((out_dir / entry["ids"]).read_text(encoding="utf-8"))
        if vectors.shape != (entry["count"], manifest["dim"]) or len(ids) != entry["count"]:
            raise InputError(f"shard has shape {vectors.shape} and {len(ids)} ids; the manifest says "
                             f"({entry['count']}, {manifest['dim']})", path=str(out_dir / entry["vectors"]))
        yield VectorShard(vectors, ids, entry["row_start"])


def load_vectors(out_dir: str | os.PathLike, verify: bool = False) -> tuple[np.ndarray, list[str]]:
    """All vectors (n, dim) in corpus-row order and their passage ids. A single shard is returned memory-mapped;
    several are concatenated (in the stored dtype).

    Example::

        vectors, ids = load_vectors("vectors/")
    """
    manifest = read_manifest(out_dir)
    shards = list(iter_vector_shards(out_dir, verify=verify))
    ids = [pid for s in shards for pid in s.ids]
    if len(shards) == 1:
        return shards[0].vectors, ids
    if not shards:
        return np.zeros((0, manifest["dim"]), dtype=manifest["dtype"]), ids
    return np.concatenate([s.vectors for s in shards]), ids


__all__ = ["encode_corpus", "load_vectors", "iter_vector_shards", "merge_shards", "read_manifest", "VectorShard",
           "parse_shard_spec", "worker_shards"]
