"""Reading an encode output directory: manifests, checksums and the vector shards (memory-mapped)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdpr.encode.layout import FORMAT, MANIFEST, VERSION
from fastdpr.errors import InputError


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
