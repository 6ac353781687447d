"""Merging the part manifests of several workers into one checked ``manifest.json``."""
from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from fastdpr.atomic import write_json
from fastdpr.data.vectors import MANIFEST, PART_MANIFEST_RE, read_manifest_file, shard_intact
from fastdpr.encode.layout import _IDENTITY
from fastdpr.errors import InputError


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
        found = sorted(p for p in d.glob("manifest*.json") if PART_MANIFEST_RE.match(p.name) or p.name == MANIFEST)
        if not found:
            raise InputError("no encode manifests here", path=str(d))
        for path in found:
            parts.append((path, read_manifest_file(path)))
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
        if verify and not shard_intact(src_dir, entry):
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
