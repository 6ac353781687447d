"""The files of encoded passage vectors (what ``fastdpr encode`` writes and ``fastdpr index`` reads): names, the
manifest and its checks, writing and reading the shards. Needs numpy only, never torch: a program that only indexes or searches
vectors encoded elsewhere imports this module, not ``fastdpr.encode``.

Layout of a vectors directory::

    manifest.json                 one worker (or the merge of several): the shards in row order
    manifest.part-I-of-N.json     worker I of N, until merged
    shard-00000.npy               float16/float32 (rows, dim), rows [0, S) of the corpus
    shard-00000.ids.json          the passage ids of those rows

The manifest records ``format``, ``version``, ``dim``, ``dtype``, ``model_fingerprint`` (the passage tower's hash,
``fastdpr.encode.model_fingerprint``), the corpus rows covered, and each shard's file names, rows and checksums.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdpr.atomic import atomic_open
from fastdpr.errors import InputError

FORMAT = "fastdpr-vectors"
VERSION = 1
MANIFEST = "manifest.json"
DTYPES = ("float16", "float32")
PART_MANIFEST_RE = re.compile(r"^manifest\.part-(\d+)-of-(\d+)\.json$")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def part_manifest_name(worker: int, workers: int) -> str:
    return MANIFEST if workers == 1 else f"manifest.part-{worker}-of-{workers}.json"


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _write_bytes(path: Path, data: bytes) -> str:
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return hashlib.sha256(data).hexdigest()


def write_shard(out_dir: Path, index: int, row_start: int, vectors: np.ndarray, ids: list[str]) -> dict:
    """Shard ``index`` of the corpus (rows ``row_start ..``): its vectors then its ids, each atomically; returns
    its manifest entry, which the caller records afterwards (only then does the shard count)."""
    name = shard_name(index)
    vec_sha = _write_bytes(out_dir / f"{name}.npy", _npy_bytes(vectors))
    ids_sha = _write_bytes(out_dir / f"{name}.ids.json", json.dumps(ids, ensure_ascii=False).encode("utf-8"))
    return {"index": index, "vectors": f"{name}.npy", "ids": f"{name}.ids.json", "row_start": row_start,
            "count": len(ids), "sha256": vec_sha, "ids_sha256": ids_sha}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def shard_intact(out_dir: Path, entry: dict) -> bool:
    try:
        return (sha256_file(out_dir / entry["vectors"]) == entry["sha256"]
                and sha256_file(out_dir / entry["ids"]) == entry["ids_sha256"])
    except (OSError, KeyError, TypeError):
        return False


def read_manifest_file(path: Path) -> dict:
    """A manifest file (complete or not, merged or a worker's part), its format and version checked."""
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


@dataclass
class VectorShard:
    vectors: np.ndarray  # (count, dim), memory-mapped
    ids: list[str]
    row_start: int  # corpus row of the first vector: rows are row_start .. row_start + count - 1


def recorded_manifest(out_dir: str | os.PathLike) -> dict | None:
    """The ``manifest.json`` of ``out_dir`` as written so far (an encoding still running or interrupted included:
    what model, corpus and settings its vectors come from), or None when there is none."""
    path = Path(out_dir) / MANIFEST
    return read_manifest_file(path) if path.is_file() else None


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The complete manifest of an encode output directory (InputError when unfinished or unmerged)."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        parts = sorted(p.name for p in out_dir.glob("manifest.part-*.json"))
        if parts:
            raise InputError(f"only worker parts here ({', '.join(parts)}); merge them first: "
                             f"fastdpr encode --merge {out_dir}", path=str(out_dir))
    manifest = read_manifest_file(path)
    _check_manifest(manifest, path)
    if not manifest.get("complete"):
        total = manifest["rows"][1] - manifest["rows"][0]
        raise InputError(f"incomplete encoding ({manifest.get('count')} of {total} passages); rerun the same "
                         "fastdpr encode command to resume", path=str(path))
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_manifest(manifest: dict, path: Path) -> None:
    """Every field a reader relies on, checked before any is used: a damaged or hand-edited manifest is an
    InputError naming the field, never a KeyError, a read outside the directory or vectors of the wrong rows."""
    def bad(what: str):
        raise InputError(f"damaged manifest: {what}", path=str(path))

    dim, rows, shards = manifest.get("dim"), manifest.get("rows"), manifest.get("shards")
    if not _is_count(dim) or dim < 1:
        bad(f"'dim' must be a positive integer, got {dim!r}")
    if manifest.get("dtype") not in DTYPES:
        bad(f"'dtype' must be one of {', '.join(DTYPES)}, got {manifest.get('dtype')!r}")
    if not (isinstance(rows, list) and len(rows) == 2 and all(map(_is_count, rows)) and rows[0] <= rows[1]):
        bad(f"'rows' must be [first, end) corpus rows, got {rows!r}")
    if not _is_count(manifest.get("count")):
        bad(f"'count' must be an integer >= 0, got {manifest.get('count')!r}")
    if not isinstance(shards, list):
        bad("'shards' must be a list")
    row = rows[0]
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict):
            bad(f"shard entry {i} is not an object")
        for key in ("vectors", "ids"):
            name = entry.get(key)
            # a file of this directory, by name: never a path leading elsewhere
            if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
                bad(f"shard entry {i}: {key!r} must be a file name in this directory, got {name!r}")
        if not _is_count(entry.get("count")) or entry.get("row_start") != row:
            bad(f"shard entry {i} covers rows {entry.get('row_start')!r}+{entry.get('count')!r}; the shards before "
                f"it end at row {row}")
        row += entry["count"]
    if manifest.get("complete") and (row != rows[1] or manifest["count"] != rows[1] - rows[0]):
        bad(f"the shards cover rows [{rows[0]}, {row}) and count {manifest['count']}, but the encoding is of "
            f"rows [{rows[0]}, {rows[1]})")


def iter_vector_shards(out_dir: str | os.PathLike, verify: bool = True) -> Iterator[VectorShard]:
    """Stream the shards in corpus-row order (memory-mapped), e.g. to add them to an index one by one. Each shard's
    checksums are checked first (``verify=False`` skips that for speed on trusted files).

    Example::

        for shard in iter_vector_shards("vectors/"):
            index.add(shard.vectors.astype("float32"), ids=np.arange(shard.row_start, shard.row_start + len(shard.ids)))
    """
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    for entry in manifest["shards"]:
        if verify and not shard_intact(out_dir, entry):
            raise InputError("shard fails its checksum", path=str(out_dir / entry["vectors"]))
        try:
            vectors = np.load(out_dir / entry["vectors"], mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read shard ({err})", path=str(out_dir / entry["vectors"])) from None
        if vectors.dtype != np.dtype(manifest["dtype"]):
            raise InputError(f"shard holds {vectors.dtype} vectors; the manifest says {manifest['dtype']}",
                             path=str(out_dir / entry["vectors"]))
        try:
            ids = json.loads((out_dir / entry["ids"]).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # missing, not UTF-8, not JSON
            raise InputError(f"cannot read the shard's ids ({err})", path=str(out_dir / entry["ids"])) from None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise InputError("the shard's ids must be a JSON list of strings", path=str(out_dir / entry["ids"]))
        if vectors.shape != (entry["count"], manifest["dim"]) or len(ids) != entry["count"]:
            raise InputError(f"shard has shape {vectors.shape} and {len(ids)} ids; the manifest says "
                             f"({entry['count']}, {manifest['dim']})", path=str(out_dir / entry["vectors"]))
        yield VectorShard(vectors, ids, entry["row_start"])


def load_vectors(out_dir: str | os.PathLike, verify: bool = True) -> tuple[np.ndarray, list[str]]:
    """All vectors (n, dim) in corpus-row order and their passage ids. A single shard is returned memory-mapped;
    several are concatenated (in the stored dtype). Checksums are checked unless ``verify=False``.

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
